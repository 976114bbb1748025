"""A forced requeue through hydra/launcher=slurm_local with two tasks, end to end (a file of its own: it waits for
submitit's timeout signal, so pytest-xdist runs it beside test_dist_cli.py rather than after it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import run_cli
from test_dist_cli import SMOKE, rows, run_dirs

pytestmark = pytest.mark.slow

# The timeout signal comes this long before the job's minute is up, i.e. 20 s after the job starts (submitit's local
# default, 30 s, made the test wait 30 s for it): the ranks' start-up (~7 s; slower on a loaded machine) is over by
# then, and the 20 s training budget is not.
SIGNAL_DELAY_S = 40


def _signal_delay(tmp_path: Path) -> dict[str, str]:
    """Environment that makes the sweep's local executor signal its job SIGNAL_DELAY_S before the timeout: a
    sitecustomize on PYTHONPATH sets the delay that submitit's LocalExecutor passes to its job controller (the
    hydra launcher config has no key for it); the controller then signals and requeues as it always does."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import submitit.local.local as local\n"
        "start = local.start_controller\n"
        f"local.start_controller = lambda *a, **k: start(*a, **{{**k, 'signal_delay_s': {SIGNAL_DELAY_S}}})\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")])}


def test_the_slurm_path_requeues_two_tasks_and_continues_the_row(tmp_path, data_cache):
    """A forced requeue, end to end: submitit's local executor sends its timeout signal (SIGUSR2) to both tasks
    SIGNAL_DELAY_S before hydra.launcher.timeout_min=1 runs out, mid-training (20 s of training budget, with the
    start-up before it). Both ranks stop at the same step with one checkpoint; global rank 0's submitit handler
    requeues; the task ends with the local executor's requeue status, so the executor starts the job again, which
    finds the checkpoint in its run dir and trains the rest. One row, ok, resumed_from_step its checkpoint's step."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    timed = ["hydra.launcher.timeout_min=1", "budget.max_steps=1000000", "budget.train_seconds=20"]
    args = ["-m", "hydra/launcher=slurm_local", "dist.nproc=2", *SMOKE, *timed, f"data.cache_dir={data_cache}"]
    proc = run_cli(args, cwd=tmp_path, env_extra=_signal_delay(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = rows(tmp_path)
    assert row["status"] == "ok" and row["world_size"] == 2 and row["resumed_from_step"] > 0, row
    (run_dir,) = run_dirs(tmp_path)
    log = (run_dir / "run.log").read_text()
    stopped = f"checkpoints/step_{row['resumed_from_step']:08d}.pt; job requeued"
    assert stopped in log and f"resumed from {run_dir}" in log and log.count("Caught signal SIGUSR2") == 1
