"""Where a dataset is built: a temporary sibling ``.<name>.tmp-<pid>-<id>`` of its directory, renamed into place
when complete (speedrun.data.prepare's builds), so that a failed or killed build never leaves half a dataset.

A build holds an exclusive lock (flock) on its temporary directory while it runs. A build that dies without
cleaning up (SIGKILL, a lost machine) loses that lock with its process, and the next build of the same directory
removes its leftovers: a directory nobody holds the lock of. One younger than DEAD_BUILD_GRACE_S is left alone, since
its build may be between creating it and locking it. Without fcntl (Windows) nothing is locked or removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

DEAD_BUILD_GRACE_S = 60.0
"""A build's temporary directory younger than this is never removed as dead."""

T = TypeVar("T")


def _log(msg: str) -> None:
    print(f"[speedrun.data] {msg}", file=sys.stderr, flush=True)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def build_in_temp(out_dir: Path, overwrite: bool, build: Callable[[Path], T]) -> T:
    """``build`` into a temporary sibling of ``out_dir``, renamed into place once complete and removed if the build
    fails or is interrupted; dead builds' leftovers of ``out_dir`` are removed first."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_builds(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    alive = _hold_lock(tmp)  # released by the kernel however this process ends
    try:
        written = build(tmp)
        _install(tmp, out_dir, overwrite)
    except BaseException:
        remove_tree(tmp)
        raise
    finally:
        if alive is not None:
            os.close(alive)
    return written


def _hold_lock(tmp: Path) -> int | None:
    """An exclusive lock on the build directory ``tmp`` (its open descriptor), held while the build runs."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(tmp, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def remove_dead_builds(out_dir: Path) -> None:
    """Remove the ``.<name>.tmp-*`` directories of builds of ``out_dir`` that were killed: those old enough that
    nobody holds the lock of."""
    try:
        import fcntl
    except ImportError:
        return
    for tmp in out_dir.parent.glob(f".{out_dir.name}.tmp-*"):
        try:
            if not tmp.is_dir() or time.time() - tmp.stat().st_mtime < DEAD_BUILD_GRACE_S:
                continue
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            continue  # a live build holds it
        finally:
            os.close(fd)
        _log(f"removing {tmp}: left by a build that was killed")
        remove_tree(tmp)


def _install(tmp: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished ``tmp`` to ``out_dir``; with overwrite, swap out an existing one."""
    old = None
    if out_dir.exists() and overwrite:
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except OSError as e:
        if out_dir.exists():
            raise FileExistsError(f"{out_dir} appeared while building (another process?)") from e
        raise
    finally:
        if old is not None:
            remove_tree(old)


@contextlib.contextmanager
def exclusive_lock(path: Path):
    """Hold an exclusive fcntl lock on ``path`` (no-op where fcntl does not exist)."""
    try:
        import fcntl
    except ImportError:  # Windows: fall back to the atomic rename alone
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
