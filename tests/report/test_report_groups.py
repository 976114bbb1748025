"""The one grouping path: cards kept apart, evaluation sets never ranked or tested across, TTT gain and shared GPUs
shown when runs record them, the sweep summary counting and laying out groups as the report does, and what a resumed
sweep may reuse (ok runs of this card and this code, never one resumed onto other code).

Synthetic databases and manifests only; tests/e2e/test_sweep.py runs the real CLI.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from speedrun import report
from speedrun.records.store import ResultsDB
from speedrun.report import plots
from speedrun.report.manifest import JobEntry, Manifest
from speedrun.report.sweep import summarize, summary_csv, summary_markdown

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def make_db(root: Path, rows: list[dict[str, Any]]) -> Path:
    """One results row per dict: attn and seed become the overrides; the rest are result columns."""
    path = root / "results.sqlite"
    db = ResultsDB(path)
    for i, extra in enumerate(rows):
        row = {
            "status": "ok",
            "name": "t",
            "sweep": "s1",
            "hardware": "h100",
            "device_name": H100,
            "seed": 0,
            "attn": "sdpa",
            "val_bpb": 1.3,
            "tokens_per_s": 1e6,
            "started_at": 1000.0 + i,
            **extra,
        }
        row["overrides"] = f"attn={row['attn']} seed={row['seed']}"
        row["run_dir"] = str(root / "runs" / str(i))
        db.upsert(row["run_dir"], row)
    return path


def seeds(attn: str, values: list[float], **extra: Any) -> list[dict[str, Any]]:
    return [{"attn": attn, "seed": s, "val_bpb": v, **extra} for s, v in enumerate(values)]


def run_report(db: Path, out: Path, capsys, *args: str) -> tuple[str, list[dict[str, str]]]:
    assert report.main(["--db", str(db), "--out", str(out), "--no-plots", *args]) == 0
    with open(out / "leaderboard.csv") as f:
        return capsys.readouterr().out, list(csv.DictReader(f))


SDPA = [1.300, 1.302, 1.298, 1.301]
FLEX = [1.280, 1.282, 1.279, 1.281]


# ---------------------------------------------------------------------------------------------------------
# cards


def test_an_h100_and_an_h200_under_one_profile_are_never_folded(tmp_path, capsys):
    db = make_db(
        tmp_path,
        seeds("sdpa", SDPA[:2], device_name=H100)
        + seeds("sdpa", SDPA[2:], device_name=H200)
        + [{"status": "failed", "device_name": None, "seed": 9}],
    )  # failed before it saw a device
    runs = report.load_runs(db)
    # the profile is the same, the card is not; the null of the failed run is not a third card
    assert report.default_group_keys(runs) == ["device_name"]
    printed, rows = run_report(db, tmp_path / "r", capsys)
    assert "grouped by: device_name" in printed
    assert sorted((r["device_name"], r["n"]) for r in rows) == [(H100, "2"), (H200, "2"), ("null", "0")]
    # the sweep summary adds the card the same way, in front of the swept keys
    results = [{**r.row, "overrides": None} for r in runs]
    jobs = [
        JobEntry(index=i, overrides=["hardware=auto", f"seed={r['seed']}"], state="launched")
        for i, r in enumerate(results)
    ]
    s = summarize(jobs, results)
    assert s.keys == ["device_name"] and [g.values["device_name"] for g in s.groups] == [H100, H200, "null"]
    # a profile that varies is what ran, not the hardware=auto every job asked for
    results = [{**r, "hardware": "a100" if r["device_name"] == H200 else r["hardware"]} for r in results]
    assert [g.values["hardware"] for g in summarize(jobs, results).groups] == ["h100", "a100", "h100"]
    # and the throughput plot gets one panel per card
    plt = pytest.importorskip("matplotlib.pyplot", reason="matplotlib is in the report extra")
    fig = plots._plot_pareto(
        plt,
        report.group_runs(runs, ["device_name"]),
        {"device_name=" + H100: "r", "device_name=" + H200: "b", "device_name=null": "k"},
        "val_bpb",
    )
    assert sorted(ax.get_title() for ax in fig.axes) == [f"hardware: h100 ({H100})", f"hardware: h100 ({H200})"]
    # one card: no device column (runs on one card are repeats, as before)
    one = make_db(tmp_path / "one", seeds("sdpa", SDPA) + seeds("flex", FLEX))
    assert report.default_group_keys(report.load_runs(one)) == ["attn"]


# ---------------------------------------------------------------------------------------------------------
# evaluation sets


def test_groups_that_mix_evaluation_sets_are_neither_ranked_nor_tested(tmp_path, capsys):
    # each group's seeds 0-1 were scored on one token set, 2-3 on another
    def fp(rows):
        return [
            {
                **r,
                "eval_fingerprint": "aaaa1111" if r["seed"] < 2 else "bbbb2222",
                "eval_tokens": 2048 if r["seed"] < 2 else 4096,
            }
            for r in rows
        ]

    db = make_db(tmp_path, fp(seeds("sdpa", SDPA)) + fp(seeds("flex", FLEX)))
    printed, rows = run_report(db, tmp_path / "r", capsys, "--baseline", "attn=sdpa")
    assert "2 different evaluation sets" in printed and "aaaa1111 (2048 tokens)" in printed
    assert "not ranked, not tested: 2 group(s)" in printed
    assert "--group-by attn,eval_fingerprint" in printed and "--where eval_fingerprint=aaaa1111" in printed
    assert [r["rank"] for r in rows] == ["-", "-"] and all(r["p"] == "" for r in rows)
    assert "other eval set" in printed and "better (p<" not in printed
    assert {r["eval_fingerprint"] for r in rows} == {"aaaa1111,bbbb2222"}
    assert "not ranked, not tested" in (tmp_path / "r" / "report.html").read_text()

    # grouped by the set: shown, ranked within each set, tested only within a set
    printed, rows = run_report(
        db, tmp_path / "r2", capsys, "--baseline", "attn=sdpa", "--group-by", "attn,eval_fingerprint"
    )
    assert "not ranked" not in printed and "2 different evaluation sets" in printed
    by = {(r["attn"], r["eval_fingerprint"]): r for r in rows}
    assert [(r["eval_fingerprint"], r["rank"], r["attn"]) for r in rows] == [
        ("aaaa1111", "1", "flex"),
        ("aaaa1111", "2", "sdpa"),
        ("bbbb2222", "1", "flex"),
        ("bbbb2222", "2", "sdpa"),
    ]
    assert by[("flex", "aaaa1111")]["baseline"] == "attn=sdpa eval_fingerprint=aaaa1111"
    assert 0 < float(by[("flex", "aaaa1111")]["p"]) < 0.05

    # one set picked with --where: one ranking, no note about sets
    printed, rows = run_report(
        db, tmp_path / "r3", capsys, "--baseline", "attn=sdpa", "--where", "eval_fingerprint=bbbb2222"
    )
    assert "evaluation sets" not in printed and [r["rank"] for r in rows] == ["1", "2"] and rows[0]["p"]


def test_groups_scored_on_different_sets_are_ranked_apart_and_not_tested(tmp_path, capsys):
    # e.g. a sweep over eval.tokens: each group is one set, but no two groups share one
    db = make_db(
        tmp_path, seeds("sdpa", SDPA, eval_fingerprint="aaaa1111") + seeds("flex", FLEX, eval_fingerprint="bbbb2222")
    )
    printed, rows = run_report(db, tmp_path / "r", capsys, "--baseline", "attn=sdpa")
    assert [(r["attn"], r["rank"], r["p"]) for r in rows] == [("sdpa", "1", ""), ("flex", "1", "")]
    assert "ranked and t-tested only against groups of their own set" in printed and "other eval set" in printed


def test_runs_without_a_fingerprint_are_compared_with_a_warning(tmp_path, capsys):
    db = make_db(tmp_path, seeds("sdpa", SDPA, eval_fingerprint="aaaa1111") + seeds("flex", FLEX))
    printed, rows = run_report(db, tmp_path / "r", capsys, "--baseline", "attn=sdpa")
    assert "warning: 4 of 8 ok run(s) have no eval_fingerprint" in printed
    assert [(r["attn"], r["rank"]) for r in rows] == [("flex", "1"), ("sdpa", "2")]
    assert float(rows[0]["p"]) < 0.05 and "eval_fingerprint" not in rows[0]  # one known set: no column


# ---------------------------------------------------------------------------------------------------------
# TTT gain and shared GPUs: shown when recorded


def test_ttt_base_ttt_and_gain_are_shown_when_present(tmp_path, capsys):
    rows = [
        {**r, "val_bpb_ttt_base": r["val_bpb"] + 0.01, "val_bpb_ttt": r["val_bpb"] - 0.02} for r in seeds("sdpa", SDPA)
    ]
    printed, board = run_report(make_db(tmp_path, rows), tmp_path / "r", capsys)
    (row,) = board
    assert abs(float(row["val_bpb_ttt_base_mean"]) - (sum(SDPA) / 4 + 0.01)) < 1e-9
    assert abs(float(row["val_bpb_ttt_mean"]) - (sum(SDPA) / 4 - 0.02)) < 1e-9
    assert abs(float(row["ttt_gain_mean"]) - 0.03) < 1e-9  # base - ttt, per run
    assert "| val_bpb_ttt_base" in printed and "+0.0300" in printed
    _, plain = run_report(make_db(tmp_path / "plain", seeds("sdpa", SDPA)), tmp_path / "r2", capsys)
    assert not [c for c in plain[0] if "ttt" in c]


def test_runs_that_shared_a_gpu_are_counted_and_said(tmp_path, capsys):
    db = make_db(tmp_path, seeds("sdpa", SDPA, gpu_shared=1) + seeds("flex", FLEX, gpu_shared=0))
    printed, rows = run_report(db, tmp_path / "r", capsys)
    assert {r["attn"]: r["gpu_shared"] for r in rows} == {"sdpa": "4", "flex": "0"}
    assert "4 of 8 ok run(s) shared their GPU" in printed
    _, plain = run_report(make_db(tmp_path / "plain", seeds("sdpa", SDPA)), tmp_path / "r2", capsys)
    assert "gpu_shared" not in plain[0]
    # every run records gpu_shared now, false included: a column of zeros would say nothing
    _, alone = run_report(make_db(tmp_path / "alone", seeds("sdpa", SDPA, gpu_shared=0)), tmp_path / "r3", capsys)
    assert "gpu_shared" not in alone[0]


def test_runs_trained_to_a_target_show_how_many_reached_it_and_their_mean_time(tmp_path, capsys):
    reached = [{"reached": True, "time_to_target": t} for t in (100.0, 110.0)] + [
        {"reached": False, "time_to_target": None}
    ]
    rows = [{**r, **seed_row} for r, seed_row in zip(seeds("sdpa", SDPA[:3]), reached, strict=True)]
    rows += [{**r, "reached": True, "time_to_target": 90.0} for r in seeds("flex", FLEX[:2])]
    printed, board = run_report(make_db(tmp_path, rows), tmp_path / "r", capsys)
    cells = {r["attn"]: (r["reached"], r["time_to_target"]) for r in board}
    # the run that missed is counted in `reached`, not averaged into the time
    assert cells == {"sdpa": ("2/3", "105.0 ± 7.1"), "flex": ("2/2", "90.0 ± 0.0")}
    assert "| reached" in printed
    _, plain = run_report(make_db(tmp_path / "plain", seeds("sdpa", SDPA)), tmp_path / "r2", capsys)
    assert "reached" not in plain[0] and "time_to_target" not in plain[0]


# ---------------------------------------------------------------------------------------------------------
# the sweep summary goes the same way


def _jobs(results: list[dict[str, Any]]) -> list[JobEntry]:
    return [
        JobEntry(index=i, overrides=[f"attn={r['attn']}", f"seed={r['seed']}"], state="launched")
        for i, r in enumerate(results)
    ]


def test_the_sweep_summary_counts_and_lays_out_groups_as_the_report_does(tmp_path, capsys):
    rows = (
        seeds("sdpa", SDPA[:3])
        + seeds("flex", FLEX[:2])
        + [
            {"attn": "flex", "seed": 2, "status": "diverged", "val_bpb": None},
            {"attn": "flex", "seed": 3, "status": "failed", "val_bpb": None},
        ]
    )
    results = [{"status": "ok", "hardware": "cpu", "device_name": "cpu0", **r} for r in rows]
    jobs = _jobs(results) + [JobEntry(index=7, overrides=["attn=sdpa", "seed=3"], state="not_run")]
    s = summarize(jobs, results + [{"status": "not_run"}])
    summary = list(csv.DictReader(summary_csv(s).splitlines()))
    db = make_db(tmp_path, rows)
    _, board = run_report(db, tmp_path / "r", capsys, "--group-by", "attn")
    # one layout: the same columns in the same order, and the same counts (diverged is a failure in both)
    assert list(summary[0]) == list(board[0])
    counts = lambda table: {r["attn"]: (r["n"], r["failures"], r["val_bpb_mean"]) for r in table}  # noqa: E731
    assert counts(summary) == counts(board)
    assert {k: v[:2] for k, v in counts(board).items()} == {"sdpa": ("3", "0"), "flex": ("2", "2")}
    assert {r["attn"]: r["not_run"] for r in summary} == {"sdpa": "1", "flex": "0"}
    assert [r.get("status") for _, r in s.failures] == ["diverged", "failed"]


def test_the_sweep_summary_says_what_it_reused_from_where_and_what_ran_again(tmp_path):
    earlier = tmp_path / "multirun" / "d" / "earlier"
    (earlier / "0").mkdir(parents=True)
    (earlier / "sweep.json").write_text("{}")
    results = [{"status": "ok", **r} for r in seeds("sdpa", SDPA[:3])]
    jobs = _jobs(results)
    jobs[0].state = jobs[1].state = "reused"
    jobs[0].run_dir, jobs[1].run_dir = str(earlier / "0"), str(tmp_path / "runs" / "single")
    jobs[2].note = f"ran on another card ({H100})"
    s = summarize(jobs, results)
    text = summary_markdown(s, Manifest(sweep="now", sweep_dir=str(tmp_path), name="t"), tmp_path)
    assert f"reused by resume: 2 run(s), from {earlier} (1); {tmp_path / 'runs' / 'single'} (1)" in text
    assert f"ran again, not reused: 1 combination(s) whose earlier ok run ran on another card ({H100})" in text


def test_the_sweep_summary_refuses_to_treat_evaluation_sets_as_one(tmp_path):
    results = [
        {"status": "ok", "eval_fingerprint": "aaaa1111" if r["seed"] else "bbbb2222", **r}
        for r in seeds("sdpa", SDPA[:2]) + seeds("flex", FLEX[:2])
    ]
    s = summarize(_jobs(results), results, "s9")
    text = summary_markdown(s, None, tmp_path)
    assert "not ranked, not tested: 2 group(s)" in text
    assert "`python -m speedrun.report --sweep s9 --group-by attn,eval_fingerprint`" in text
    header = next(line for line in text.splitlines() if line.startswith("| attn"))
    assert [c.strip() for c in header.strip("|").split("|")][:3] == ["attn", "eval_fingerprint", "n"]
    assert {r["attn"]: r["eval_fingerprint"] for r in csv.DictReader(summary_csv(s).splitlines())} == {
        "sdpa": "bbbb2222,aaaa1111",
        "flex": "bbbb2222,aaaa1111",
    }


# ---------------------------------------------------------------------------------------------------------
# what a resumed sweep reuses


def test_resume_reuses_only_ok_runs_of_this_card_and_this_code(tmp_path):
    from speedrun.records.identity import SWEEP_REUSE_IGNORED, config_identity
    from speedrun.records.store import ResultsDB
    from speedrun.report.manifest import completed_runs

    db = ResultsDB(tmp_path / "results.sqlite")
    config = {"name": "t", "seed": 0, "sweep": "ignored"}
    ident = config_identity(config, SWEEP_REUSE_IGNORED)
    for i, (status, card, code) in enumerate(
        [("ok", "H100", "c0"), ("ok", "H100", "c1"), ("failed", "H100", "c1"), ("ok", "H200", "c1")]
    ):
        db.upsert(
            f"run{i}",
            {
                "status": status,
                "device_name": card,
                "code_fingerprint": code,
                "started_at": i,
                "config": config,
                "run_dir": f"run{i}",
            },
        )
    assert completed_runs(db.path).reusable[ident]["run_dir"] == "run3"  # no conditions: the latest ok run
    assert completed_runs(db.path, device_name="H100", code="c1").reusable[ident]["run_dir"] == "run1"
    assert completed_runs(db.path, device_name="H100", code="c0").reusable[ident]["run_dir"] == "run0"
    other_code = completed_runs(db.path, device_name="H200", code="c2")
    assert not other_code.reusable and other_code.refused[ident] == "ran other code (code_fingerprint c1, here c2)"
    other_card = completed_runs(db.path, device_name="A100", code=None)  # code=None: resume_across_code
    assert not other_card.reusable and other_card.refused[ident] == "ran on another card (H200)"
    assert completed_runs(db.path, device_name="H200", code=None).reusable[ident]["run_dir"] == "run3"
    # a run recorded before runs kept their code_fingerprint: its code is unknown, it is reused (with a warning)
    db.upsert("run4", {"status": "ok", "device_name": "H200", "started_at": 9, "config": config, "run_dir": "run4"})
    assert completed_runs(db.path, device_name="H200", code="c2").reusable[ident]["run_dir"] == "run4"


def test_a_sweep_never_reuses_a_run_resumed_onto_other_code():
    from speedrun.report.manifest import reuse_refusal

    row = {"device_name": "cpu", "code_fingerprint": "new", "resume_code_change": "old -> new"}
    assert "resumed onto other code" in reuse_refusal(row, "cpu", "new")
    assert reuse_refusal({**row, "resume_code_change": None}, "cpu", "new") is None
