"""The leaderboard as read on a console: --metric by any numeric result key (the allowed keys come from the runs and
the result contract), groups with no ok run hidden unless --all, columns equal on every row said once above the
table, and lines kept within the terminal's width."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from speedrun import report
from speedrun.records.store import ResultsDB
from speedrun.report.run_rows import Run
from speedrun.report.selection import check_metric, numeric_keys
from speedrun.report.view import fit_width, fold_equal, line_width


def make_db(root: Path, rows: list[dict[str, Any]]) -> Path:
    db = ResultsDB(root / "results.sqlite")
    for i, extra in enumerate(rows):
        row: dict[str, Any] = {"status": "ok", "name": "t", "hardware": "cpu", "precision": "fp32"}
        row["started_at"] = 1000.0 + i
        row.update(extra)
        row["overrides"] = f"attn={row['attn']} seed={row['seed']}"
        row["run_dir"] = str(root / "runs" / str(i))
        db.upsert(row["run_dir"], row)
    return db.path


# attn -> val_loss_quant per seed; val_bpb ranks them the other way round, so the order shows which key ranked
QUANT = {"sdpa": [2.30, 2.31], "flex": [2.40, 2.41], "math": [2.20, 2.22]}
BPB = {"sdpa": 1.20, "flex": 1.10, "math": 1.30}


def rows(**extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "attn": a,
            "seed": s,
            "val_bpb": BPB[a] + s / 1000,
            "val_loss_quant": v,
            "val_loss_ttt": v - 0.05,
            "ttt_complete": True,
            **extra,
        }
        for a, vs in QUANT.items()
        for s, v in enumerate(vs)
    ]


def run(db: Path, out: Path, capsys, *args: str) -> tuple[str, list[dict[str, str]]]:
    assert report.main(["--db", str(db), "--out", str(out), "--no-plots", *args]) == 0
    with open(out / "leaderboard.csv") as f:
        return capsys.readouterr().out, list(csv.DictReader(f))


# ---------------------------------------------------------------------------------------------------------
# --metric


def test_metric_takes_any_numeric_result_key(tmp_path, capsys):
    db = make_db(tmp_path, rows())
    for key in ("val_loss_quant", "val_loss_ttt"):
        printed, board = run(db, tmp_path / key, capsys, "--metric", key)
        assert [r["attn"] for r in board] == ["math", "sdpa", "flex"], key  # ranked by the key, not val_bpb
        assert f"leaderboard ({key}, lowest first)" in printed
        assert board[0][f"{key}_mean"]


def test_numeric_keys_come_from_the_runs_and_the_contract():
    runs = [Run.from_row(r) for r in rows(custom_score=0.5)]
    keys = numeric_keys(runs)
    assert {"val_loss_quant", "val_loss_ttt", "custom_score"} <= set(keys)  # in the data, in no fixed list
    assert {"val_bpb", "tokens_per_s", "artifact_bytes"} <= set(keys)  # the contract's, present or not
    assert {"overhead_s", "ttt_gain"} <= set(keys)  # derived per run
    assert not {"seed", "started_at", "attn", "ttt_complete"} & set(keys)  # ids, text and flags measure nothing
    assert check_metric("val_loss_ttt", runs) is None


def test_an_unknown_or_text_metric_lists_the_numeric_keys(tmp_path, capsys):
    db = make_db(tmp_path, rows())
    base = ["--db", str(db), "--out", str(tmp_path / "r"), "--no-plots"]
    assert report.main([*base, "--metric", "val_los"]) == 2
    err = capsys.readouterr().err
    assert "--metric val_los: is no result key of these runs; the numeric keys:" in err
    assert "val_loss_quant" in err and "val_loss_ttt" in err and "val_bpb" in err
    assert report.main([*base, "--metric", "attn"]) == 2
    assert "--metric attn: holds str values, not numbers" in capsys.readouterr().err
    assert report.main([*base, "--metric", "ttt_complete"]) == 2
    assert "a flag or an identifier" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# hidden groups and equal columns


FAILED = [
    {"attn": "fa3", "seed": 0, "status": "failed", "error": "ConfigError: fa3 needs an H100"},
    {"attn": "fa3", "seed": 1, "status": "oom", "error": "OutOfMemoryError"},
]


def test_groups_with_no_ok_run_are_hidden_unless_all(tmp_path, capsys):
    db = make_db(tmp_path, rows() + FAILED)
    printed, board = run(db, tmp_path / "r", capsys)
    table = printed.split("leaderboard (val_bpb")[1]
    assert "1 group(s) hidden: no ok run" in table and "attn=fa3" in table and "--all shows them" in table
    assert "| fa3 " not in table
    assert [r["attn"] for r in board] == ["flex", "sdpa", "math", "fa3"]  # the CSV keeps every group
    html = (tmp_path / "r" / "report.html").read_text()
    assert "group(s) hidden" in html and "ConfigError: fa3 needs an H100" in html  # the failures still say why
    printed, _ = run(db, tmp_path / "r", capsys, "--all")
    assert "| fa3 " in printed and "hidden" not in printed


def test_columns_equal_in_every_row_are_said_once_above_the_table(tmp_path, capsys):
    db = make_db(tmp_path, rows(hardware="cpu", mfu=0.25))
    printed, board = run(db, tmp_path / "r", capsys, "--group-by", "attn,hardware,precision")
    table = printed.split("leaderboard (val_bpb, lowest first):\n")[1]
    above, header = table.splitlines()[:2]
    assert above.startswith("all rows: hardware=cpu precision=fp32 n=2 failures=0 mfu=0.2500 ± 0.0000")
    assert "empty in every row: " in above and "artifact_bytes" in above
    assert header.split("|")[1:4] == [" # ", " attn ", " val_bpb         "]
    assert "hardware" not in header and "mfu" not in header and "| val_bpb" in header
    assert board[0]["hardware"] == "cpu"  # the CSV keeps every column
    printed, _ = run(db, tmp_path / "r", capsys, "--group-by", "attn,hardware,precision", "--all")
    assert "all rows:" not in printed and "| hardware |" in printed


def test_fold_equal_keeps_one_row_and_the_named_columns():
    one = (["a", "b"], [["1", "2"]])
    assert fold_equal(one, []) == (one, "")
    two = (["#", "a", "b"], [["1", "x", "2"], ["2", "y", "2"]])
    assert fold_equal(two, ["b"]) == (two, "")
    assert fold_equal(two, []) == ((["#", "a"], [["1", "x"], ["2", "y"]]), "all rows: b=2")


# ---------------------------------------------------------------------------------------------------------
# the terminal's width


@pytest.mark.parametrize("width", [80, 100])
def test_lines_stay_within_the_terminals_width(tmp_path, capsys, monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))
    cards = ("NVIDIA H100 80GB HBM3 on a long-named host", "NVIDIA H200 141GB HBM3e on a long-named host")
    on_cards = [{**r, "device_name": card, "artifact_bytes": 15_999_999} for card in cards for r in rows()]
    db = make_db(tmp_path, on_cards)
    printed, _ = run(db, tmp_path / "r", capsys, "--group-by", "attn,device_name", "--baseline", "attn=sdpa")
    tables = [line for line in printed.splitlines() if line.startswith("|")]
    assert tables and all(len(line) <= width for line in tables), max(tables, key=len)
    assert "left out to fit" in printed and f"{width} columns" in printed
    board = printed.split("leaderboard (val_bpb")[1].split("\n\n")[0]
    assert "| val_bpb" in board and "| verdict" in board  # the ranked metric and the test stay
    assert "…" in board  # the long name is cut, not wrapped
    above = board.split("\n|")[0].splitlines()[1:]  # hidden groups, columns equal on every row: wrapped prose
    assert any(line.startswith("all rows:") for line in above) and all(len(line) <= width for line in above)


def test_unset_columns_and_no_terminal_print_every_column(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    db = make_db(tmp_path, rows(artifact_bytes=15_999_999))
    printed, _ = run(db, tmp_path / "r", capsys)
    assert "left out to fit" not in printed and "artifact_bytes" in printed


def test_fit_width_drops_the_lowest_priority_first_then_cuts():
    headers = ["key", "main", "low", "lowest"]
    table = (headers, [["a" * 30, "1.0", "2.0" * 5, "3.0" * 5]])
    (kept, rows), dropped = fit_width(table, 60, ["low", "lowest"])
    assert dropped == ["lowest"] and kept == ["key", "main", "low"]
    assert line_width([len(c) for c in rows[0]]) <= 60
    (kept, rows), dropped = fit_width(table, 20, ["low", "lowest"], cuttable=["key"])
    assert dropped == ["lowest", "low"] and rows[0][0].endswith("…") and rows[0][1] == "1.0"
    assert line_width([max(len(h), len(c)) for h, c in zip(kept, rows[0])]) <= 20
    (kept, rows), _ = fit_width((["key", "main"], [["a" * 30, "1.0" * 10]]), 20, [], cuttable=["key"])
    assert rows[0] == ["a" * 5 + "…", "1.0" * 10]  # a number is never cut: the line stays longer
