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


OWN_NAMES = frozenset(
    {
        ".hydra",
        ".owner.lock",
        "run.log",
        "console.log",
        "env.json",
        "plan.json",
        "metrics.jsonl",
        "checkpoints",
        "error.txt",
        "refused_attempts",
        "resume_attempts",
    }
)
"""What a run dir may hold before its first result.json: Hydra's files, the pool launcher's console.log, the lock and
what a run writes while it sets up. A folder holding anything else and no result.json is not a speedrun run dir."""


def read_status(run_dir: Path) -> str | None:
    """The status a run dir's result.json records (read without following a symlink), or None."""
    import json

    try:
        result = json.loads(read_text(Path(run_dir) / "result.json"))
    except (OSError, ValueError):
        return None
    status = result.get("status") if isinstance(result, dict) else None
    return status if isinstance(status, str) else None


def new_run_refusal(run_dir: Path) -> str | None:
    """Why a new run must not start in ``run_dir`` (one line naming the fix), from the dir alone, or None: it holds
    a symlink, a finished run (never written again), or other files and no speedrun record. Hydra's resolvers ask
    it before writing .hydra/ or run.log there (speedrun.run.resume), the runner again before the run opens."""
    from speedrun.records.atomic import is_temp_name
    from speedrun.records.store import ENDED

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    links = symlink_problem(run_dir)
    if links is not None:
        return links
    status = read_status(run_dir)
    if status in ENDED:
        return (
            f"{run_dir} holds a finished run (status {status}), which is never written again; give this run another "
            f"dir (hydra.run.dir=...), and export that one with `python -m speedrun.export {run_dir}` if it is a "
            "result"
        )
    if status is None:
        foreign = sorted(n for n in os.listdir(run_dir) if n not in OWN_NAMES and not is_temp_name(n))
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            return (
                f"{run_dir} is not a speedrun run dir and is not empty (it holds {shown}); give hydra.run.dir= a new "
                "or empty folder"
            )
    return None
