"""Real sweeps through `python -m run -m` on CPU: a 2 x 2 multirun records every job and writes the summary; the
sweeper resumes it (nothing runs again, unless the card or the code changed), keeps going past a failing job or
stops at the first with fail-fast; and `python -m speedrun.report` on its database.

The 2 x 2 sweep runs once for the file (swept); the tests that resume it sweep in a working dir of their own, on a
copy of its database, so none depends on another having run first."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.browser import check_in_browser
from support.cli import SWEEP_TINY, run_cli, run_python

pytestmark = pytest.mark.slow

GRID = ["model.n_layer=1,2", "optim.matrix_lr=0.04,0.02"]


def db_rows(cwd: Path) -> list[dict]:
    con = sqlite3.connect(db_path(cwd))
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM runs ORDER BY started_at")]


def db_path(cwd: Path) -> Path:
    return cwd / "outputs" / "results.sqlite"


def sweep_dirs(cwd: Path) -> list[Path]:
    return sorted((cwd / "outputs" / "multirun").glob("*/*"), key=lambda p: p.name)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _sweep(cwd: Path, data: Path, *args, timeout=600, env=None, fork=False):
    """``fork``: for a resumed sweep that launches no job (forked from this process, see run_cli)."""
    return run_cli(
        ["-m", *SWEEP_TINY, f"data.cache_dir={data}", *args], cwd=cwd, timeout=timeout, env_extra=env, fork=fork
    )


@pytest.fixture(scope="module")
def swept(tmp_path_factory, data_cache):
    """GRID swept once, in a working dir of its own: its console (proc), working dir (cwd) and the dataset (data).
    Read only: a test that sweeps on top of it does so on a copy of its database (on_its_database)."""
    cwd = tmp_path_factory.mktemp("sweep")
    return SimpleNamespace(proc=_sweep(cwd, data_cache, *GRID), cwd=cwd, data=data_cache)


def on_its_database(swept, tmp_path: Path) -> Path:
    """A working dir of its own whose outputs/results.sqlite is a copy of the swept one: its rows, which name the
    first sweep's run dirs, are what a resume there reuses."""
    (tmp_path / "outputs").mkdir()
    src, dst = sqlite3.connect(db_path(swept.cwd)), sqlite3.connect(db_path(tmp_path))
    src.backup(dst)
    src.close()
    dst.close()
    return tmp_path


def test_a_2x2_multirun_records_every_job_and_writes_the_summary(swept):
    out = swept.proc.stdout + swept.proc.stderr
    assert swept.proc.returncode == 0, out[-4000:]
    (sweep,) = sweep_dirs(swept.cwd)
    job_dirs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in job_dirs] == ["0", "1", "2", "3"]
    rows = db_rows(swept.cwd)
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {r["sweep"] for r in rows} == {sweep.name}
    assert {r["run_dir"] for r in rows} == {str(p.resolve()) for p in job_dirs}
    combos = {(f"model.n_layer={a}", f"optim.matrix_lr={b}") for a in (1, 2) for b in ("0.04", "0.02")}
    assert {
        tuple(o for o in r["overrides"].split() if o.startswith(("model.n_layer", "optim."))) for r in rows
    } == combos
    assert not any("hydra" in r["overrides"] for r in rows)  # the launcher's plumbing is not a task override
    summary = read_csv(sweep / "summary.csv")
    assert len(summary) == 4 and {(r["model.n_layer"], r["optim.matrix_lr"]) for r in summary} == {
        ("1", "0.04"),
        ("1", "0.02"),
        ("2", "0.04"),
        ("2", "0.02"),
    }
    assert all(r["n"] == "1" and r["failures"] == "0" and float(r["val_bpb_mean"]) > 0 for r in summary)
    assert "| model.n_layer | optim.matrix_lr | n | failures | val_bpb" in (sweep / "summary.md").read_text()
    assert "sweep summary" in out and "| model.n_layer" in out  # the same table on the console
    for d in job_dirs:
        assert (d / "result.json").exists() and (d / "console.log").exists() and (d / ".hydra").is_dir()


def test_resuming_the_same_sweep_runs_nothing(swept, tmp_path):
    cwd = on_its_database(swept, tmp_path)
    proc = _sweep(cwd, swept.data, *GRID, "hydra.sweeper.resume=true", timeout=300, fork=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "4 of 4 combination(s) already completed ok" in out
    (first,), (resumed,) = sweep_dirs(swept.cwd), sweep_dirs(cwd)
    assert not [p for p in resumed.iterdir() if p.is_dir()]  # no job ran
    assert len(db_rows(cwd)) == 4
    manifest = json.loads((resumed / "sweep.json").read_text())
    assert {j["state"] for j in manifest["jobs"]} == {"reused"}
    assert {j["run_dir"] for j in manifest["jobs"]} == {str(p.resolve()) for p in first.iterdir() if p.is_dir()}
    summary = read_csv(resumed / "summary.csv")
    assert len(summary) == 4 and all(r["n"] == "1" for r in summary)
    from speedrun import report

    db = cwd / "outputs" / "results.sqlite"
    for selector in (resumed.name, "latest", str(resumed)):  # the report sees the runs the resumed sweep reused
        assert len(report.load_runs(db, sweeps=[selector])) == 4


# one combination of GRID: its composed config is that of the first sweep's job 0, whatever the sweep dir
ONE = ["model.n_layer=1", "optim.matrix_lr=0.04"]


def test_a_sweep_resumed_on_another_card_runs_its_jobs_again(swept, tmp_path):
    from speedrun.records.identity import DEVICE_NAME_ENV

    cwd = on_its_database(swept, tmp_path)
    before = len(db_rows(cwd))
    # SPEEDRUN_DEVICE_NAME makes the sweeper believe it is on an H200; the earlier runs recorded this CPU
    env = {DEVICE_NAME_ENV: "NVIDIA H200"}
    proc = _sweep(cwd, swept.data, *ONE, "hydra.sweeper.resume=true", env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "0 of 1 combination(s) already completed ok (on NVIDIA H200" in out
    assert "1 combination(s) run again: their earlier ok run ran on another card" in out
    (sweep,) = sweep_dirs(cwd)
    assert [p.name for p in sweep.iterdir() if p.is_dir()] == ["0"] and len(db_rows(cwd)) == before + 1
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert manifest["device_name"] == "NVIDIA H200" and manifest["jobs"][0]["state"] == "launched"
    assert (
        "ran again, not reused: 1 combination(s) whose earlier ok run ran on another card"
        in (sweep / "summary.md").read_text()
    )


def test_a_code_change_reruns_unless_resume_across_code(swept, tmp_path):
    from speedrun.records.store import ResultsDB

    cwd = on_its_database(swept, tmp_path)
    db = ResultsDB(cwd / "outputs" / "results.sqlite")
    grid = [r for r in db.rows() if "model.n_layer=1 optim.matrix_lr=0.02" in r["overrides"]]
    assert len(grid) == 1
    db.upsert(grid[0]["run_id"], {"code_fingerprint": "0123456789abcdef"})  # as if other code had made it
    combo = ["model.n_layer=1", "optim.matrix_lr=0.02", "hydra.sweeper.resume=true"]

    proc = _sweep(cwd, swept.data, *combo, "hydra.sweeper.resume_across_code=true", timeout=300, fork=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "1 of 1 combination(s) already completed ok" in out and "any code" in out
    (reused,) = sweep_dirs(cwd)
    assert not [p for p in reused.iterdir() if p.is_dir()]
    summary = (reused / "summary.md").read_text()
    assert f"reused by resume: 1 run(s), from {Path(grid[0]['run_dir']).parent} (1)" in summary

    proc = _sweep(cwd, swept.data, *combo, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "0 of 1 combination(s) already completed ok" in out
    assert "their earlier ok run ran other code (code_fingerprint 0123456789abcdef" in out
    rerun = sweep_dirs(cwd)[-1]
    assert [p.name for p in rerun.iterdir() if p.is_dir()] == ["0"]
    assert json.loads((rerun / "sweep.json").read_text())["jobs"][0]["state"] == "launched"


def test_a_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path, data_cache):
    # two slots (CUDA_VISIBLE_DEVICES 0 and 1, harmless on CPU): the failing job runs beside the good one
    proc = _sweep(
        tmp_path,
        data_cache,
        "model.n_layer=1",
        "data.path=nowhere,null",
        # the failing job fails building its data (after env.json); the other has no tokenizer without a path
        "data.tokenizer=${data.path}",
        "hydra.launcher.gpus=[0,1]",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]  # the summary is written, then the exit status says a job failed
    (sweep,) = sweep_dirs(tmp_path)
    rows = db_rows(tmp_path)
    assert {r["sweep"] for r in rows} == {sweep.name}
    by_path = {("nowhere" if "data.path=nowhere" in r["overrides"] else "null"): r for r in rows}
    assert by_path["nowhere"]["status"] == "failed" and "nowhere" in by_path["nowhere"]["error"]
    assert by_path["null"]["status"] == "ok"
    failed_dir = Path(by_path["nowhere"]["run_dir"])
    assert "Traceback" in (failed_dir / "error.txt").read_text()
    gpus = {json.loads((Path(r["run_dir"]) / "env.json").read_text())["cuda_visible_devices"] for r in rows}
    assert gpus == {"0", "1"}
    summary = {r["data.path"]: r for r in read_csv(sweep / "summary.csv")}
    assert (summary["nowhere"]["failures"], summary["null"]["failures"], summary["null"]["n"]) == ("1", "0", "1")
    assert "## Failures" in (sweep / "summary.md").read_text() and "failed: " in out


def test_fail_fast_stops_at_the_first_failure(tmp_path, data_cache):
    proc = _sweep(tmp_path, data_cache, "data.path=nowhere,null", "hydra.sweeper.fail_fast=true", timeout=300)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    (sweep,) = sweep_dirs(tmp_path)
    assert [p.name for p in sweep.iterdir() if p.is_dir()] == ["0"]
    rows = db_rows(tmp_path)
    assert len(rows) == 1 and rows[-1]["status"] == "failed"
    states = [j["state"] for j in json.loads((sweep / "sweep.json").read_text())["jobs"]]
    assert states == ["launched", "not_run"]


def test_the_report_on_the_sweep_database(swept, tmp_path):
    (first,) = (sweep.name for sweep in sweep_dirs(swept.cwd))
    out = tmp_path / "report"
    proc = run_python(  # forked from this process: speedrun is imported already
        [
            "-m",
            "speedrun.report",
            "--sweep",
            first,
            "--group-by",
            "model.n_layer",
            "--baseline",
            "model.n_layer=1",
            "--out",
            str(out),
        ],
        cwd=swept.cwd,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert "leaderboard (val_bpb" in text and "one-sided Welch t-test" in text and "baseline" in text
    board = read_csv(out / "leaderboard.csv")
    assert sorted(r["model.n_layer"] for r in board) == ["1", "2"] and all(r["n"] == "2" for r in board)
    (other,) = [r for r in board if r["model.n_layer"] == "2"]
    assert 0.0 <= float(other["p"]) <= 1.0
    for name in ("pareto.png", "loss_curves.png", "quant_vs_size.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name
    seen = check_in_browser(out / "report.html", tmp_path)
    assert seen == {"data-images": 3, "data-images-loaded": 3, "data-rows": 2}
