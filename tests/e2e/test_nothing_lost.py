"""Nothing lost: a refused or failed resume leaves the run it names byte for byte as it was (files and row), and
each way a run can be stopped or refused ends with one line on the console, no traceback, the right exit status
and a row that says what happened (its own row, for a refused resume). A run stopped by SIGTERM from outside and
resumed through the CLI finishes its own row, its wall time both parts'."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from support.cli import Forked, run_cli

pytestmark = pytest.mark.slow

# debug=smoke with 2 micro-batches a step (512 tokens, not its 6144), no warm-up step and a short eval: what these
# tests check is what a run leaves on disk and in its row, not what it trains to
SMOKE = ["debug=smoke", "budget.warmup_steps=0", "budget.tokens_per_step=512", "eval.tokens=1024"]


def rows(db: Path) -> dict[str, dict]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    return {r["run_id"]: dict(r) for r in con.execute("SELECT * FROM runs")}


def snapshot(run_dir: Path, db: Path) -> tuple[dict[str, str], dict]:
    """Every file of the run dir by content hash, and its row (the columns it had)."""
    files = {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }
    return files, rows(db)[str(run_dir.resolve())]


def assert_unchanged(before: tuple[dict, dict], run_dir: Path, db: Path, allow: tuple[str, ...] = ()) -> None:
    """``allow``: paths an accepted resume may add to or append (Hydra's log and files, the attempt's record)."""
    files, row = snapshot(run_dir, db)
    assert {k for k in files if k not in before[0] and not k.startswith(allow or ("\0",))} == set()
    assert {k: files[k] for k in before[0] if not k.startswith(allow or ("\0",))} == {
        k: v for k, v in before[0].items() if not k.startswith(allow or ("\0",))
    }
    assert {k: row[k] for k in before[1]} == before[1]  # columns added since (new keys elsewhere) stay NULL here


def one_line_error(proc: subprocess.CompletedProcess, needle: str, code: int = 1, trained: bool = False) -> str:
    """The line naming the problem; no traceback, and no result block unless the run trained (then it has one)."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    assert "Traceback" not in out and ("status:" in out) == trained, out[-3000:]
    (line,) = [ln for ln in out.splitlines() if needle in ln]
    return line


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished smoke run (status ok, no checkpoint) and its database."""
    cwd = tmp_path_factory.mktemp("finished")
    db, run_dir = cwd / "r.sqlite", cwd / "run"
    proc = run_cli([*SMOKE, f"results_db={db}", f"hydra.run.dir={run_dir}"], cwd=cwd, fork=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert rows(db)[str(run_dir.resolve())]["status"] == "ok"
    return cwd, db, run_dir


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["model.n_layer=2"], "holds a finished run (status ok)"),  # also an override it never had
        ([], "holds a finished run (status ok)"),
    ],
)
def test_a_refused_resume_leaves_the_finished_run_as_it_was(finished, extra, needle):
    cwd, db, run_dir = finished
    before = snapshot(run_dir, db)
    proc = run_cli([f"resume={run_dir}", *extra, f"results_db={db}"], cwd=cwd, fork=True)
    line = one_line_error(proc, needle)
    assert_unchanged(before, run_dir, db)
    # the refusal is a row of its own, in a new run dir, named on the console's one line
    refused = [r for r in rows(db).values() if r["run_id"] != str(run_dir.resolve()) and needle in (r["error"] or "")]
    assert refused and all(r["status"] == "failed" for r in refused)
    assert refused[-1]["run_id"] in line or any(r["run_id"] in line for r in refused)


def test_a_resume_with_an_override_it_never_had_is_refused_before_hydra_writes(interrupted):
    """An interrupted run with a checkpoint, resumed with a different override: refused, nothing touched."""
    stopped, cwd, db, run_dir = interrupted
    assert stopped.returncode == 143
    before = snapshot(run_dir, db)
    proc = run_cli([f"resume={run_dir}", "seed=7", f"results_db={db}"], cwd=cwd, fork=True)
    one_line_error(proc, "these overrides differ from it: seed=7")
    assert_unchanged(before, run_dir, db)
    assert not (run_dir / ".hydra" / "resume").exists()  # Hydra wrote its files into the refusal's new dir

    # a resume that is accepted but fails before its checkpoint is restored (here: a corrupt checkpoint file)
    # is recorded apart, under resume_attempts/, and the interrupted run stays resumable as it was
    for pt in (run_dir / "checkpoints").glob("*.pt"):
        pt.write_bytes(b"not a checkpoint")
    before = snapshot(run_dir, db)
    proc = run_cli([f"resume={run_dir}", f"results_db={db}"], cwd=cwd, fork=True)
    line = one_line_error(proc, "no readable checkpoint")
    assert_unchanged(before, run_dir, db, allow=(".hydra/resume/", "resume_attempts/", "run.log"))
    (attempt,) = [r for r in rows(db).values() if r.get("resume_of") == str(run_dir.resolve())]
    assert attempt["status"] == "failed" and attempt["run_id"] in line
    assert (Path(attempt["run_id"]) / "error.txt").is_file()


def _interrupted_run(cwd: Path, db: Path, run_dir: Path) -> subprocess.CompletedProcess:
    """A smoke run stopped by SIGTERM during training (it writes a checkpoint at the step boundary)."""
    args = [*SMOKE, "budget.max_steps=100000", "budget.train_seconds=120", f"results_db={db}"]
    proc = Forked(["-m", "run", *args, f"hydra.run.dir={run_dir}"], cwd)  # forked: its imports are done
    deadline = time.time() + 120
    while time.time() < deadline and not (run_dir / "metrics.jsonl").is_file():
        time.sleep(0.2)
    while time.time() < deadline and not (run_dir / "metrics.jsonl").read_text().strip():
        time.sleep(0.2)  # training has started: the signal lands in the loop
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A smoke run stopped by SIGTERM during training, with its console output: the two tests below share it. The
    test that resumes it leaves the run dir and its row as they were (it asserts so) and adds rows of its own, so
    what the other test reads holds in either order."""
    cwd = tmp_path_factory.mktemp("interrupted")
    db, run_dir = cwd / "r.sqlite", cwd / "run"
    return _interrupted_run(cwd, db, run_dir), cwd, db, run_dir


def test_sigterm_is_one_line_exit_143_and_an_interrupted_row(interrupted):
    proc, _, db, run_dir = interrupted
    line = one_line_error(proc, "interrupted: signal 15", code=143, trained=True)
    assert f"resume={run_dir}" in line  # the line says how to continue
    assert rows(db)[str(run_dir.resolve())]["status"] == "interrupted"


@pytest.mark.parametrize("kind", ["corrupt", "unwritable"])
def test_a_results_database_that_cannot_be_written_stops_the_run_with_its_path(tmp_path, kind):
    if kind == "corrupt":
        db = tmp_path / "r.sqlite"
        db.write_text("this is not a database")
    else:  # its directory cannot be made: a file stands where the directory should be
        (tmp_path / "afile").write_text("")
        db = tmp_path / "afile" / "r.sqlite"
    proc = run_cli([*SMOKE, f"results_db={db}"], cwd=tmp_path, fork=True)
    line = one_line_error(proc, str(db))
    assert "results_db=" in line  # the fix
    assert not list(tmp_path.glob("outputs/runs/*/*/metrics.jsonl"))  # the run did not start


# ---------------------------------------------------------------------------------------------------------
# a resume through the CLI: refused in a row of its own, or continuing the row of a run stopped from outside


def test_a_refused_resume_is_a_failed_row_and_exit_1(tmp_path):
    proc = run_cli(["resume=nowhere/run", f"results_db={tmp_path / 'r.sqlite'}"], cwd=tmp_path, fork=True)
    assert proc.returncode == 1 and "no such directory" in proc.stdout + proc.stderr
    ((status, error),) = sqlite3.connect(tmp_path / "r.sqlite").execute("SELECT status, error FROM runs")
    assert status == "failed" and "resume=nowhere/run" in error


def test_sigterm_from_outside_writes_a_checkpoint_and_resume_finishes_the_row(tmp_path, data_cache, monkeypatch):
    steps = 120  # the first part stops near step 13 (its first progress line); the resume trains the rest
    # one thread: on a shared machine, spinning OpenMP threads make each step many times slower (the forked runs
    # below read this process's environment)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # many short steps (one micro-batch each, ~60 a second here) and early progress lines: still training when the
    # signal comes
    args = [
        "debug=smoke",
        f"budget.max_steps={steps}",
        "budget.train_seconds=600",
        "budget.tokens_per_step=256",
        "logger.log_every_seconds=0.2",
        "eval.tokens=2048",
        "quant=off",
        f"data.cache_dir={data_cache}",
        "hydra.run.dir=outputs/cut",
    ]
    proc = Forked(["-m", "run", *args], tmp_path)  # forked from this process, which has its imports done
    seen, deadline = [], time.time() + 240
    try:
        for line in proc.stdout:
            seen.append(line)
            if "tok/s" in line or time.time() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(seen) + (out or "")
    assert proc.returncode != 0 and "checkpoint at step" in text, text[-3000:]
    run_dir = tmp_path / "outputs" / "cut"
    assert list((run_dir / "checkpoints").glob("step_*.pt"))
    con = sqlite3.connect(tmp_path / "outputs" / "results.sqlite")
    assert con.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
    # the first part's wall time, made long, so the resumed row's wall_seconds can only pass by adding it
    first = json.loads((run_dir / "result.json").read_text())
    assert first["wall_seconds"] > 0
    (run_dir / "result.json").write_text(json.dumps({**first, "wall_seconds": 1000.0}))
    t0 = time.time()
    done = run_cli(["resume=outputs/cut"], cwd=tmp_path, timeout=300, fork=True)
    elapsed = time.time() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert con.execute("SELECT run_id, status, steps FROM runs").fetchall() == [(str(run_dir.resolve()), "ok", steps)]
    (wall,) = con.execute("SELECT wall_seconds FROM runs").fetchone()
    assert 1000.0 < wall < 1000.0 + elapsed  # both parts: the report's overhead_s (wall - train) stays >= 0
    assert json.loads((run_dir / "result.json").read_text())["wall_seconds"] == wall
    assert (run_dir / ".hydra" / "resume" / "overrides.yaml").exists() and "resume" not in (
        run_dir / ".hydra" / "overrides.yaml"
    ).read_text()
