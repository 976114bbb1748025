"""Time to target (budget.target_val_loss / target_val_bpb): a run stops at the first periodic evaluation at or
below its target and records when it got there; one that never gets there ends ok at its budget; the refusals;
the report's --target table (mean time to target over the seeds that reached it, the acceptance test on the final
metric, the Welch test of the time against a baseline)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from speedrun import stats
from speedrun.config import to_config
from speedrun.errors import ConfigError

# A tiny CPU run: 12 steps at most, a periodic evaluation every 3 (the first at step 3)
RUN = [
    "debug=smoke",
    "budget.max_steps=12",
    "budget.train_seconds=600",
    "budget.tokens_per_step=1024",
    "eval.tokens=2048",
    "eval.periodic_tokens=1024",
    "quant=off",
    "eval.every_steps=3",
]
TARGET_KEYS = ("time_to_target", "steps_to_target", "tokens_to_target")


def run(compose, tmp_path: Path, data_cache: Path, name: str, *overrides: str) -> dict:
    from speedrun.run.runner import RunContext, run_job

    args = [*RUN, f"data.cache_dir={data_cache}", f"results_db={tmp_path / 'r.sqlite'}", *overrides]
    return run_job(compose(args), RunContext(tmp_path / name, args, None, tmp_path))


def val_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "val"]


def test_a_reached_target_stops_training_at_that_evaluation(compose, tmp_path, data_cache):
    # any model scores under 100 bits per byte: the first periodic evaluation (step 3) reaches it
    result = run(compose, tmp_path, data_cache, "reach", "budget.target_val_bpb=100")
    assert result["status"] == "ok" and result["reached"] is True and result["budget_end"] == "target"
    assert (result["target_metric"], result["target_value"]) == ("val_bpb", 100.0)
    assert result["steps"] == result["steps_to_target"] == 3 < 12
    assert result["tokens_to_target"] == 3 * 1024 == result["tokens"]
    # the time is the loop's train seconds at that evaluation: the evaluation itself is not in it
    assert 0 < result["time_to_target"] <= result["train_seconds"]
    vals = val_records(tmp_path / "reach")
    assert [v["step"] for v in vals] == [3] and vals[0]["val_bpb"] <= 100  # stopped there, not evaluated again
    assert result["time_to_target"] == pytest.approx(vals[0]["elapsed_s"], abs=1e-3)  # the train clock there
    assert math.isfinite(result["val_bpb"])  # the final full evaluation ran as always
    saved = json.loads((tmp_path / "reach" / "result.json").read_text())
    assert {k: saved[k] for k in ("reached", *TARGET_KEYS)} == {k: result[k] for k in ("reached", *TARGET_KEYS)}


def test_an_unreachable_target_ends_ok_at_the_budget(compose, tmp_path, data_cache):
    result = run(compose, tmp_path, data_cache, "miss", "budget.target_val_loss=0.001")
    assert result["status"] == "ok" and result["reached"] is False and result["budget_end"] == "steps"
    assert result["steps"] == 12 and all(result[k] is None for k in TARGET_KEYS)
    assert (result["target_metric"], result["target_value"]) == ("val_loss", 0.001)
    assert [v["step"] for v in val_records(tmp_path / "miss")] == [3, 6, 9, 12]


def test_no_target_keys_without_a_target(compose, tmp_path):
    from conftest import fake_device
    from speedrun.plan import resolve
    from speedrun.training.loop import TrainState
    from speedrun.training.loop_setup import target_keys

    plan = resolve(to_config(compose(["debug=smoke"])), fake_device("cpu"))
    assert plan.target_metric is None and target_keys(plan, TrainState()) == {}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["budget.target_val_loss=3.28", "budget.target_val_bpb=1.1"], "both set.*drop one"),
        (["budget.target_val_loss=3.28"], "add eval.every_steps=N or eval.every_seconds=S"),
        (["budget.target_val_bpb=0", "eval.every_steps=10"], "finite number > 0"),
    ],
)
def test_refusals_name_the_fix(compose, overrides, match):
    with pytest.raises(ConfigError, match=match):
        to_config(compose(overrides))


def test_a_target_with_periodic_evaluation_resolves(compose):
    from conftest import fake_device
    from speedrun.plan import resolve

    cfg = to_config(compose(["budget.target_val_loss=3.28", "eval.every_seconds=30"]))
    assert cfg.budget.target == ("val_loss", 3.28)
    plan = resolve(cfg, fake_device("cpu"))
    assert (plan.target_metric, plan.target_value) == ("val_loss", 3.28)
    assert "until periodic val_loss <= 3.28" in plan.describe()


def test_one_sample_test_below():
    assert stats.ttest_below([1.0], 2.0) is None  # one value: no spread, no test
    below = stats.ttest_below([3.20, 3.21, 3.19, 3.22], 3.28)
    assert below is not None and below.p < 0.01 and below.delta == pytest.approx(3.205 - 3.28)
    near = stats.ttest_below([3.27, 3.29, 3.275], 3.28)
    assert near is not None and 0.01 < near.p < 0.9
    assert stats.ttest_below([3.3, 3.3], 3.28).p == 1.0  # constant and above: no evidence


# ---------------------------------------------------------------------------------------------------------
# the report

# attn -> per seed (reached, time_to_target, final val_loss): sdpa reaches it on every seed and is accepted; flex is
# faster where it reaches it but misses it once and its final loss straddles 3.28; math never reaches it
SEEDS = {
    "sdpa": [(True, 10.0, 3.20), (True, 11.0, 3.21), (True, 12.0, 3.22)],
    "flex": [(True, 8.0, 3.27), (True, 8.5, 3.28), (False, None, 3.30)],
    "math": [(False, None, 3.40), (False, None, 3.41), (False, None, 3.42)],
}


def target_db(root: Path) -> Path:
    from speedrun.records.store import ResultsDB

    db = ResultsDB(root / "results.sqlite")
    n = 0

    def add(attn: str, seed: int, row: dict) -> None:
        nonlocal n
        n += 1
        run_dir = root / "runs" / f"{attn}-{seed}-{n}"
        run_dir.mkdir(parents=True)
        base = {"status": "ok", "name": "t", "sweep": "s1", "hardware": "h100", "attn": attn, "seed": seed}
        db.upsert(str(run_dir), {**base, "run_dir": str(run_dir), "started_at": 1000.0 + n, **row})

    for attn, seeds in SEEDS.items():
        for seed, (reached, seconds, loss) in enumerate(seeds):
            add(
                attn,
                seed,
                {
                    "val_loss": loss,
                    "target_metric": "val_loss",
                    "target_value": 3.28,
                    "reached": reached,
                    "time_to_target": seconds,
                    "steps_to_target": int(seconds * 100) if reached else None,
                    "budget_end": "target" if reached else "time",
                },
            )
    add("sdpa", 7, {"val_loss": 3.1})  # trained without a target: counted as left out, never averaged
    return db.path


def test_report_ranks_by_time_to_target_with_the_acceptance_test(tmp_path, capsys):
    from speedrun import report
    from speedrun.report.target import parse_target

    db = target_db(tmp_path)
    args = ["--db", str(db), "--group-by", "attn", "--no-plots", "--out", str(tmp_path / "r")]
    assert report.main([*args, "--target", "val_loss=3.28", "--baseline", "attn=sdpa"]) == 0
    out = capsys.readouterr().out
    section = out.split("time to target (val_loss <= 3.28):", 1)[1]
    assert "p < 0.01 (modded-nanogpt's acceptance rule)" in section and "not averaged in" in section
    assert "1 selected run(s) trained without this target" in section
    lines = [ln for ln in section.splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[1:]]
    assert [r["attn"] for r in rows] == ["flex", "sdpa", "math"]  # by mean time of the seeds that reached it
    flex, sdpa, math_ = rows
    assert (flex["#"], flex["reached"], flex["time_to_target s"]) == ("1", "2/3", "8.25 ± 0.35")
    assert (sdpa["reached"], sdpa["time_to_target s"], sdpa["final val_loss"]) == (
        "3/3",
        "11.00 ± 1.00",
        "3.2100 ± 0.0100",
    )
    assert sdpa["accepted"] == "yes" and float(sdpa["p"]) < 0.01
    assert flex["accepted"] == "no" and float(flex["p"]) > 0.01  # final losses 3.27, 3.28, 3.30: not below
    assert (math_["#"], math_["reached"], math_["time_to_target s"]) == ("-", "0/3", "")  # shown, not dropped
    expected = stats.welch_less([8.0, 8.5], [10.0, 11.0, 12.0])
    assert sdpa["delta s vs baseline"] == "baseline" and flex["delta s vs baseline"] == "-2.75"
    assert float(flex["p (Welch)"]) == pytest.approx(expected.p, rel=1e-3) and expected.p < 0.05
    assert math_["p (Welch)"] == ""  # no seed reached it: nothing to compare
    with open(tmp_path / "r" / "target.csv") as f:
        assert [r["attn"] for r in csv.DictReader(f)] == ["flex", "sdpa", "math"]  # the same table, as CSV
    page = (tmp_path / "r" / "report.html").read_text()
    assert '<table id="target">' in page and "time to target (val_loss &lt;= 3.28)" in page  # and on the page

    assert report.main([*args, "--target", "val_bpb=1.0"]) == 0
    assert "no run in the selection trained with this target" in capsys.readouterr().out
    assert report.main([*args, "--target", "loss=3"]) == 2
    assert "--target val_loss=3.28" in capsys.readouterr().err
    assert parse_target("val_bpb=1.1") == ("val_bpb", 1.1)


def test_one_sample_test_matches_scipy():
    sps = pytest.importorskip("scipy.stats", reason="scipy is in the dev extra; the fallback is tested against it")
    for xs in ([3.27, 3.29, 3.275], [3.2, 3.25, 3.22, 3.3, 3.21]):
        ref = sps.ttest_1samp(xs, 3.28, alternative="less")
        below = stats.ttest_below(xs, 3.28)
        assert below is not None and math.isclose(below.t, ref.statistic, rel_tol=1e-9)
        assert math.isclose(below.p, ref.pvalue, rel_tol=1e-7)


def test_a_run_resumed_after_reaching_its_target_trains_no_further(compose, tmp_path, monkeypatch):
    # its last checkpoint (written when training finished) holds target_steps: the loop ends at once, on target
    from speedrun.training import loop
    from test_budget import plan_for, train_plan

    plan = plan_for(compose, "budget.max_steps=20", "budget.target_val_loss=3.28", "eval.every_steps=5")
    restored = loop.TrainState(steps=5, tokens=5 * 256, target_steps=5, target_tokens=5 * 256, target_seconds=1.0)
    monkeypatch.setattr(loop, "TrainState", lambda: restored)  # train_plan's fresh state: the restored one
    state, records = train_plan(plan, tmp_path)
    assert (state.steps, state.budget_end, records) == (5, "target", [])
