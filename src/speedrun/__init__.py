"""speedrun: declarative experiment orchestration for small GPT training runs.

The package imports nothing heavy at import time; ``main`` pulls in torch and the rest when a run starts.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def main(cfg: Any) -> dict[str, Any]:
    """Run one job from a composed Hydra config; returns the result record (also written to disk).

    A user error (speedrun.errors.ConfigError: a bad value, an impossible combination, missing or corrupt data, a
    kernel that cannot load) ends the process with one message naming the problem and the fix and exit status 1;
    its traceback is in the run dir's error.txt and the results row says failed. Running out of GPU memory ends the
    same way with status oom (speedrun.oom). Anything else is a bug and keeps its traceback."""
    import logging
    import sys

    from .errors import ConfigError, RunOutOfMemory
    from .runner import run_job

    try:
        return run_job(cfg)
    except (ConfigError, RunOutOfMemory) as e:
        logging.getLogger("speedrun").error("error: %s", e)
        sys.exit(1)
