"""The report on a database it cannot fully trust: a row it cannot decode, a file that is not SQLite, a database
without a runs table, runs that saw their training data more than once, and running rows whose process is gone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from speedrun import report
from speedrun.records.store import ResultsDB


def _db(root: Path, rows: dict[str, dict]) -> Path:
    path = root / "results.sqlite"
    db = ResultsDB(path)
    for i, (run_id, row) in enumerate(rows.items()):
        db.upsert(run_id, {"name": "t", "started_at": 1000.0 + i, "status": "ok", **row})
    return path


def _report(db: Path, out: Path, *args: str) -> int:
    return report.main(["--db", str(db), "--out", str(out), "--no-plots", *args])


def test_a_row_that_is_not_utf8_is_skipped_and_named_not_the_whole_report(tmp_path, capsys):
    db = _db(
        tmp_path,
        {f"run{i}": {"val_bpb": 1.0 + i / 100, "seed": i, "overrides": f"seed={i}"} for i in range(3)},
    )
    con = sqlite3.connect(db)
    with con:
        # bytes that are not UTF-8 in a TEXT column: sqlite3 raises on them while fetching, ending the query
        con.execute("UPDATE runs SET error = CAST(X'626f6f6dff' AS TEXT) WHERE run_id = 'run1'")
        con.execute("INSERT INTO runs (run_id, status, started_at) VALUES (CAST(X'72756e80' AS TEXT), 'ok', 2000)")
        (rowid,) = con.execute("SELECT rowid FROM runs WHERE status = 'ok' AND started_at = 2000").fetchone()
    con.close()

    assert _report(db, tmp_path / "report") == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning: skipped")]
    assert len(warnings) == 2, captured.err
    assert "run run1 " in warnings[0] and "its error is not UTF-8 text (0xff at byte 4)" in warnings[0]
    assert f"the row with rowid {rowid} " in warnings[1] and "its run_id is not UTF-8" in warnings[1]
    assert f"DELETE FROM runs WHERE rowid = {rowid}" in warnings[1]
    assert "runs: 2 " in captured.out  # run0 and run2 are reported
    board = (tmp_path / "report" / "leaderboard.csv").read_text()
    assert board.splitlines()[1].split(",")[:1] == ["t"] and ",2," in board  # one group of the two readable runs


def test_a_file_that_is_not_sqlite_is_one_line_and_exit_1(tmp_path, capsys):
    bad = tmp_path / "results.sqlite"
    bad.write_text("this is not a database\n" * 100)
    assert _report(bad, tmp_path / "report") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {bad} cannot be read as a SQLite database (file is not a database)")
    assert "point --db at a speedrun results database" in err


def test_a_database_without_a_runs_table_is_one_line_and_exit_1(tmp_path, capsys):
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE notes (text TEXT)")
    con.close()
    assert _report(other, tmp_path / "report") == 1
    err = capsys.readouterr().err
    assert (
        err == f"error: {other} has no runs table: it is not a speedrun results database; point --db at one "
        "(outputs/results.sqlite by default)\n"
    )
