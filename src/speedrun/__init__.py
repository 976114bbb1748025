"""speedrun: declarative experiment orchestration for small GPT training runs.

The package imports nothing heavy at import time; ``main`` pulls in torch and the rest when a run starts.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def main(cfg: Any) -> dict[str, Any]:
    """Run one job from a composed Hydra config; returns the result record (also written to disk).

    A user error (speedrun.errors.ConfigError: a bad value, an impossible combination, missing or corrupt data, a
    kernel that cannot load, a results database that cannot be written) ends the process with one line naming the
    problem, the fix and the row that records it, and exit status 1; its traceback is in the run dir's error.txt.
    Running out of GPU memory ends the same way with status oom (speedrun.run.oom). Ctrl-C and SIGTERM end with one
    line and the shell's status for the signal (130, 143); the row says interrupted. Anything else is a bug and
    keeps its traceback."""
    import logging
    import signal
    import sys

    from speedrun.errors import ConfigError, RunOutOfMemory
    from speedrun.run.runner import run_job

    log = logging.getLogger("speedrun")
    try:
        return run_job(cfg)
    except (ConfigError, RunOutOfMemory) as e:
        log.error("error: %s%s", e, _where_recorded(e))
        sys.exit(1)
    except KeyboardInterrupt as e:
        signum = signal.SIGTERM if f"signal {int(signal.SIGTERM)}" in str(e) else signal.SIGINT
        log.error("interrupted: %s%s", str(e) or "Ctrl-C", _where_recorded(e))
        sys.exit(128 + int(signum))


def _where_recorded(e: BaseException) -> str:
    job = getattr(e, "speedrun_job", None)
    return f" [{job.record_note()}]" if job is not None else ""
