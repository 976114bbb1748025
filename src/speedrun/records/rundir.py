"""Reading a run dir as data: no file in it is opened through a symlink, for reading, appending, locking or copying.

A run dir may come from another machine or person. A symlink planted in it (``run.log -> ~/.ssh/id_ed25519``,
``.owner.lock -> ~/important``) would make a resume truncate or append to its target, or an export publish it, so
every open here uses ``O_NOFOLLOW`` and takes regular files only, and ``symlinks_in`` lets a command refuse such a
dir before it writes anything. Writes go through speedrun.records.atomic, whose rename replaces a link itself.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

LOOKED_AT = (".", ".hydra", "checkpoints")
"""The folders of a run dir that speedrun reads or writes (``.hydra/resume/`` and older invocations' subfolders of
.hydra included, one level down)."""


class NotRegularFile(OSError):
    """A run-dir path that is a symlink, a folder or a device where speedrun expects a file of its own."""


def open_regular(path: Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A descriptor of ``path`` opened with ``flags`` and never through a symlink (ELOOP is reported as
    NotRegularFile naming the path); anything but a regular file is refused too."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | os.O_NONBLOCK, mode)  # O_NONBLOCK: a planted FIFO must not hang us
    except OSError as e:
        if os.path.islink(path):
            raise NotRegularFile(
                e.errno, f"{path} is a symlink; speedrun never opens a run dir's file through one"
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFile(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_bytes(path: Path) -> bytes:
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read()


def read_text(path: Path) -> str:
    return read_bytes(path).decode("utf-8")


def is_regular(path: Path) -> bool:
    """``path`` is a regular file itself (not a symlink to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def symlinks_in(run_dir: Path) -> list[Path]:
    """The symlinks among a run dir's entries (LOOKED_AT folders, and their subfolders one level down), sorted."""
    found: list[Path] = []
    for sub in LOOKED_AT:
        folder = Path(run_dir) / sub
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink():
                found.append(Path(entry.path))
            elif sub == ".hydra" and entry.is_dir(follow_symlinks=False):
                found.extend(Path(e.path) for e in os.scandir(entry.path) if e.is_symlink())
    return sorted(found)


def symlink_problem(run_dir: Path) -> str | None:
    """One line naming the symlinks in a run dir and the fix, or None when it holds none."""
    links = symlinks_in(run_dir)
    if not links:
        return None
    shown = ", ".join(f"{p.relative_to(run_dir)} -> {os.readlink(p)}" for p in links[:3])
    more = f" and {len(links) - 3} more" if len(links) > 3 else ""
    return (
        f"{run_dir} holds symlinks ({shown}{more}), which speedrun never follows out of a run dir; replace them "
        "with the files themselves, or use another run dir"
    )
