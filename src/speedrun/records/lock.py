"""One owner per run dir: a lock file naming the process that writes the dir.

``<run dir>/.owner.lock`` holds an exclusive ``flock`` for as long as its owner lives, and names it (host, pid,
since) so that a refusal can say who. The kernel drops the flock when the owner dies, however it dies, so a lock
left by a killed process on this host is free and is taken over with a warning. A lock file written on another
host (a shared filesystem, where flock may not reach across machines) is taken over only once its heartbeat (the
file's mtime, touched by the owner's heartbeat, speedrun.run.heartbeat) is older than LOST_AFTER_SECONDS.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from speedrun.errors import ConfigError
from speedrun.records.rundir import NotRegularFile, open_regular
from speedrun.records.store import LOST_AFTER_SECONDS

LOCK_NAME = ".owner.lock"


class RunDirBusy(ConfigError):
    """Another live process owns the run dir."""


class RunDirLock:
    def __init__(self, run_dir: Path, name: str = LOCK_NAME, fix: str | None = None):
        """``name``, ``fix``: the lock file and the refusal's advice, for a folder other than a run dir (a sweep's)."""
        self.path = Path(run_dir) / name
        self.fix = fix or _FIX
        self._fd: int | None = None

    def acquire(self, parent: int | None = None) -> str | None:
        """Own the dir, or raise RunDirBusy naming the owner. ``parent``: a pid whose ownership this process shares
        (rank 0 of a run whose launching process holds the lock). Returns a warning line when a stale lock was
        taken over, else None."""
        try:  # never through a symlink: a planted `.owner.lock -> ~/file` would be truncated below
            fd = open_regular(self.path, os.O_RDWR | os.O_CREAT)
        except NotRegularFile as e:
            raise RunDirBusy(f"{e.strerror or e}; delete it, or {self.fix.split(', or ', 1)[-1]}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            if parent is not None and owner.get("pid") == parent and owner.get("host") == platform.node():
                return None  # the launching process owns it on this rank's behalf
            raise RunDirBusy(f"{self.path.parent} is in use by {_describe(owner)}; {self.fix}") from None
        owner = _read_owner(fd)
        warning = None
        if owner:
            if owner.get("host") not in (None, platform.node()):
                age = time.time() - os.fstat(fd).st_mtime
                if age < LOST_AFTER_SECONDS:
                    os.close(fd)
                    raise RunDirBusy(
                        f"{self.path.parent} is in use by {_describe(owner)} (heartbeat {age:.0f} s ago); {self.fix}, "
                        f"or delete {self.path} if that process is gone"
                    )
            warning = f"took over the run dir from {_describe(owner)}, which ended without releasing it"
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"host": platform.node(), "pid": os.getpid(), "since": time.time()}).encode(), 0)
        self._fd = fd
        return warning

    def owner(self, allow: int | None = None) -> str | None:
        """Who owns the dir now, described (a live process holding the lock), or None; takes nothing. ``allow``: a
        pid whose ownership does not count (a rank's launching process, as in ``acquire``)."""
        try:
            fd = open_regular(self.path)
        except NotRegularFile:
            return f"a symlink at {self.path}, not a lock file"
        except OSError:
            return None  # no lock file: never owned
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            mine = allow is not None and owner.get("pid") == allow and owner.get("host") == platform.node()
            return None if mine else _describe(owner)
        finally:
            os.close(fd)  # closing drops a lock taken just now
        return None

    def touch(self) -> None:
        """The heartbeat a lock on a shared filesystem is judged by."""
        if self._fd is not None:
            os.utime(self._fd)  # the descriptor: never a symlink planted at the path since

    def release(self) -> None:
        """Give the dir up: an empty lock file is a released one (no takeover warning for the next owner)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass  # a full or read-only disk: the flock still goes with the descriptor
        os.close(fd)


_FIX = "wait for that run to end, or give this one another dir (hydra.run.dir=...)"


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _describe(owner: dict[str, Any]) -> str:
    since = owner.get("since")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else ""
    return f"pid {owner.get('pid')} on {owner.get('host')}{when}"
