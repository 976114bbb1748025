"""Before Hydra writes anything: the place a run's files go must take them.

Hydra creates the run dir before speedrun's code runs, and reports a failure there as a traceback; a directory
that cannot be written (read-only, full, another user's) is the machine's state, not a bug, so it gets one line.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from speedrun.errors import storage_problem

DEFAULT_ROOT = "outputs"
"""Where conf/config.yaml puts run and sweep dirs unless hydra.run.dir / hydra.sweep.dir say otherwise."""


def output_root(argv: list[str]) -> Path:
    """The directory this command's run or sweep dir goes under: the parent of hydra.run.dir / hydra.sweep.dir
    when given, else outputs/ (both relative to the current directory)."""
    key = "hydra.sweep.dir=" if any(a in ("-m", "--multirun") for a in argv) else "hydra.run.dir="
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith(key)]
    return Path(given[-1]).expanduser().parent if given else Path(DEFAULT_ROOT)


def unwritable(argv: list[str]) -> str | None:
    """None when a directory can be made under the output root (made itself if missing), else the one line that
    says why not."""
    root = output_root(argv)
    try:
        root.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".speedrun-write-check-", dir=root))
    except OSError as e:
        return storage_problem(e) or f"cannot create the run's dir under {root}: {e}"
    return None
