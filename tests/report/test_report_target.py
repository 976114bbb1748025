"""The report's --target table (time to target): mean time to target over the seeds that reached it, the acceptance
test on the final metric (a one-sided one-sample t-test, against scipy's) and the Welch test of the time against a
baseline. The runs that train to a target: tests/training/test_budget.py."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from speedrun import stats


def test_one_sample_test_below():
    assert stats.ttest_below([1.0], 2.0) is None  # one value: no spread, no test
    below = stats.ttest_below([3.20, 3.21, 3.19, 3.22], 3.28)
    assert below is not None and below.p < 0.01 and below.delta == pytest.approx(3.205 - 3.28)
    near = stats.ttest_below([3.27, 3.29, 3.275], 3.28)
    assert near is not None and 0.01 < near.p < 0.9
    assert stats.ttest_below([3.3, 3.3], 3.28).p == 1.0  # constant and above: no evidence


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
