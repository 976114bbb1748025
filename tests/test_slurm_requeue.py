"""A forced requeue through hydra/launcher=slurm_local with two tasks, end to end (a file of its own: it waits for
submitit's timeout signal, so pytest-xdist runs it beside test_dist_cli.py rather than after it)."""

from __future__ import annotations

import pytest

from conftest import run_cli
from test_dist_cli import SMOKE, rows, run_dirs

pytestmark = pytest.mark.slow


def test_the_slurm_path_requeues_two_tasks_and_continues_the_row(tmp_path, data_cache):
    """A forced requeue, end to end: submitit's local executor sends its timeout signal (SIGUSR2) to both tasks 30 s
    before hydra.launcher.timeout_min=1 runs out, mid-training (30 s of training budget, with the start-up before
    it). Both ranks stop at the same step with one checkpoint; global rank 0's submitit handler requeues; the task
    ends with the local executor's requeue status, so the executor starts the job again, which finds the
    checkpoint in its run dir and trains the rest. One row, ok, resumed_from_step its checkpoint's step."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    timed = ["hydra.launcher.timeout_min=1", "budget.max_steps=1000000", "budget.train_seconds=30"]
    args = ["-m", "hydra/launcher=slurm_local", "dist.nproc=2", *SMOKE, *timed, f"data.cache_dir={data_cache}"]
    proc = run_cli(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = rows(tmp_path)
    assert row["status"] == "ok" and row["world_size"] == 2 and row["resumed_from_step"] > 0, row
    (run_dir,) = run_dirs(tmp_path)
    log = (run_dir / "run.log").read_text()
    stopped = f"checkpoints/step_{row['resumed_from_step']:08d}.pt; job requeued"
    assert stopped in log and f"resumed from {run_dir}" in log and log.count("Caught signal SIGUSR2") == 1
