"""`python -m run` in a subprocess: one run (run_cli), and a run that the whole pytest session shares (shared_cli_run,
which conftest's default_smoke_run fixture runs once)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

SWEEP_TINY = [
    "hardware=cpu",
    "model=tiny",
    "hardware.micro_batch=4",
    "budget.tokens_per_step=2048",
    "eval.tokens=2048",
    "logger.log_every_seconds=0.5",
    "budget.train_seconds=2",
    "budget.max_steps=4",
    "budget.warmup_steps=0",
]
"""A sweep's job as a tiny CPU run of 4 steps (or 2 s, whichever ends first), no warm-up step and a shorter eval:
every job is a real run, just short (a 2 s budget alone ran ~10 steps a job, which no assertion needs)."""


def run_cli(args, cwd, timeout=300, env_extra=None):
    """Run `python -m run ...` in a subprocess (the real entry point) and return the CompletedProcess."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "run", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def session_dir(tmp_path_factory) -> Path:
    """A directory of this pytest session that every xdist worker sees: pytest-N/, above each worker's own
    pytest-N/popen-gwK/ (without xdist, the pytest session's base temp dir)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@dataclasses.dataclass(frozen=True)
class SharedRun:
    """A finished `python -m run` that several tests read: its console (proc), working dir, run dir and database."""

    proc: subprocess.CompletedProcess
    cwd: Path
    run_dir: Path
    db: Path


def shared_cli_run(tmp_path_factory, name: str, args: list[str], timeout: int = 300) -> SharedRun:
    """Run `python -m run <args>` once per pytest session, whichever test or xdist worker asks first (the others wait
    on a lock, then read the same run), with hydra.run.dir and results_db in a directory of its own. For tests that
    only read what the run left: one that writes to its run dir or database gets a run of its own instead. The
    outcome is kept whatever it was; each test asserts on it (proc.returncode first)."""
    import fcntl
    import json

    cwd = session_dir(tmp_path_factory) / f"shared-run-{name}"
    run_dir, db, record = cwd / "run", cwd / "r.sqlite", cwd / "console.json"
    with open(session_dir(tmp_path_factory) / f".shared-run-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            cwd.mkdir(exist_ok=True)
            proc = run_cli([*args, f"hydra.run.dir={run_dir}", f"results_db={db}"], cwd=cwd, timeout=timeout)
            record.write_text(
                json.dumps({"args": proc.args, "rc": proc.returncode, "out": proc.stdout, "err": proc.stderr})
            )
    saved = json.loads(record.read_text())
    proc = subprocess.CompletedProcess(saved["args"], saved["rc"], saved["out"], saved["err"])
    return SharedRun(proc, cwd, run_dir, db)
