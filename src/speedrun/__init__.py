"""speedrun: declarative experiment orchestration for small GPT training runs.

The package imports nothing heavy at import time; ``main`` pulls in torch and the rest when a run starts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from speedrun.errors import ConfigError, RunOutOfMemory, storage_problem
from speedrun.version import __version__ as __version__


def main(cfg: Any, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Run one job from a composed Hydra config; returns the result record (also written to disk).

    ``run_dir``: run the job there with no Hydra context (no command-line overrides, no sweep; the console and
    run.log set up as conf/config.yaml's hydra.job_logging does), for a config that was composed earlier. Unset:
    Hydra's run dir and overrides, as `python -m run`.

    A user error (speedrun.errors.ConfigError: a bad value, an impossible combination, missing or corrupt data, a
    kernel that cannot load, a results database that cannot be written) ends the process with one line naming the
    problem, the fix and the row that records it, and exit status 1; its traceback is in the run dir's error.txt.
    Running out of GPU memory ends the same way with status oom (speedrun.run.oom). Ctrl-C and SIGTERM end with one
    line and the shell's status for the signal (130, 143); the row says interrupted. Anything else is a bug and
    keeps its traceback."""
    import contextlib
    import logging
    import signal

    # here, not at the top: they import torch and the whole pipeline, and `import speedrun` stays light
    from speedrun.run.job_record import RunContext
    from speedrun.run.runner import RecordNotWritten, run_job, standalone_logging

    log = logging.getLogger("speedrun")
    # a log file on a full disk must not print a traceback per line: the run's own error says what failed
    logging.raiseExceptions = False
    ctx = None if run_dir is None else RunContext.standalone(Path(run_dir))
    with contextlib.nullcontext() if ctx is None else standalone_logging(ctx.run_dir):
        try:
            return run_job(cfg) if ctx is None else run_job(cfg, ctx)  # the Hydra path calls exactly as before
        except _user_errors(RecordNotWritten) as e:  # RanksFailed names the rank
            log.error("error: %s%s", e, _where_recorded(e))
            sys.exit(1)
        except Exception as e:  # noqa: BLE001 - anything else is re-raised with its traceback
            problem = storage_problem(e)  # a full, read-only or foreign disk: the machine's state, not a bug
            if problem is None:
                raise
            log.error("error: %s%s", problem, _where_recorded(e))
            sys.exit(1)
        except KeyboardInterrupt as e:
            signum = signal.SIGTERM if f"signal {int(signal.SIGTERM)}" in str(e) else signal.SIGINT
            log.error("interrupted: %s%s", str(e) or "Ctrl-C", _where_recorded(e))
            requeued = getattr(e, "exit_code", None)  # training.preempt.Preempted: submitit's requeue status
            sys.exit(requeued if requeued is not None else 128 + int(signum))


def _user_errors(*more: type[BaseException]) -> tuple[type[BaseException], ...]:
    """The errors that end a run with one line: ranks that failed (speedrun.distributed.launch.RanksFailed) only
    where this process launched ranks, so a run that launches none never imports the launcher."""
    launch = sys.modules.get("speedrun.distributed.launch")
    ranks = (launch.RanksFailed,) if launch is not None else ()
    return (ConfigError, RunOutOfMemory, *more, *ranks)


def _where_recorded(e: BaseException) -> str:
    note = getattr(e, "speedrun_record", None)  # speedrun.run.runner: where the row went, once it was final
    return f" [{note}]" if note else ""
