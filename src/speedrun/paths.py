"""Where things live: the code and its conf/ tree (in a checkout or an installed wheel), the results database and the
cache.

One home for each path, so the runner, the sweep launcher, the sweeper and the report agree on them. speedrun runs
from one of two layouts, and every reader of a config or a source file goes through the names below:

- a checkout (an editable install, PYTHONPATH=src, or the tree a self-extracting train_gpt.py unpacks): the
  repository's src/speedrun beside its conf/;
- an installed wheel: site-packages/speedrun with the conf/ tree inside it (speedrun/conf, mapped from the
  repository's conf/ by pyproject.toml's package-dir), run.py and hydra_plugins/ beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
"""The speedrun package's directory: src/speedrun in a checkout, site-packages/speedrun when installed."""


def _repo_root() -> Path | None:
    src = PACKAGE_DIR.parent
    return src.parent if src.name == "src" and (src.parent / "conf").is_dir() else None


REPO_ROOT: Path | None = _repo_root()
"""The repository speedrun runs from (src/ beside conf/), or None when it runs from an installed wheel."""

CONF_DIR: Path = REPO_ROOT / "conf" if REPO_ROOT is not None else PACKAGE_DIR / "conf"
"""The conf/ tree Hydra composes from and the resolver reads: the repository's conf/, or the wheel's speedrun/conf.
A file path in both layouts (a wheel is unpacked on disk), so Hydra, OmegaConf.load and the tuner all take it."""

INSTALLED_CODE = ("speedrun", "hydra_plugins/speedrun_plugins")
"""An installed wheel's code folders in site-packages; each is src/<folder> in the repository (but speedrun/conf,
which is conf/), so the installed code is named as a checkout names it."""

DEFAULT_RESULTS_DB = "outputs/results.sqlite"

CACHE_DIR = Path("~/.cache/speedrun")
"""What speedrun can rebuild but keeps between runs: the embedded dataset (data.cache_dir's default) and the
minified source of the self-extracting file (speedrun.artifact.minify). Unexpanded, as data.cache_dir is."""


def source_path(rel: str) -> Path:
    """The file at ``rel``, a path in the repository (``src/speedrun/plan/budget.py``, ``src/run.py``,
    ``conf/model/tiny.yaml``), where this layout keeps it."""
    top, _, rest = rel.partition("/")
    if top not in ("src", "conf") or not rest:
        raise ValueError(f"{rel!r} is no path under src/ or conf/ of the repository")
    if REPO_ROOT is not None:
        return REPO_ROOT / rel
    return CONF_DIR / rest if top == "conf" else PACKAGE_DIR.parent / rest


def installed_code() -> dict[str, Path]:
    """{path in the repository: file} for every file of an installed wheel's code: speedrun (its conf/ tree and
    package data included), the Hydra plugins and run.py; byte-code caches left out. Empty in a checkout."""
    if REPO_ROOT is not None:
        return {}
    site = PACKAGE_DIR.parent
    found = {"src/run.py": site / "run.py"} if (site / "run.py").is_file() else {}
    for folder in INSTALLED_CODE:
        for path in (site / folder).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            rel = path.relative_to(site).as_posix()
            found[rel.removeprefix("speedrun/") if rel.startswith("speedrun/conf/") else f"src/{rel}"] = path
    return found


def results_db_path(value: Any | None = None, cwd: Path | None = None) -> Path:
    """The results database a config's ``results_db`` names: ``~`` expanded, a relative path taken from ``cwd``
    (the directory `python -m run` was started in; Hydra does not change it, hydra.job.chdir is false)."""
    path = Path(str(value if value is not None else DEFAULT_RESULTS_DB)).expanduser()
    return path if path.is_absolute() else (cwd or Path.cwd()) / path
