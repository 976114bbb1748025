"""Every file speedrun writes whole goes through ``atomic_write``: a temporary sibling, fsync, rename, fsync of the
folder. A reader (or a run killed at any moment, or a machine that loses power) sees the previous complete file or
the new complete one, never half of one.

The temporary name is ``.<name>.<pid>.speedrun-tmp`` (``temp_name``), and it is the only name speedrun ever deletes
on its own: ``remove_orphan_temps`` removes the ones killed writers left and nothing else, so a user's own
``.notes.tmp`` in a folder speedrun writes to is never touched. The temporary file is opened with ``O_NOFOLLOW``, so
a symlink planted at that name is refused rather than written through; the rename then replaces ``path`` itself,
never the file a symlink at ``path`` pointed to.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

TEMP_SUFFIX = ".speedrun-tmp"
_TEMP = re.compile(r"^\..+\.\d+" + re.escape(TEMP_SUFFIX) + "$")


def temp_name(path: Path) -> Path:
    """The temporary name ``path`` is written under before its rename: hidden, naming the writing process, and
    ending in TEMP_SUFFIX, so that a later owner of the folder can tell it is an orphan (remove_orphan_temps)."""
    return path.with_name(f".{path.name}.{os.getpid()}{TEMP_SUFFIX}")


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one temp_name makes (and so one remove_orphan_temps may delete)."""
    return bool(_TEMP.match(name))


def atomic_write(
    path: Path,
    data: bytes | str | Callable[[IO[bytes]], Any],
    check: Callable[[Path], None] | None = None,
) -> None:
    """Write ``path`` whole: ``data`` (bytes, text as UTF-8, or a function writing to the open binary file) into
    temp_name(path), flushed to disk, ``check``-ed (given the temporary path; raise to keep the old file), renamed
    into place. Nothing is left behind when any of it fails (a full disk, a check that raised, Ctrl-C)."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())  # a node that loses power must not keep a rename pointing at unwritten bytes
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(tmp).st_mode):
                tmp.unlink()
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, text)


def _fsync_dir(directory: Path) -> None:
    """The rename itself survives a power loss once its folder is synced (best effort: some filesystems refuse)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_orphan_temps(directory: Path) -> list[Path]:
    """Delete the temporary files (temp_name) that killed writers left in ``directory``, and only those: regular
    files whose name temp_name makes (a symlink or a folder of that name is left alone). The caller owns the folder
    (speedrun.records.lock), so no live writer is using them. Returns what was removed."""
    removed: list[Path] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        path = Path(directory) / name
        if not is_temp_name(name):
            continue
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed
