"""The report: statistics, grouping, baselines, filters, plots and an HTML page checked in a real browser.

These tests build a synthetic results.sqlite (the real sweep's database is reported on in test_sweep.py).
"""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

import pytest

from speedrun import report, stats
from speedrun.records.store import ResultsDB
from support.browser import check_in_browser

MEANS = {"sdpa": 1.300, "flex": 1.280, "math": 1.302}


def make_db(root: Path) -> Path:
    """3 attention backends x 4 seeds on h100 (sweep s1), one failed flex run, 2 a100 runs in sweep s2."""
    path = root / "results.sqlite"
    db = ResultsDB(path)
    rng = random.Random(0)
    t = 1000.0

    def add(attn: str, seed: int, sweep: str, hardware: str, status: str = "ok", lr: float = 0.04) -> None:
        nonlocal t
        t += 1
        run_dir = root / "runs" / f"{sweep}-{attn}-{seed}-{status}"
        run_dir.mkdir(parents=True)
        val = MEANS[attn] + rng.gauss(0, 0.004) if status == "ok" else None
        with open(run_dir / "metrics.jsonl", "w") as f:
            for step in range(1, 6):
                f.write(json.dumps({"step": step, "tokens": step * 1000, "train_loss": 5.0 / step}) + "\n")
        config = {
            "name": "t",
            "seed": seed,
            "attn": {"name": attn},
            "optim": {"matrix_lr": lr},
            "quant": {"cap_bytes": 16_000_000},
        }
        db.upsert(
            str(run_dir),
            {
                "status": status,
                "error": "RuntimeError: boom" if status != "ok" else None,
                "name": "t",
                "sweep": sweep,
                "hardware": hardware,
                "attn": attn,
                "seed": seed,
                "val_bpb": val,
                "val_bpb_quant": val + 0.01 if val else None,
                "tokens_per_s": {"sdpa": 9e5, "flex": 8e5, "math": 3e5}[attn],
                "mfu": 0.4,
                "peak_mem_mb": 1000.0,
                "artifact_bytes": 15_000_000 + seed,
                "run_dir": str(run_dir),
                "started_at": t,
                "overrides": f"attn={attn} seed={seed}" + (f" optim.matrix_lr={lr}" if lr != 0.04 else ""),
                "config": config,
            },
        )

    for attn in MEANS:
        for seed in range(4):
            add(attn, seed, "s1", "h100")
    add("flex", 9, "s1", "h100", status="failed")
    add("sdpa", 0, "s2", "a100", lr=0.02)
    add("flex", 0, "s2", "a100", lr=0.02)
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------------------------------------
# statistics


def test_welch_matches_scipy_and_the_fallback_matches_scipy():
    sps = pytest.importorskip("scipy.stats", reason="scipy is in the dev extra; the fallback is tested against it")
    rng = random.Random(1)
    for _ in range(20):
        a = [rng.gauss(1.0, 0.05) for _ in range(rng.randint(2, 8))]
        b = [rng.gauss(1.02, 0.08) for _ in range(rng.randint(2, 8))]
        w = stats.welch_less(a, b)
        ref = sps.ttest_ind(a, b, equal_var=False, alternative="less")
        assert w is not None and math.isclose(w.t, ref.statistic, rel_tol=1e-9)
        assert math.isclose(w.p, ref.pvalue, rel_tol=1e-7, abs_tol=1e-12)
        assert math.isclose(stats._t_cdf(w.t, w.df), ref.pvalue, rel_tol=1e-7, abs_tol=1e-12)
        for alternative in ("greater", "two-sided"):
            w = stats.welch(a, b, alternative)
            ref = sps.ttest_ind(a, b, equal_var=False, alternative=alternative)
            assert w is not None and w.alternative == alternative and math.isclose(w.t, ref.statistic, rel_tol=1e-9)
            assert math.isclose(w.p, ref.pvalue, rel_tol=1e-7, abs_tol=1e-12), alternative
    assert stats.welch_less([1.0], [1.0, 2.0]) is None  # n < 2: no test, not a fake p
    # constant samples: certain when the means differ, no evidence when they do not
    assert [stats.welch([2.0, 2.0], [1.0, 1.0], h).p for h in stats.ALTERNATIVES] == [1.0, 0.0, 0.0]
    assert [stats.welch([1.0, 1.0], [1.0, 1.0], h).p for h in stats.ALTERNATIVES] == [0.5, 0.5, 1.0]
    with pytest.raises(ValueError, match="alternative='bigger' is not one of less, greater, two-sided"):
        stats.welch([1.0, 2.0], [1.0, 2.0], "bigger")


def test_mean_std_and_pareto_front():
    assert stats.mean([1.0, 2.0, 3.0]) == 2.0 and stats.std([1.0, 2.0, 3.0]) == 1.0 and stats.std([1.0]) is None
    assert stats.finite([1, None, float("nan"), "x", True, 2.5]) == [1.0, 2.5]
    pts = [(1.0, 3.0), (2.0, 2.0), (3.0, 2.5), (4.0, 1.0), (0.5, 0.5)]  # (tokens/s, bpb)
    assert stats.pareto_front(pts) == [4, 3]


# ---------------------------------------------------------------------------------------------------------
# the command


def test_leaderboard_and_baseline_t_test(tmp_path, capsys):
    db = make_db(tmp_path)
    out = tmp_path / "report"
    assert report.main(["--db", str(db), "--sweep", "s1", "--baseline", "attn=sdpa", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "grouped by: attn" in printed and "baseline" in printed and "Welch" in printed
    rows = read_csv(out / "leaderboard.csv")
    assert [r["attn"] for r in rows] == ["flex", "sdpa", "math"]  # ranked by mean val_bpb
    flex, sdpa, math_ = rows
    assert (flex["n"], flex["failures"], sdpa["baseline"]) == ("4", "1", "self")
    assert float(flex["p"]) < 0.01 and float(math_["p"]) > 0.5 and float(flex["delta"]) < 0
    sps = pytest.importorskip("scipy.stats")
    con = ResultsDB(db).rows("sweep = 's1' AND status = 'ok'")
    sample = {a: [r["val_bpb"] for r in con if r["attn"] == a] for a in MEANS}
    ref = sps.ttest_ind(sample["flex"], sample["sdpa"], equal_var=False, alternative="less").pvalue
    assert math.isclose(float(flex["p"]), ref, rel_tol=1e-6)
    assert "better (Holm p<0.05)" in printed and "not significant" in printed  # two tests: Holm-adjusted
    for name in ("pareto.png", "loss_curves.png", "quant_vs_size.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_an_ablation_tests_whether_taking_a_lever_out_makes_it_worse(tmp_path, capsys):
    """--alternative greater: H1 "the group's mean is higher than the baseline's", as an ablation asks of a lever
    taken out. Against flex (mean 1.280), sdpa (1.300) and math (1.302) are significantly worse; against sdpa, flex
    is not worse and math (+0.002, noise 0.004) is not shown to be."""
    db = make_db(tmp_path)
    args = ["--db", str(db), "--sweep", "s1", "--no-plots", "--out", str(tmp_path / "r")]
    assert report.main([*args, "--baseline", "attn=flex", "--alternative", "greater"]) == 0
    printed = capsys.readouterr().out
    assert "is higher than its baseline's (one-sided Welch t-test)" in printed
    rows = {r["attn"]: r for r in read_csv(tmp_path / "r" / "leaderboard.csv")}
    assert float(rows["sdpa"]["p"]) < 0.01 and float(rows["math"]["p"]) < 0.01
    assert printed.count("worse (Holm p<0.05)") >= 2 and "better (" not in printed
    assert report.main([*args, "--baseline", "attn=sdpa", "--alternative", "greater"]) == 0
    rows = {r["attn"]: r for r in read_csv(tmp_path / "r" / "leaderboard.csv")}
    assert float(rows["flex"]["p"]) > 0.99 and float(rows["math"]["p"]) > 0.05
    capsys.readouterr()
    assert report.main([*args, "--baseline", "attn=sdpa", "--alternative", "two-sided"]) == 0
    printed = capsys.readouterr().out
    assert "differs from its baseline's (two-sided Welch t-test)" in printed and "differs (Holm p<0.05)" in printed
    rows = {r["attn"]: r for r in read_csv(tmp_path / "r" / "leaderboard.csv")}
    assert float(rows["flex"]["p"]) < 0.05 and float(rows["math"]["p"]) > 0.05


def test_filters_and_group_keys(tmp_path, capsys):
    db = make_db(tmp_path)
    runs = report.load_runs(db)
    assert report.default_group_keys(runs) == ["hardware", "attn", "optim.matrix_lr"]
    assert len(report.load_runs(db, hardware="a100")) == 2
    assert {r.get("attn") for r in report.load_runs(db, where={"attn": "flex,math"})} == {"flex", "math"}
    assert len(report.load_runs(db, where={"optim.matrix_lr": "0.02"})) == 2  # a config key, compared as numbers
    assert len(report.load_runs(db, sweeps=["latest"])) == 2  # s2 started last
    assert report.main(["--db", str(db), "--name", "nobody", "--out", str(tmp_path / "r")]) == 2


def test_baseline_pairs_groups_that_share_the_other_keys(tmp_path):
    db = make_db(tmp_path)
    runs = [r for r in report.load_runs(db) if r.status == "ok"]
    groups = report.group_runs(runs, ["hardware", "attn"])
    report.compare(groups, {"attn": "sdpa"}, "val_bpb")
    by = {(g.values["hardware"], g.values["attn"]): g for g in groups}
    assert by[("a100", "flex")].baseline is by[("a100", "sdpa")]
    assert by[("h100", "flex")].baseline is by[("h100", "sdpa")] and by[("h100", "sdpa")].is_baseline
    assert by[("a100", "flex")].welch is None  # one run per side: no p-value


def test_a_resumed_sweep_includes_the_runs_it_reused(tmp_path):
    db = make_db(tmp_path)
    sweep_dir = tmp_path / "multirun" / "s2"
    sweep_dir.mkdir(parents=True)
    reused = str(tmp_path / "runs" / "s1-math-0-ok")
    (sweep_dir / "sweep.json").write_text(json.dumps({"jobs": [{"state": "reused", "run_dir": reused}]}))
    s2 = {str(tmp_path / "runs" / f"s2-{a}-0-ok") for a in ("sdpa", "flex")}
    # a sweep dir: its own runs (sweep id = dir name) and the ones its manifest reused
    assert {r.row["run_dir"] for r in report.load_runs(db, sweeps=[str(sweep_dir)])} == s2 | {reused}
    # a resumed sweep that ran nothing has no rows: its id and `latest` still find it through its manifest
    s3 = tmp_path / "multirun" / "2026-01-01" / "s3"
    s3.mkdir(parents=True)
    (s3 / "sweep.json").write_text(json.dumps({"started_at": 1e12, "jobs": [{"state": "reused", "run_dir": reused}]}))
    assert [r.row["run_dir"] for r in report.load_runs(db, sweeps=["s3"])] == [reused]
    assert [r.row["run_dir"] for r in report.load_runs(db, sweeps=["latest"])] == [reused]


def test_diverged_runs_are_failures_and_never_rank(tmp_path, capsys):
    """A diverged run counts with the failures in the report and the sweep summary, no number of it
    enters a group's mean (a row may carry one: recorded before eval was skipped, or by an older version), and a
    group with no ok run is not ranked, however good its numbers look."""
    from speedrun.report.manifest import JobEntry
    from speedrun.report.sweep import summarize, summary_csv, summary_markdown

    error = "training loss rose from 6.9300 at step 1 to 15.0000 at step 3"
    rows = [("sdpa", s, "ok", 1.30 + s / 1000) for s in range(3)]
    rows += [("flex", 0, "ok", 1.28), ("flex", 1, "ok", 1.282), ("flex", 2, "diverged", 0.5)]
    rows += [("math", 0, "diverged", 0.1), ("math", 1, "diverged", None)]
    db = ResultsDB(tmp_path / "results.sqlite")
    results = []
    for i, (attn, seed, status, val) in enumerate(rows):
        row = {
            "status": status,
            "error": error if status == "diverged" else None,
            "name": "t",
            "attn": attn,
            "seed": seed,
            "val_bpb": val,
            "run_dir": str(tmp_path / "runs" / str(i)),
            "started_at": 1000.0 + i,
            "overrides": f"attn={attn} seed={seed}",
        }
        db.upsert(row["run_dir"], row)
        results.append(row)
    out = tmp_path / "report"
    assert report.main(["--db", str(db.path), "--out", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    board = {r["attn"]: r for r in read_csv(out / "leaderboard.csv")}
    assert [r["attn"] for r in read_csv(out / "leaderboard.csv")] == ["flex", "sdpa", "math"]
    assert {a: (r["rank"], r["n"], r["failures"]) for a, r in board.items()} == {
        "flex": ("1", "2", "1"),
        "sdpa": ("2", "3", "0"),
        "math": ("-", "0", "2"),
    }
    assert math.isclose(float(board["flex"]["val_bpb_mean"]), 1.281) and board["math"]["val_bpb_mean"] == ""
    assert "1 group(s) hidden: no ok run" in printed and "| math " not in printed  # nothing to rank: hidden
    assert report.main(["--db", str(db.path), "--out", str(out), "--no-plots", "--all"]) == 0
    assert "| - | math | 0 | 2 " in capsys.readouterr().out  # --all shows it, unranked
    html = (out / "report.html").read_text()
    assert html.count("diverged") >= 3 and "rose from 6.9300" in html  # each diverged run among the failures

    jobs = [JobEntry(index=i, overrides=[f"attn={r['attn']}", f"seed={r['seed']}"]) for i, r in enumerate(results)]
    s = summarize(jobs, results)
    assert [r["status"] for _, r in s.failures] == ["diverged"] * 3
    summary = {r["attn"]: r for r in csv.DictReader(summary_csv(s).splitlines())}
    assert {a: (r["n"], r["failures"]) for a, r in summary.items()} == {
        "sdpa": ("3", "0"),
        "flex": ("2", "1"),
        "math": ("0", "2"),
    }
    assert summary["math"]["val_bpb_mean"] == "" and math.isclose(float(summary["flex"]["val_bpb_mean"]), 1.281)
    md = summary_markdown(s, None, tmp_path)
    assert "failures: 3" in md and "## Failures" in md and md.count("| diverged") == 3


# ---------------------------------------------------------------------------------------------------------
# HTML in a real browser


def test_html_is_self_contained_and_renders_in_chromium(tmp_path):
    db = make_db(tmp_path)
    out = tmp_path / "report"
    assert report.main(["--db", str(db), "--sweep", "s1", "--baseline", "attn=sdpa", "--out", str(out)]) == 0
    text = (out / "report.html").read_text()
    assert text.count('src="data:image/png;base64,') == 3
    assert "http://" not in text and "https://" not in text and 'src="' + "pareto.png" not in text
    seen = check_in_browser(out / "report.html", tmp_path)
    assert seen == {"data-images": 3, "data-images-loaded": 3, "data-rows": 3}


def test_model_keys_come_from_the_model_that_ran():
    """model=auto stores nulls in the composed config; the Plan has the resolved preset."""
    from speedrun.report import Run

    run = Run.from_row(
        {
            "status": "ok",
            "config": {"model": {"name": "auto", "n_layer": None}},
            "plan": {"model_name": "pgolf_baseline", "model": {"n_layer": 9}},
        }
    )
    assert run.get("model.name") == "pgolf_baseline" and run.get("model.n_layer") == 9
