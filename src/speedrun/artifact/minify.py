"""Minified source for the self-extracting file (speedrun.artifact.wrap), cached on disk.

python-minifier takes seconds for speedrun's ~90 files. Its output depends only
on the source, the minifier's version, the options below and the Python that parses it, so each file's output is
kept under <cache>/minified/, named by a hash of all four: a later run (and the test suite) reads it back in
milliseconds. A cache that cannot be written is skipped, never an error.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from speedrun.config.code_rule import MINIFIER_REQUIREMENT
from speedrun.paths import CACHE_DIR

OPTIONS: dict[str, Any] = {"remove_literal_statements": True}
"""python-minifier's defaults plus dropping docstrings (nothing on the run's path reads ``__doc__``). Its defaults
shorten local names, drop the annotations of arguments, returns and variables, hoist repeated literals and fold
constants. Class attribute annotations stay (its default): the config dataclasses need them. Module-level names are
never renamed (its default): modules import each other's names, and renaming the rest measured no smaller once
compressed."""


@functools.lru_cache(maxsize=1)
def minifier_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("python-minifier")
    except PackageNotFoundError:
        raise RuntimeError(
            f"the wrapped code rule needs python-minifier: pip install '{MINIFIER_REQUIREMENT}' "
            "(or count the source raw with artifact.code_rule=raw)"
        ) from None


def cache_dir() -> Path:
    return CACHE_DIR.expanduser() / "minified"


def minify_files(files: dict[str, str]) -> dict[str, str]:
    """{path: text} -> {path: minified source} for the .py files, other files as they are, in the same order."""
    return {path: minify(text, path) if path.endswith(".py") else text for path, text in files.items()}


def minify(source: str, path: str, extra: dict[str, Any] | None = None) -> str:
    """One file minified (OPTIONS, and ``extra`` on top), from the cache when this source was minified before by
    this minifier and Python with the same options."""
    options = {**OPTIONS, **(extra or {})}
    cached = cache_dir() / f"{_key(source, options)}.py"
    try:
        return cached.read_text(encoding="utf-8")
    except OSError:
        pass
    import python_minifier

    out = python_minifier.minify(source, filename=path, **options)
    try:  # the minifier checks its own output; a file that does not compile must never be shipped all the same
        compile(out, path, "exec")
    except SyntaxError as e:
        raise RuntimeError(
            f"python-minifier {minifier_version()} made {path} into code that does not compile ({e}); "
            "count the code with artifact.code_rule=raw, or pin another python-minifier"
        ) from e
    _store(cached, out)
    return out


def _key(source: str, options: dict[str, Any]) -> str:
    spec = json.dumps([minifier_version(), options, sys.version_info[:2]], sort_keys=True)
    return hashlib.sha256(spec.encode() + b"\0" + source.encode("utf-8")).hexdigest()


def _store(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)  # concurrent writers (a sweep's jobs) write the same text: the last rename wins
    except OSError:
        pass
