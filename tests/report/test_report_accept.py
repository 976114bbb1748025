"""Acceptance judging for the report: parameter-golf's rule (a margin-shifted one-sided Welch t-test, checked
against scipy), its numbers read from the track's config, modded-nanogpt's threshold rule, too few seeds, and Holm's
correction of several groups tested against one baseline."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from speedrun import report
from speedrun.config.track_rules import load_track
from speedrun.records.store import ResultsDB
from speedrun.report.accept import accept_table, judge, parse_accept, verdict
from speedrun.report.groups import compare, group_runs
from speedrun.report.run_rows import Run
from speedrun.report.target import accept_p
from speedrun.stats import holm

# val_loss per seed. sdpa: the baseline. flex: 0.020 lower, far past the 0.005 margin. math: 0.003 lower, a
# significant plain improvement but inside the margin. fa3: one seed, too few for Welch.
VAL_LOSS = {
    "sdpa": [2.5000, 2.5020, 2.4980, 2.5010],
    "flex": [2.4800, 2.4815, 2.4790, 2.4805],
    "math": [2.4970, 2.4985, 2.4965, 2.4980],
    "fa3": [2.4000],
}


def rows() -> list[dict[str, Any]]:
    return [
        {"status": "ok", "attn": attn, "seed": seed, "val_loss": v, "val_bpb": v / 2, "hardware": "h100"}
        for attn, values in VAL_LOSS.items()
        for seed, v in enumerate(values)
    ]


def make_db(root: Path, results: list[dict[str, Any]]) -> Path:
    db = ResultsDB(root / "results.sqlite")
    for i, row in enumerate(results):
        run_dir = root / "runs" / str(i)
        full = {"name": "t", "started_at": 1000.0 + i, "overrides": f"attn={row['attn']} seed={row['seed']}", **row}
        db.upsert(str(run_dir), {**full, "run_dir": str(run_dir)})
    return db.path


def groups_against_sdpa():
    groups = group_runs([Run.from_row(r) for r in rows()], ["attn"])
    compare(groups, {"attn": "sdpa"}, "val_loss")
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
    assert (track.acceptance.rule, track.acceptance.metric) == ("improve_by", "val_loss")
    assert (track.acceptance.margin, track.acceptance.p_value) == (0.005, 0.01)


def test_margin_shifted_welch_matches_scipy() -> None:
    sps = pytest.importorskip("scipy.stats")
    track = parse_accept("pgolf")
    margin = track.acceptance.margin
    assert margin is not None
    judged = {j.group.values["attn"]: j for j in judge(track, groups_against_sdpa()[1])}
    assert set(judged) == {"flex", "math", "fa3"}  # the baseline is not judged against itself
    for attn in ("flex", "math"):
        ref = sps.ttest_ind([v + margin for v in VAL_LOSS[attn]], VAL_LOSS["sdpa"], equal_var=False, alternative="less")
        test = judged[attn].test
        assert test is not None
        assert test.t == pytest.approx(ref.statistic, rel=1e-9) and test.p == pytest.approx(ref.pvalue, rel=1e-6)
        mean_diff = sum(VAL_LOSS[attn]) / 4 - sum(VAL_LOSS["sdpa"]) / 4
        assert judged[attn].diff == pytest.approx(mean_diff)
    # the plain test (no margin) calls math better; the rule does not
    plain = sps.ttest_ind(VAL_LOSS["math"], VAL_LOSS["sdpa"], equal_var=False, alternative="less").pvalue
    assert plain < 0.05
    assert [verdict(judged[a], track) for a in ("flex", "math")] == ["accepted", "not accepted"]
    assert verdict(judged["fa3"], track).startswith("too few seeds: candidate has 1")
    assert ">= 2 per group" in verdict(judged["fa3"], track)


def test_a_wider_margin_in_the_track_changes_the_verdict() -> None:
    """The margin is read from the track, not written in the report: a track asking 0.03 rejects flex (0.020)."""
    from dataclasses import replace

    track = parse_accept("pgolf")
    strict = replace(track, acceptance=replace(track.acceptance, margin=0.03))
    flex = next(j for j in judge(strict, groups_against_sdpa()[1]) if j.group.values["attn"] == "flex")
    assert verdict(flex, strict) == "not accepted" and flex.test is not None and flex.test.t > 0


def test_the_accept_table_shows_diff_margin_t_df_p_and_holm() -> None:
    track = parse_accept("pgolf")
    notes, headers, table = accept_table(track, judge(track, groups_against_sdpa()[1]), ["attn"])
    assert headers == [
        "attn", "n", "n_base", "mean", "mean_base", "diff", "margin", "t", "df", "p", "p (Holm)", "verdict",
    ]  # fmt: skip
    by = {r[0]: dict(zip(headers, r)) for r in table}
    assert by["flex"]["margin"] == "-0.005" and by["flex"]["diff"] == "-0.0200"
    assert by["fa3"]["t"] == "" and by["fa3"]["verdict"].startswith("too few seeds")
    assert any("at least 0.005 below the standing record at p < 0.01" in n for n in notes)
    assert any("github.com/openai/parameter-golf" in n for n in notes)
    assert any("Holm's step-down adjustment over those 2 tests" in n for n in notes)


def test_accept_from_the_command_line(tmp_path, capsys) -> None:
    db = make_db(tmp_path, rows())
    out = tmp_path / "r"
    args = ["--db", str(db), "--out", str(out), "--no-plots", "--baseline", "attn=sdpa", "--accept", "pgolf"]
    assert report.main(args) == 0
    printed = capsys.readouterr().out
    section = printed.split("acceptance (pgolf_10min_16mb):")[1]
    assert "| flex " in section and "accepted" in section and "not accepted" in section
    assert "too few seeds" in section
    assert 'id="accept"' in (out / "report.html").read_text()
    with open(out / "accept.csv") as f:
        by = {r["attn"]: r for r in csv.DictReader(f)}
    assert by["flex"]["verdict"] == "accepted" and by["math"]["verdict"] == "not accepted"


def test_accept_needs_a_baseline_and_a_known_track(tmp_path, capsys) -> None:
    db = make_db(tmp_path, rows())
    base = ["--db", str(db), "--out", str(tmp_path / "r"), "--no-plots"]
    assert report.main([*base, "--accept", "pgolf"]) == 2
    assert "name its group with --baseline KEY=VALUE" in capsys.readouterr().err
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
    judged = judge(track, group_runs([Run.from_row(r) for r in results], ["attn"]))
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
