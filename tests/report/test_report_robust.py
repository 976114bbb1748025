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


def test_quality_figures_of_runs_that_saw_their_data_more_than_once_are_marked(tmp_path, capsys):
    runs = {
        # `epochs` is read first, `data_epochs` (what earlier rows recorded) when a row has no `epochs`
        "sdpa0": {"attn": "sdpa", "seed": 0, "data_epochs": 0.5, "val_bpb": 1.30},
        "sdpa1": {"attn": "sdpa", "seed": 1, "epochs": 1.0, "data_epochs": 7.0, "val_bpb": 1.31},
        "flex0": {"attn": "flex", "seed": 0, "epochs": 1.5, "val_bpb": 1.10},
        "flex1": {"attn": "flex", "seed": 1, "data_epochs": 3.25, "val_bpb": 1.12},
    }
    for row in runs.values():
        row.update(overrides=f"attn={row['attn']} seed={row['seed']}", val_bpb_quant=row["val_bpb"] + 0.01)
    db = _db(tmp_path, runs)
    out = tmp_path / "report"
    assert _report(db, out) == 0
    printed = capsys.readouterr().out
    board = {
        line.split("|")[2].strip(): line
        for line in printed.splitlines()
        if line.startswith("| 1 ") or line.startswith("| 2 ")
    }
    assert "1.1100 ± 0.0141 †" in board["flex"] and "1.1200 ± 0.0141 †" in board["flex"]  # val_bpb, val_bpb_quant
    assert "†" not in board["sdpa"]
    (note,) = [line for line in printed.splitlines() if line.startswith("† ")]
    assert note.startswith("† 2 ok run(s) in 1 group(s) saw their training data more than once (column epochs")
    assert "val_bpb measures memorising repeated text" in note
    csv_rows = {r.split(",")[0]: r for r in (out / "leaderboard.csv").read_text().splitlines()}
    assert csv_rows["attn"].split(",")[1] == "epochs" and csv_rows["flex"].split(",")[1] == "3.25"
    assert csv_rows["sdpa"].split(",")[1] == "1.0"
    page = (out / "report.html").read_text()
    assert 'id="footnotes">† 2 ok run(s) in 1 group(s)' in page
    assert "<td>1.1100 ± 0.0141 †</td>" in page  # the cell of the leaderboard, numeric (right-aligned)
    assert "<td>1.1000 †</td>" in page and "<td>1.3000</td>" in page  # the runs table: each run as it ran


def test_a_running_row_whose_process_is_gone_is_reported_lost(tmp_path, capsys):
    import os
    import platform
    import subprocess
    import sys
    import time

    from speedrun.records.store import process_identity

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid is free now: no process of this host has it
    now = time.time()
    runs = {
        "ok": {"val_bpb": 1.3, "seed": 0},
        # died on this host: its pid is gone, its heartbeat still recent
        "dead-pid": {"status": "running", "seed": 1, "host": platform.node(), "pid": gone.pid, "heartbeat_at": now},
        # on another host: known lost by its heartbeat, which this machine has seen stand still for two hours
        "silent": {
            "status": "running",
            "seed": 2,
            "host": "elsewhere",
            "pid": 1,
            "heartbeat_at": now - 7200,
            **{"seen_beat": now - 7200, "seen_at": now - 7200, "seen_by": process_identity()["boot_id"]},
        },
        # alive: this process, beating now
        "alive": {"status": "running", "seed": 3, "host": platform.node(), "pid": os.getpid(), "heartbeat_at": now},
    }
    for row in runs.values():
        row["overrides"] = f"seed={row['seed']}"
    db = _db(tmp_path, runs)
    out = tmp_path / "report"
    assert _report(db, out) == 0
    printed = capsys.readouterr().out
    assert "runs: 4 (1 still running, not in the tables; 2 lost: their process died without a word" in printed
    assert "| 1 | t    | 1 | 2        | 1.3000" in printed  # the lost runs count as failures, the live one not yet
    page = (out / "report.html").read_text()
    # in the runs table and among the runs that did not end ok; the live run is in neither
    assert page.count(">lost</td>") == 4 and ">running</td>" not in page
    assert f"lost: pid {gone.pid} on {platform.node()} ended without a word (last heartbeat" in page
