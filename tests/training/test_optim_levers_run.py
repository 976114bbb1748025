"""The record's optimizer and schedule levers in a run (muon_wd, MuonEq-R, Polar Express, adam_wd/embed_wd,
schedule.min_lr, the weight EMA): composed and resolved into the Plan and its result keys, refused by name; the EMA
updated after each timed step only, evaluated at the end of a whole run, and carried by its checkpoints. Each
lever against its reference formula: tests/model/test_optim_levers.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from speedrun.config import to_config
from speedrun.core.attention import get_backend
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from speedrun.records.keys import optim_keys
from support.devices import fake_device

# -- config, plan, result keys -----------------------------------------------------------------------------------

LEVERS = [
    "optim.muon_wd=0.095",
    "optim.muon_row_normalize=true",
    "optim.ns_coefficients=polar_express",
    "optim.adam_wd=0.02",
    "optim.embed_wd=0.085",
    "schedule.min_lr=0.1",
    "ema.decay=0.9965",
]


def test_levers_compose_resolve_into_the_plan_and_its_result_keys(compose):
    base = compose([])
    for key in ("muon_wd", "muon_row_normalize", "ns_coefficients", "adam_wd", "embed_wd"):
        assert key in base.optim  # shown by `python -m run --cfg job`
    assert "min_lr" in base.schedule and base.ema.decay is None
    off = resolve(to_config(base), fake_device("cpu"))
    assert optim_keys(off.optim, off.schedule, off.ema) == {
        "muon_wd": 0.0,
        "muon_row_normalize": False,
        "ns_coefficients": "quintic",
        "adam_wd": 0.0,
        "embed_wd": 0.0,
        "min_lr": 0.0,
        "ema_decay": None,
        "ema_horizon": None,
        "muon_momentum_warmup_steps": 500,
        "muon_momentum_warmup_frac": None,
    }
    assert "levers" not in off.describe()
    plan = resolve(to_config(compose(LEVERS)), fake_device("cpu"))
    assert optim_keys(plan.optim, plan.schedule, plan.ema) == {
        "muon_wd": 0.095,
        "muon_row_normalize": True,
        "ns_coefficients": "polar_express",
        "adam_wd": 0.02,
        "embed_wd": 0.085,
        "min_lr": 0.1,
        "ema_decay": 0.9965,
        "ema_horizon": None,
        "muon_momentum_warmup_steps": 500,
        "muon_momentum_warmup_frac": None,
    }
    d = plan.to_dict()
    assert d["optim"]["ns_coefficients"] == "polar_express" and d["ema"] == {"decay": 0.9965, "horizon": None}
    assert d["schedule"]["min_lr"] == 0.1
    assert "polar_express" in plan.describe() and "EMA 0.9965" in plan.describe()
    assert resolve(to_config(compose(["ema.decay=0"])), fake_device("cpu")).ema.decay is None


@pytest.mark.parametrize(
    "override,needle",
    [
        ("optim.muon_wd=-0.1", "optim.muon_wd=-0.1 must be >= 0"),
        ("optim.adam_wd=-1", "optim.adam_wd=-1.0 must be >= 0"),
        ("optim.embed_wd=2", "optim.embed_wd=2.0 times optim.embed_lr=0.6 must be < 1"),
        ("optim.muon_wd=30", "optim.muon_wd=30.0 times optim.matrix_lr"),
        ("schedule.min_lr=1.5", "schedule.min_lr=1.5 must be in \\[0, 1\\]"),
        ("schedule.warmdown_frac=0", None),  # alone: fine
        ("ema.decay=1", "ema.decay=1.0 must be in \\[0, 1\\)"),
        ("ema.decay=-0.5", "ema.decay=-0.5 must be in"),
    ],
)
def test_bad_lever_values_are_refused_naming_the_key(compose, override, needle):
    if needle is None:
        to_config(compose([override]))
        with pytest.raises(ConfigError, match="schedule.min_lr=0.1 is the floor of the warm-down"):
            to_config(compose([override, "schedule.min_lr=0.1"]))
        return
    with pytest.raises(ConfigError, match=needle):
        to_config(compose([override]))


# -- training with the EMA ---------------------------------------------------------------------------------------


def test_a_smoke_run_with_every_lever_evaluates_the_ema_and_records_it(compose, tmp_path, data_cache, monkeypatch):
    """debug=smoke with the whole record stack: the run ends ok, result.json and plan.json carry the levers, and
    the final evaluation scores the EMA's weights (checked as it starts), which are not the live ones."""
    from speedrun.core import optim
    from speedrun.run import job
    from speedrun.run.job_record import RunContext
    from speedrun.run.runner import run_job

    emas, seen = [], {}
    made = optim.WeightEMA.__init__

    def keep(self, model, decay):
        made(self, model, decay)
        emas.append(self)

    original = job.evaluate_and_export

    def check(plan, model, *args, **kwargs):
        (ema,) = emas
        seen["same"] = all(torch.equal(p, s.to(p.dtype)) for p, s in zip(model.parameters(), ema.shadow))
        return original(plan, model, *args, **kwargs)

    live = {}
    copy_to = optim.WeightEMA.copy_to

    def remember(self):
        live["params"] = [p.detach().clone() for p in self.params]
        copy_to(self)

    monkeypatch.setattr(optim.WeightEMA, "__init__", keep)
    monkeypatch.setattr(optim.WeightEMA, "copy_to", remember)
    monkeypatch.setattr(job, "evaluate_and_export", check)
    overrides = [
        "debug=smoke",
        "budget.max_steps=6",
        "budget.tokens_per_step=1024",
        "eval.tokens=2048",
        "quant=off",
        f"data.cache_dir={data_cache}",
        f"results_db={tmp_path / 'r.sqlite'}",
        *LEVERS[:-1],
        "ema.decay=0.5",  # a short average, so six steps move it well away from the initial weights
    ]
    result = run_job(compose(overrides), RunContext(tmp_path / "run", overrides, None, tmp_path))
    assert result["status"] == "ok", result.get("error")
    assert seen["same"]
    assert any(not torch.equal(a, s) for a, s in zip(live["params"], emas[0].shadow))
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["ema_decay"] == 0.5 and saved["ns_coefficients"] == "polar_express" and saved["min_lr"] == 0.1
    assert saved["ema_init_share"] == 0.5**6  # the initial weights' part of the average after 6 steps
    plan = json.loads(Path(tmp_path / "run" / "plan.json").read_text())
    assert plan["ema"]["decay"] == 0.5 and plan["optim"]["muon_wd"] == 0.095


def test_train_updates_the_ema_after_each_timed_step_only(compose):
    """Warm-up's steps are undone and never reach the average; the timed steps do, one update each; the
    model ends holding the average."""
    from speedrun.core.train import Stepper, TrainState, train, warm_up
    from speedrun.run.build import build_model

    plan = resolve(
        to_config(compose(["debug=smoke", "budget.max_steps=3", "budget.tokens_per_step=512", "ema.decay=0.8"])),
        fake_device("cpu"),
    )
    torch.manual_seed(0)
    model, forward, _, optimizers = build_model(plan, get_backend("sdpa", kernel="math"), bos_id=1)
    initial = [p.detach().clone() for p in model.parameters()]
    stepper = Stepper(model, forward, optimizers, plan)
    ref = copy.deepcopy(stepper.ema.shadow)
    g = torch.Generator().manual_seed(0)

    class Batches:  # random tokens; what train() asks of a stream
        def __init__(self, seq_len, micro_batch, position=0):
            self.shape, self.position = (micro_batch, seq_len), position

        def __next__(self):
            self.position += self.shape[0] * self.shape[1]
            x = torch.randint(0, plan.model.vocab_size, self.shape, generator=g)
            return x, torch.roll(x, -1, 1)

        def state_dict(self):
            return {"position": self.position}

    make_batches = Batches

    updates = []
    update = stepper.ema.update

    def counted():
        update()
        updates.append([p.detach().clone() for p in model.parameters()])

    stepper.ema.update = counted
    warm_up(stepper, make_batches, TrainState(), lambda _: None)
    assert not updates and all(torch.equal(a, b) for a, b in zip(stepper.ema.shadow, ref))
    state = train(stepper, make_batches, state=TrainState(), log=lambda _: None, on_metrics=lambda _: None)
    assert state.steps == 3 and len(updates) == 3
    # 0.8^3 = 51% of the average is still the initial weights: run_steps warns so before training
    # (tests/plan/test_plan_step_warnings.py)
    for j, p in enumerate(model.parameters()):
        expected = 0.8**3 * initial[j] + sum(0.2 * 0.8 ** (3 - i) * updates[i - 1][j] for i in (1, 2, 3))
        torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=1e-5)


def test_a_resumed_run_with_an_ema_ends_where_an_uninterrupted_one_does(compose, tmp_path, data_cache, monkeypatch):
    """Checkpoints carry the EMA: a run resumed from its step-3 checkpoint scores (on the average) exactly what the
    uninterrupted run scores; dropping the EMA from the restore would not."""
    from speedrun.run import checkpoint
    from speedrun.run.job_record import RunContext
    from speedrun.run.runner import run_job

    common = [
        "debug=smoke",
        "budget.max_steps=6",
        "budget.tokens_per_step=1024",
        "eval.tokens=2048",
        "quant=off",
        "checkpoint.every_steps=3",
        "ema.decay=0.5",
        f"data.cache_dir={data_cache}",
        f"results_db={tmp_path / 'r.sqlite'}",
    ]

    def run(name, overrides):
        return run_job(compose(overrides), RunContext(tmp_path / name, overrides, None, tmp_path))

    full = run("full", common)
    run("twin", common)
    for path in checkpoint.list_checkpoints(tmp_path / "twin")[1:]:  # keep step 3 only
        path.with_suffix(".json").unlink()
        path.unlink()
    assert torch.load(checkpoint.list_checkpoints(tmp_path / "twin")[0], weights_only=True)["ema"] is not None

    def stopped_at_step_3() -> None:  # a finished run is never resumed: the twin's record says it was interrupted
        from speedrun.records.store import ResultsDB

        result = json.loads((tmp_path / "twin" / "result.json").read_text())
        (tmp_path / "twin" / "result.json").write_text(json.dumps({**result, "status": "interrupted"}))
        for db in (tmp_path / "r.sqlite", tmp_path / "outputs" / "results.sqlite"):  # its row, where a run wrote one
            if db.exists():
                ResultsDB(db).upsert(str((tmp_path / "twin").resolve()), {"status": "interrupted"})

    stopped_at_step_3()
    resumed = run("again", [f"resume={tmp_path / 'twin'}"])
    assert resumed["status"] == "ok" and resumed["steps"] == 6 and resumed["val_loss"] == full["val_loss"]
    assert resumed["ema_decay"] == 0.5
    # the same resume with the EMA left out of the restore ends elsewhere: the check above can fail
    for path in checkpoint.list_checkpoints(tmp_path / "twin")[1:]:
        path.with_suffix(".json").unlink()
        path.unlink()
    original = checkpoint.restore
    monkeypatch.setattr("speedrun.run.loop_setup.restore", lambda *a, ema=None, **k: original(*a, ema=None, **k))
    stopped_at_step_3()
    broken = run("broken", [f"resume={tmp_path / 'twin'}"])
    assert broken["steps"] == 6 and broken["val_loss"] != full["val_loss"]
