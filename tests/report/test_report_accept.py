"""Acceptance judging for the report: parameter-golf's rule on the loss a submission is scored on (TTT's, else the
quantized artifact's), against the standing record's published mean by a one-sample t-test (reproducing a record
README's p) or a --baseline's seeds by the margin-shifted Welch test (checked against scipy), its numbers read from
the track's config and records table; modded-nanogpt's threshold rule; too few seeds; Holm only when asked."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest

from speedrun import report
from speedrun.config.track_rules import find_record, load_records, load_track, standing_record
from speedrun.records.store import ResultsDB
from speedrun.report.accept import Reference, accept_table, judge, parse_accept, parse_record, verdict, verdict_line
from speedrun.report.groups import compare, group_runs
from speedrun.report.run_rows import Run
from speedrun.report.target import accept_p
from speedrun.stats import holm, ttest_below, welch

DATA = "fineweb_sp8192_caseops"
RECORD = standing_record("pgolf_10min_16mb", DATA)
assert RECORD is not None and RECORD.val_loss is not None
BPB_PER_NAT = RECORD.val_bpb / RECORD.val_loss  # one tokenizer and validation set: a fixed ratio
# The loss a submission is scored on (val_loss_quant here) per seed. sdpa: the baseline, at the standing record.
# flex: 0.020 lower, far past the 0.005 margin. math: 0.003 lower, a significant plain improvement but inside the
# margin. fa3: one seed, too few for a test.
SCORED = {
    "sdpa": [RECORD.val_loss + d for d in (0.0000, 0.0020, -0.0020, 0.0010)],
    "flex": [RECORD.val_loss + d for d in (-0.0200, -0.0185, -0.0210, -0.0195)],
    "math": [RECORD.val_loss + d for d in (-0.0030, -0.0015, -0.0035, -0.0020)],
    "fa3": [RECORD.val_loss - 0.1],
}


def rows(scored: dict[str, list[float]] | None = None, float_gap: float = 0.05) -> list[dict[str, Any]]:
    """Result rows: the float model's val_loss ``float_gap`` below the scored (quantized) loss."""
    return [
        {
            "status": "ok",
            "attn": attn,
            "seed": seed,
            "data": DATA,
            "val_loss": v - float_gap,
            "val_bpb": (v - float_gap) * BPB_PER_NAT,
            "val_loss_quant": v,
            "val_bpb_quant": v * BPB_PER_NAT,
            "hardware": "h100",
        }
        for attn, values in (scored or SCORED).items()
        for seed, v in enumerate(values)
    ]


def make_db(root: Path, results: list[dict[str, Any]]) -> Path:
    db = ResultsDB(root / "results.sqlite")
    for i, row in enumerate(results):
        run_dir = root / "runs" / str(i)
        full = {"name": "t", "started_at": 1000.0 + i, "overrides": f"attn={row['attn']} seed={row['seed']}", **row}
        db.upsert(str(run_dir), {**full, "run_dir": str(run_dir)})
    return db.path


def groups_against_sdpa(results: list[dict[str, Any]] | None = None):
    groups = group_runs([Run.from_row(r) for r in results or rows()], ["attn"])
    compare(groups, {"attn": "sdpa"}, "val_loss_quant")
    return {g.values["attn"]: g for g in groups}, groups


# ---------------------------------------------------------------------------------------------------------
# Holm


def test_holm_matches_hand_computed_example() -> None:
    # Sorted 0.01, 0.02, 0.04 times 3, 2, 1 give 0.03, 0.04, 0.04 (monotone).
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])


def test_holm_caps_at_one_and_keeps_order() -> None:
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([0.001]) == pytest.approx([0.001])
    assert holm([]) == []


def test_several_groups_against_one_baseline_are_holm_adjusted(tmp_path, capsys) -> None:
    by, _ = groups_against_sdpa()
    tested = [by[a] for a in ("flex", "math")]  # fa3 has one seed: no test, not in the family
    assert by["fa3"].welch is None and by["fa3"].p_holm is None
    raw = [g.welch.p for g in tested if g.welch is not None]
    assert [g.p_holm for g in tested] == pytest.approx(holm(raw))
    smaller, larger = sorted(raw)
    # step-down: the smaller p times 2 (two tests), the larger times 1 but never below the smaller's adjusted
    assert sorted(g.p_holm or 0.0 for g in tested) == pytest.approx([min(1.0, 2 * smaller), max(2 * smaller, larger)])
    db = make_db(tmp_path, rows())
    out = tmp_path / "r"
    args = ["--db", str(db), "--out", str(out), "--no-plots", "--metric", "val_loss", "--baseline", "attn=sdpa"]
    assert report.main(args) == 0
    printed = capsys.readouterr().out
    assert "2 groups tested against a baseline: p (Holm)" in printed and "| p (Holm) |" in printed
    assert "better (Holm p<0.05)" in printed
    html = (out / "report.html").read_text()
    assert 'id="holm"' in html and "p (Holm)" in html
    csv_text = (out / "leaderboard.csv").read_text()
    assert "p_holm" in csv_text.splitlines()[0]


def test_one_group_against_its_baseline_is_not_adjusted(tmp_path, capsys) -> None:
    db = make_db(tmp_path, [r for r in rows() if r["attn"] in ("sdpa", "flex")])
    args = ["--db", str(db), "--out", str(tmp_path / "r"), "--no-plots", "--baseline", "attn=sdpa"]
    assert report.main(args) == 0
    printed = capsys.readouterr().out
    assert "Holm" not in printed and "better (p<0.05)" in printed


# ---------------------------------------------------------------------------------------------------------
# parameter-golf's rule


def test_the_rule_is_the_tracks_own() -> None:
    from speedrun.export.track import load_track as export_load_track

    track = parse_accept("pgolf")
    assert track == load_track("pgolf_10min_16mb") == export_load_track("pgolf_10min_16mb")  # one source of rules
    assert (track.acceptance.rule, track.acceptance.metric) == ("improve_by", "scored_loss")
    assert (track.acceptance.margin, track.acceptance.p_value, track.acceptance.min_seeds) == (0.005, 0.01, 3)


def test_the_records_table_holds_the_merged_records_as_published() -> None:
    """conf/track/records/: the standing record of each data is the lowest val_bpb of that data; values spot-checked
    against the records' submission.json (openai/parameter-golf 4908dc46f)."""
    records = {r.folder: r for r in load_records("pgolf_10min_16mb")}
    assert len(records) == 44 and all(r.date and r.data for r in records.values())
    top = records["2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611"]
    assert (top.pr, top.val_loss, top.val_loss_std, top.val_bpb, top.n) == (1855, 2.32202732, 0.00198, 1.06107587, 3)
    assert standing_record("pgolf_10min_16mb", DATA) == top
    assert (
        standing_record("pgolf_10min_16mb", "fineweb_sp1024").folder
        == "2026-03-31_ParallelResiduals_MiniDepthRecurrence"
    )
    assert records["2026-03-17_NaiveBaseline"].val_bpb == 1.2243657
    assert find_record("pgolf_10min_16mb", "#1868") == find_record("pgolf_10min_16mb", "1868")
    with pytest.raises(ValueError, match="no merged record '9999'"):
        find_record("pgolf_10min_16mb", "9999")


def test_the_published_mean_test_reproduces_a_record_readmes_p() -> None:
    """records/track_10min_16mb/2026-03-18_LongContextSeq2048/README.md: its three seeds against the Naive
    Baseline's published 1.2243657 less 0.005, "One-sided one-sample t-test against 1.2193657: t=31.42 with df=2,
    which gives p=0.00051" (its t is record - mean over the standard error: ours, the other sign)."""
    seeds = [1.20576485, 1.20617460, 1.20715923]
    naive = find_record("pgolf_10min_16mb", "2026-03-17_NaiveBaseline")
    test = ttest_below(seeds, naive.val_bpb - 0.005)
    assert test is not None and (round(-test.t, 2), test.df, round(test.p, 5)) == (31.42, 2.0, 0.00051)
    # 2026-03-19_TrainingOptSeq4096/README.md: against 1.21113611, "t=9.06 with df=2, which gives p=0.006" (its t
    # from the std rounded to 0.00187; the seeds' own std gives 9.04)
    test = ttest_below([1.20143417, 1.19945102, 1.20319508], 1.21113611)
    assert test is not None and abs(-test.t - 9.06) < 0.03 and round(test.p, 3) == 0.006


def test_each_group_is_tested_against_the_standing_records_published_mean() -> None:
    sps = pytest.importorskip("scipy.stats")
    track = parse_accept("pgolf")
    judged = {j.group.values["attn"]: j for j in judge(track, group_runs([Run.from_row(r) for r in rows()], ["attn"]))}
    assert set(judged) == {"sdpa", "flex", "math", "fa3"}  # no --baseline: every group against the record
    for attn in ("flex", "math"):
        ref = sps.ttest_1samp(SCORED[attn], RECORD.val_loss - 0.005, alternative="less")
        j = judged[attn]
        assert j.reference is not None and j.reference.label == RECORD.label() and j.loss_key == "val_loss_quant"
        assert j.test is not None and j.test.p == pytest.approx(ref.pvalue, rel=1e-6)
        assert j.diff == pytest.approx(sum(SCORED[attn]) / 4 - RECORD.val_loss)
        assert j.diff_bpb == pytest.approx(j.diff * BPB_PER_NAT)
        assert j.p_holm is None  # no correction unless --holm
    assert [verdict(judged[a], track) for a in ("flex", "math", "sdpa")] == ["accepted", "not accepted"] * 1 + [
        "not accepted"
    ]
    assert verdict(judged["fa3"], track).startswith("too few seeds: candidate has 1")
    line = verdict_line(judged["flex"], track)
    for says in ("flex: accepted", "val_loss_quant mean", RECORD.label(), "nats (", "bpb)", "p=", "n=4", "one-sample"):
        assert says in line, line


def test_a_float_loss_that_improves_while_the_scored_loss_regresses_is_rejected(tmp_path, capsys) -> None:
    """The float model 0.02 nats better than the baseline, its quantized artifact (what is scored) 0.008 worse:
    rejected against the baseline's seeds (Welch) and against the record (one-sample), from the command line."""
    base = SCORED["sdpa"]
    cand = [v + 0.008 for v in base]
    results = [{**r, "val_loss": r["val_loss_quant"] - 0.05} for r in rows({"sdpa": base})] + [
        {**r, "val_loss": r["val_loss_quant"] - 0.078} for r in rows({"flex": cand})
    ]  # float: 0.020 better
    by, groups = groups_against_sdpa(results)
    float_test = welch([r["val_loss"] + 0.005 for r in results if r["attn"] == "flex"],
                       [r["val_loss"] for r in results if r["attn"] == "sdpa"])  # fmt: skip
    assert float_test is not None and float_test.p < 0.01  # judged on val_loss, it would pass
    track = parse_accept("pgolf")
    (flex,) = judge(track, groups)
    assert flex.loss_key == "val_loss_quant" and flex.diff == pytest.approx(0.008)
    assert flex.test is not None and flex.test.p > 0.5 and verdict(flex, track) == "not accepted"
    db = make_db(tmp_path, results)
    base_args = ["--db", str(db), "--out", str(tmp_path / "r"), "--no-plots", "--accept", "pgolf"]
    for extra, against in ((["--baseline", "attn=sdpa"], "vs baseline attn=sdpa"), ([], f"vs {RECORD.label()}")):
        assert report.main([*base_args, *extra]) == 0
        out = capsys.readouterr().out.split("acceptance (pgolf_10min_16mb):")[1]
        line = next(x for x in out.splitlines() if x.startswith("attn=flex: "))
        assert line.startswith("attn=flex: not accepted; val_loss_quant mean") and against in line, line
        assert "+0.008" in line and " nats (+0.00" in line and "bpb)" in line and "n=4" in line
        assert "accepted;" not in out.replace("not accepted;", "")


def test_ttts_loss_is_judged_when_ttt_scored_every_token() -> None:
    track = parse_accept("pgolf")
    row = rows({"flex": SCORED["flex"][:3]})
    full = [{**r, "val_loss_ttt": r["val_loss_quant"] - 0.01, "val_bpb_ttt": 1.0, "ttt_complete": True} for r in row]
    cut = [{**r, "val_loss_ttt": r["val_loss_quant"] - 0.01, "ttt_complete": False} for r in row]
    (j,) = judge(track, group_runs([Run.from_row(r) for r in full], ["attn"]))
    assert j.loss_key == "val_loss_ttt" and j.values == pytest.approx([v - 0.01 for v in SCORED["flex"][:3]])
    (j,) = judge(track, group_runs([Run.from_row(r) for r in cut], ["attn"]))
    assert j.loss_key == "val_loss_quant"  # a TTT pass cut short scores nothing
    no_quant = [{k: v for k, v in r.items() if "quant" not in k} for r in row]
    (j,) = judge(track, group_runs([Run.from_row(r) for r in no_quant], ["attn"]))
    assert j.values == [] and verdict(j, track).startswith("too few seeds")


def test_a_records_three_seeds_are_required_and_p_alone_is_not_enough() -> None:
    track = parse_accept("pgolf")
    two = rows({"flex": [RECORD.val_loss - 0.05, RECORD.val_loss - 0.0501]})
    (j,) = judge(track, group_runs([Run.from_row(r) for r in two], ["attn"]))
    assert j.test is not None and j.test.p < 0.01
    assert verdict(j, track) == "not accepted: 2 seeds, the track asks >= 3 (p would pass)"


def test_record_on_the_command_line_and_other_data(tmp_path, capsys) -> None:
    track = parse_accept("pgolf")
    given = parse_record(track, "val_loss=2.40,std=0.002,n=3")
    assert (given.val_loss, given.std, given.n, given.data) == (2.40, 0.002, 3, None)
    assert parse_record(track, "1855").label == RECORD.label()
    for bad, says in (("val_loss=x", "must be a number"), ("loss=2.3", "is not val_loss="), ("std=1", "val_loss=MEAN")):
        with pytest.raises(ValueError, match=says):
            parse_record(track, bad)
    groups = group_runs([Run.from_row(r) for r in rows({"math": SCORED["math"]})], ["attn"])
    (j,) = judge(track, groups, given)  # 0.08 below 2.40: accepted against the given numbers
    assert j.reference is given and verdict(j, track) == "accepted"
    sp1024 = parse_record(track, "2026-03-17_NaiveBaseline")
    (j,) = judge(track, groups, sp1024)
    assert j.test is None and "nats per token do not compare across tokenizers" in verdict(j, track)
    # a record that publishes no val_loss: its val_bpb in nats by the runs' own ratio
    (j,) = judge(track, groups, Reference("r", None, val_bpb=RECORD.val_bpb, data=DATA))
    assert j.converted and j.reference_loss == pytest.approx(RECORD.val_loss)
    db = make_db(tmp_path, rows())
    base = ["--db", str(db), "--out", str(tmp_path / "r"), "--no-plots"]
    assert report.main([*base, "--accept", "pgolf", "--record", "val_loss=oops"]) == 2
    assert "must be a number" in capsys.readouterr().err
    assert report.main([*base, "--record", "1855"]) == 2
    assert "add --accept pgolf" in capsys.readouterr().err


def test_holm_only_when_asked() -> None:
    track = parse_accept("pgolf")
    groups = group_runs([Run.from_row(r) for r in rows()], ["attn"])
    plain = judge(track, groups)
    corrected = judge(track, groups, correct=True)
    tested = [j.test.p for j in corrected if j.test is not None]
    assert all(j.p_holm is None for j in plain)
    assert [j.p_holm for j in corrected if j.test is not None] == pytest.approx(holm(tested))
    notes, headers, _ = accept_table(track, corrected, ["attn"])
    assert "p (Holm)" in headers and any("--holm" in n for n in notes)
    assert "p (Holm)" not in accept_table(track, plain, ["attn"])[1]


def test_margin_shifted_welch_against_a_baseline_matches_scipy() -> None:
    sps = pytest.importorskip("scipy.stats")
    track = parse_accept("pgolf")
    judged = {j.group.values["attn"]: j for j in judge(track, groups_against_sdpa()[1])}
    assert set(judged) == {"flex", "math", "fa3"}  # the baseline is not judged against itself
    for attn in ("flex", "math"):
        ref = sps.ttest_ind([v + 0.005 for v in SCORED[attn]], SCORED["sdpa"], equal_var=False, alternative="less")
        test = judged[attn].test
        assert test is not None and test.t == pytest.approx(ref.statistic, rel=1e-9)
        assert test.p == pytest.approx(ref.pvalue, rel=1e-6)
        assert judged[attn].diff == pytest.approx(sum(SCORED[attn]) / 4 - sum(SCORED["sdpa"]) / 4)
        assert "Welch" in verdict_line(judged[attn], track)
    assert [verdict(judged[a], track) for a in ("flex", "math")] == ["accepted", "not accepted"]
    assert ">= 2 per group" in verdict(judged["fa3"], track)


def test_the_accept_table_and_its_notes() -> None:
    track = parse_accept("pgolf")
    judged = judge(track, group_runs([Run.from_row(r) for r in rows()], ["attn"]))
    notes, headers, table = accept_table(track, judged, ["attn"])
    assert headers == [
        "attn", "n", "loss", "mean", "against", "mean_ref", "diff", "diff_bpb", "margin", "t", "df", "p", "verdict",
    ]  # fmt: skip
    by = {r[0]: dict(zip(headers, r)) for r in table}
    assert (
        by["flex"]["margin"] == "-0.005" and by["flex"]["diff"] == "-0.01975" and by["flex"]["loss"] == "val_loss_quant"
    )
    assert by["fa3"]["t"] == "" and by["fa3"]["verdict"].startswith("too few seeds")
    assert any("at least 0.005 nats below the standing record at p < 0.01, over >= 3 seeds" in n for n in notes)
    assert any(n.startswith(f"record {RECORD.label()}: val_loss 2.32203") and "n 3" in n for n in notes)
    assert any("github.com/openai/parameter-golf" in n for n in notes)


def test_accept_from_the_command_line(tmp_path, capsys) -> None:
    db = make_db(tmp_path, rows())
    out = tmp_path / "r"
    assert report.main(["--db", str(db), "--out", str(out), "--no-plots", "--accept", "pgolf"]) == 0
    section = capsys.readouterr().out.split("acceptance (pgolf_10min_16mb):")[1]
    assert "| flex " in section and "flex: accepted; val_loss_quant" in section and "not accepted" in section
    assert 'id="accept"' in (out / "report.html").read_text()
    with open(out / "accept.csv") as f:
        by = {r["attn"]: r for r in csv.DictReader(f)}
    assert by["flex"]["verdict"] == "accepted" and by["math"]["verdict"] == "not accepted"
    assert math.isclose(float(by["flex"]["mean_ref"]), RECORD.val_loss, abs_tol=1e-5)


def test_accept_needs_a_known_track(tmp_path, capsys) -> None:
    db = make_db(tmp_path, rows())
    base = ["--db", str(db), "--out", str(tmp_path / "r"), "--no-plots"]
    assert report.main([*base, "--accept", "golf"]) == 2
    err = capsys.readouterr().err
    assert "no track 'golf'" in err and "pgolf_10min_16mb" in err and "mng" in err
    assert report.main([*base, "--accept", "none"]) == 2
    assert "states no acceptance rule" in capsys.readouterr().err


def test_modded_nanogpts_threshold_rule(tmp_path, capsys) -> None:
    """--accept mng: each group's mean val_loss below the track's 3.28 at p < 0.01, no baseline needed."""
    sps = pytest.importorskip("scipy.stats")
    losses = {"sdpa": [3.260, 3.262, 3.258], "flex": [3.275, 3.290, 3.281]}
    results = [
        {"status": "ok", "attn": a, "seed": s, "val_loss": v} for a, vs in losses.items() for s, v in enumerate(vs)
    ]
    track = parse_accept("mng")
    threshold = track.acceptance.threshold
    assert threshold == 3.28
    assert accept_p() == track.acceptance.p_value == 0.01  # --target's acceptance reads the same track
    judged = judge(track, group_runs([Run.from_row(r) for r in results], ["attn"]), correct=True)
    by = {j.group.values["attn"]: j for j in judged}
    ref = sps.ttest_1samp(losses["sdpa"], threshold, alternative="less")
    sdpa, flex = by["sdpa"].test, by["flex"].test
    assert sdpa is not None and flex is not None and sdpa.p == pytest.approx(ref.pvalue, rel=1e-6)
    assert by["sdpa"].p_holm == pytest.approx(holm([sdpa.p, flex.p])[0])
    assert [verdict(by[a], track) for a in ("sdpa", "flex")] == ["accepted", "not accepted"]
    db = make_db(tmp_path, results)
    assert report.main(["--db", str(db), "--out", str(tmp_path / "r"), "--no-plots", "--accept", "mng"]) == 0
    assert "acceptance (mng_124m)" in capsys.readouterr().out


def test_a_rule_without_its_numbers_is_refused_naming_the_field(monkeypatch) -> None:
    from speedrun.config.track import AcceptanceConfig, TrackConfig
    from speedrun.report import accept

    bare = TrackConfig(name="t", acceptance=AcceptanceConfig(metric="val_loss", rule="improve_by", p_value=0.01))
    monkeypatch.setattr(accept, "load_track", lambda name: bare)
    with pytest.raises(ValueError, match=r"no track.acceptance.margin; set it in conf/track/t.yaml"):
        parse_accept("t")
