"""Ctrl-C twice on a real sweep (`python -m run -m` on CPU): the second kills the running job, and the sweep still
ends with sweep.json and the summary true to each job, one line on the console and exit status 130."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# One training step (the long job: steps until it is stopped), a short evaluation and no export: job 0 ends ok
# within seconds, then job 1 runs until the Ctrl-Cs
QUICK = [
    "hardware=cpu",
    "model=tiny",
    "hardware.micro_batch=4",
    "budget.tokens_per_step=2048",
    "budget.warmup_steps=0",
    "budget.train_seconds=300",
    "eval.tokens=2048",
    "quant=off",
    "logger.log_every_seconds=0.5",
]
# job order: the first axis outer, so job 0 (one step) ends ok, job 1 (1e6 steps) runs, jobs 2 and 3 never start
AXES = ["optim.matrix_lr=0.04,0.02", "budget.max_steps=1,1000000"]


def _statuses(db: Path) -> list[str]:
    try:
        con = sqlite3.connect(db, timeout=1)
        try:
            return [r[0] for r in con.execute("SELECT status FROM runs ORDER BY started_at")]
        finally:
            con.close()
    except sqlite3.Error:  # not created yet, or busy: asked again
        return []


def test_a_second_ctrl_c_kills_the_running_job_and_the_sweep_still_says_what_each_job_did(tmp_path, data_cache):
    # its own process group, as a terminal's foreground job: Ctrl-C is SIGINT to the group, the jobs included
    proc = subprocess.Popen(
        [sys.executable, "-m", "run", "-m", *QUICK, f"data.cache_dir={data_cache}", *AXES],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        db = tmp_path / "outputs" / "results.sqlite"
        deadline = time.time() + 120
        while _statuses(db) != ["ok", "running"]:  # job 0 done, job 1 started
            assert proc.poll() is None and time.time() < deadline, "".join(lines)[-3000:]
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        while not any("interrupted: stopping 1 running job(s)" in line for line in lines):
            assert time.time() < deadline, "".join(lines)[-3000:]
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # while the sweep waits for job 1 to stop
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=10)
    out = "".join(lines)

    assert rc == 130, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    (sweep,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    assert out.splitlines()[-1] == (
        f"sweep interrupted (Ctrl-C twice): 1 ok, 1 interrupted, 2 not run; what each job did: "
        f"{sweep / 'summary.md'}; the same command with hydra.sweeper.resume=true runs the rest"
    )
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert manifest["stopped"] == "interrupted" and manifest["finished_at"]
    assert [(j["state"], j["status"]) for j in manifest["jobs"]] == [
        ("launched", "ok"),
        ("launched", "interrupted"),
        ("not_run", "not_run"),
        ("not_run", "not_run"),
    ]
    assert _statuses(db) == ["ok", "interrupted"]  # job 1's row says so, whether it or the launcher wrote it
    summary = (sweep / "summary.md").read_text()
    assert "failures: 1, not run: 2" in summary and "| interrupted |" in summary
    assert (sweep / "summary.csv").read_text().count("\n") == 5  # a header and the 4 combinations
    assert not (sweep / "2").exists() and not (sweep / "3").exists()
