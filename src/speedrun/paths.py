"""Where things live: the repository root, the conf/ tree, the results database and the cache.

One home for each path, so the runner, the sweep launcher, the sweeper and the report agree on them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository the speedrun package runs from (it is installed editable, beside conf/)."""

CONF_DIR = REPO_ROOT / "conf"
"""The conf/ tree at the repository root."""

DEFAULT_RESULTS_DB = "outputs/results.sqlite"

CACHE_DIR = Path("~/.cache/speedrun")
"""What speedrun can rebuild but keeps between runs: the embedded dataset (data.cache_dir's default) and the
minified source of the self-extracting file (speedrun.artifact.minify). Unexpanded, as data.cache_dir is."""


def results_db_path(value: Any | None = None, cwd: Path | None = None) -> Path:
    """The results database a config's ``results_db`` names: ``~`` expanded, a relative path taken from ``cwd``
    (the directory `python -m run` was started in; Hydra does not change it, hydra.job.chdir is false)."""
    path = Path(str(value if value is not None else DEFAULT_RESULTS_DB)).expanduser()
    return path if path.is_absolute() else (cwd or Path.cwd()) / path
