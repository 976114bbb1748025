"""hydra/launcher=slurm: hydra-submitit-launcher's SLURM launcher, with a ``checkpoint`` that resumes.

submitit's checkpointing protocol: when SLURM signals a job that it is preempted or about to time out (SIGUSR2,
``--signal=USR2@<delay>``), submitit calls ``checkpoint`` on the submitted callable (the launcher, here) for a
DelayedSubmission to requeue, requeues the job and exits. The stock launcher requeues the same call, so the job
would start over. Ours adds ``resume=<run dir>`` when the job's run dir holds a checkpoint, so the requeued job
continues it (speedrun.run.resume) and completes the same results row. The training loop (speedrun.run.preempt) defers
the signal to the end of the current step, writes that checkpoint, and only then lets submitit's handler run.

Imported by Hydra's plugin scan on every start: nothing heavy at import, and nothing at all without the extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from speedrun.run.checkpoint import list_checkpoints

try:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _submitit
except ImportError:  # the `slurm` extra is not installed: no SLURM launcher to extend
    _submitit = None


def requeue_overrides(overrides: Sequence[str], run_dir: Path | None) -> list[str]:
    """The job's overrides for its requeued run: plus ``resume=<run dir>`` when that dir holds a checkpoint."""
    kept = [o for o in overrides if not o.startswith("resume=")]
    if run_dir is not None and list_checkpoints(run_dir):
        return [*kept, f"resume={Path(run_dir).resolve()}"]
    return list(overrides)


def current_run_dir() -> Path | None:
    """The run dir of the job running in this process (Hydra's output dir), or None outside a job."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # HydraConfig not set
        return None


if _submitit is not None:

    class SpeedrunSlurmLauncher(_submitit.SlurmLauncher):
        def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
            import submitit

            sweep_overrides, *rest = args
            return submitit.helpers.DelayedSubmission(
                self, requeue_overrides(sweep_overrides, current_run_dir()), *rest, **kwargs
            )
