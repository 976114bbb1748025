"""track=<contest>: the rules as data (conf/track/), refused at compose where a run cannot comply, judged at the end
(track_ok with reasons). A CPU run under a track, its Hessians inside the training clock: tests/e2e/test_cli.py."""

from __future__ import annotations

import pytest

from speedrun.config import to_config
from speedrun.config.track import TrackConfig
from speedrun.errors import ConfigError, PlanError
from speedrun.export.track import NON_RECORD_NAME, RECORD_NAME, load_track
from speedrun.paths import CONF_DIR
from speedrun.plan import resolve
from speedrun.run.track_verdict import track_keys
from support.devices import fake_device

TRACKS = sorted(p.stem for p in (CONF_DIR / "track").glob("*.yaml"))


TRACK_DATA = {
    "pgolf_10min_16mb": "fineweb_sp8192",
    "pgolf_non_record_16mb": "fineweb_sp8192",
    "mng_124m": "fineweb10B_gpt2",
}
"""A data setting each track scores: composing one needs no shard (nothing is read before the run)."""


def with_data(overrides):
    """The overrides, plus the track's data where they name a track and no data (a track refuses data=embedded)."""
    tracks = [o.split("=", 1)[1] for o in overrides if o.startswith("track=")]
    if tracks and tracks[0] in TRACK_DATA and not any(o.startswith("data=") for o in overrides):
        return [*overrides, f"data={TRACK_DATA[tracks[0]]}"]
    return list(overrides)


def plan_for(compose, *overrides, device="cpu"):
    return resolve(to_config(compose(with_data(overrides))), fake_device(device))


@pytest.mark.parametrize("name", TRACKS)
def test_every_track_composes_and_names_its_sources(compose, name):
    track = to_config(compose(with_data([f"track={name}"]))).track
    assert isinstance(track, TrackConfig)
    if name == "none":
        assert track.name is None and not track.on
        return
    assert track.name == name and track.contest and track.sources  # docs/tracks.md cites each
    assert load_track(name) == track  # the export reads the same rules


def test_the_rules_of_parameter_golf_and_modded_nanogpt():
    pg, mng = load_track(RECORD_NAME), load_track("mng_124m")
    assert (pg.gpus, pg.card, pg.train_seconds, pg.eval_seconds, pg.artifact_cap_bytes) == (8, "H100", 600, 600, 16e6)
    assert pg.full_validation and pg.acceptance.margin == 0.005 and pg.acceptance.p_value == 0.01
    assert (mng.val_tokens, mng.acceptance.threshold, mng.data) == (10_485_760, 3.28, ["fineweb10B_gpt2"])
    assert load_track(NON_RECORD_NAME).train_seconds is None and load_track(NON_RECORD_NAME).artifact_cap_bytes == 16e6


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["eval.tokens=8192"], "eval.tokens=8192 scores a subset"),
        (["budget.train_seconds=900"], "budget.train_seconds=900: set budget.train_seconds<=600"),
        (["budget.train_seconds=0", "budget.max_steps=10"], "this run has no time limit"),
        (["ttt=record", "ttt.max_seconds=700"], "ttt.max_seconds=700 allows more"),
        (["quant=int6", "quant.reserve_seconds=0"], "quant.reserve_seconds=0 would leave GPTQ's Hessians"),
    ],
)
def test_a_run_that_cannot_comply_is_refused_at_compose(compose, overrides, says):
    with pytest.raises(PlanError, match=says.replace("(", r"\(").replace(")", r"\)")):
        plan_for(compose, "track=pgolf_10min_16mb", "budget.train_seconds=600", *overrides)


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["data=embedded"], "data=embedded is not one: set data=fineweb_sp1024"),
        (["quant=off"], "quant=off writes none: set quant=int6"),
        (["eval.max_seconds=30"], "eval.max_seconds=30 may stop one early: set eval.max_seconds=null"),
        (
            ["budget.target_val_bpb=1.1", "eval.every_steps=50"],
            "budget.target_val_bpb=1.1 stops training on a validation score, which the contest does not allow",
        ),
    ],
)
def test_what_the_config_already_breaks_is_refused_when_it_is_composed(compose, overrides, says):
    """Refused by the config itself (Config.__post_init__), before the resolver looks at a device."""
    with pytest.raises(ConfigError, match=says):
        to_config(compose(with_data(["track=pgolf_10min_16mb", "quant=int6", *overrides])))
    # without the track the same settings compose
    to_config(compose(["quant=int6", *overrides]))


def test_mng_may_stop_at_its_target_and_a_track_turns_ttts_base_scoring_off(compose):
    """modded-nanogpt's metric is the time to a target; TTT's scoring of the unadapted model is a diagnostic that
    would spend parameter-golf's evaluation time."""
    cfg = to_config(compose(with_data(["track=mng_124m", "budget.target_val_loss=3.28", "eval.every_steps=50"])))
    assert cfg.budget.target == ("val_loss", 3.28)
    assert to_config(compose(["ttt=record"])).ttt.score_base is True
    assert to_config(compose(with_data(["track=pgolf_10min_16mb", "ttt=record", "quant=int6"]))).ttt.score_base is False


def test_mng_needs_its_validation_targets(compose):
    with pytest.raises(PlanError, match="set eval.tokens=10485761"):
        plan_for(compose, "track=mng_124m")
    plan = plan_for(compose, "track=mng_124m", "eval.tokens=10485761")
    assert plan.track.name == "mng_124m" and "mng_124m (modded-nanogpt)" in plan.describe()


def test_a_one_gpu_run_is_judged_and_projected_onto_eight(compose):
    plan = plan_for(compose, "track=pgolf_10min_16mb", "budget.train_seconds=600", "quant=int6", device="h100")
    result = {
        "status": "ok",
        "world_size": 1,
        "hardware": "h100",
        "device_name": plan.device_name,
        "data": "fineweb_sp8192",
        "eval_whole_split": True,
        "train_seconds": 598.0,
        "eval_seconds": 1210.0,
        "artifact_bytes": 15_900_000,
    }
    keys = track_keys(plan, result)
    assert keys["track_ok"] is False
    assert keys["track_problems"] == [
        "ran on 1 GPU, not 8 GPUs",
        "evaluated in 1210.0 s (compile included), over 600 s",
    ]
    # the same card, an eighth of the GPUs: an eighth of the time, and said to be a projection
    assert (keys["track_projected_train_seconds"], keys["track_projected_eval_seconds"]) == (74.8, 151.2)
    assert "projection, not a measurement" in keys["track_projection"]
    eight = {**result, "world_size": 8, "gpu_names": [plan.device_name] * 8, "eval_seconds": 400.0}
    assert track_keys(plan, eight) == {"track": RECORD_NAME, "track_ok": True, "track_problems": None}


def test_an_h100_of_another_form_factor_is_not_the_contests(compose):
    """The track's card is the card table's H100 SXM: an H100 PCIe's name contains "H100" all the same."""
    plan = plan_for(compose, "track=pgolf_10min_16mb", "budget.train_seconds=600", device="h100")
    pcie = "NVIDIA H100 PCIe"
    result = {"status": "ok", "world_size": 8, "hardware": "h100", "device_name": pcie, "gpu_names": [pcie] * 8}
    result |= {"data": "fineweb_sp8192", "eval_whole_split": True, "train_seconds": 590.0, "eval_seconds": 500.0}
    result |= {"artifact_bytes": 15_000_000}
    assert track_keys(plan, result)["track_problems"] == [f"ran on {pcie} (H100 PCIe), not H100 SXM"]
    sxm = [plan.device_name] * 8
    assert track_keys(plan, {**result, "device_name": plan.device_name, "gpu_names": sxm})["track_ok"] is True


def test_a_record_missing_its_counts_is_judged_not_crashed():
    says = load_track(RECORD_NAME).problems({"status": "ok", "eval_whole_split": False})
    assert "it scored the first ? validation tokens (eval.tokens), not the whole split" in says


def test_a_measured_reserve_as_large_as_the_budget_is_refused_before_training(compose, monkeypatch):
    import types

    import speedrun.run.job as job
    from speedrun.core.dist import SINGLE

    plan = plan_for(compose, "quant=int6", "budget.train_seconds=5")
    assert plan.budget.measures_reserve
    monkeypatch.setattr(job, "measure_reserve", lambda *args: 7.5)
    with pytest.raises(PlanError, match="would take 7.5 s here .* the whole budget.train_seconds=5"):
        job.Job._hessian_reserve(types.SimpleNamespace(record=types.SimpleNamespace(world=SINGLE)), plan, None, None)
    monkeypatch.setattr(job, "measure_reserve", lambda *args: 1.5)
    assert (
        job.Job._hessian_reserve(types.SimpleNamespace(record=types.SimpleNamespace(world=SINGLE)), plan, None, None)
        == 1.5
    )
