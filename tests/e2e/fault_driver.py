"""Run `python -m run ...` with one fault injected: ``python tests/e2e/fault_driver.py <fault> <run args...>``.

Faults (the machine states a run must survive, made on demand):
- ``erofs:<dir>``: every directory created under <dir> fails as on a read-only filesystem.
- ``db_full_after:<n>``: the results database accepts <n> writes, then fails as a full disk does.
- ``stall_after_checkpoints:<n>``: once its <n>th checkpoint is written, the run stalls (its heartbeat goes on) until
  it is killed, or for 5 minutes, then trains on (a test that failed before killing it leaves no process behind).
"""

from __future__ import annotations

import errno
import os
import runpy
import sqlite3
import sys
from pathlib import Path


def read_only_under(top: str) -> None:
    real_mkdir = os.mkdir
    top_path = Path(top).resolve()

    def mkdir(path, mode=0o777, *, dir_fd=None):  # noqa: ANN001 - os.mkdir's own signature
        if top_path in Path(path).resolve().parents:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, mode, dir_fd=dir_fd)

    os.mkdir = mkdir  # type: ignore[assignment]


def database_full_after(n: int) -> None:
    from speedrun.records.store import ResultsDB

    real_upsert = ResultsDB.upsert
    calls = {"n": 0}

    def upsert(self, run_id, row):  # noqa: ANN001
        calls["n"] += 1
        if calls["n"] > n:
            raise sqlite3.OperationalError("database or disk is full")
        return real_upsert(self, run_id, row)

    ResultsDB.upsert = upsert  # type: ignore[method-assign]


def stall_after_checkpoints(n: int) -> None:
    import time

    from speedrun.run import checkpoint, periodic

    real_save = checkpoint.save_checkpoint
    calls = {"n": 0}

    def save_checkpoint(*args, **kwargs):  # noqa: ANN002, ANN003
        path = real_save(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == n:
            time.sleep(300)
        return path

    # periodic took the function by name when it was imported: forked from a test process (support.cli.Forked) it
    # already was, so its name is the one the run calls
    checkpoint.save_checkpoint = save_checkpoint  # type: ignore[assignment]
    periodic.save_checkpoint = save_checkpoint  # type: ignore[assignment]


if __name__ == "__main__":
    fault, args = sys.argv[1], sys.argv[2:]
    kind, _, arg = fault.partition(":")
    if kind == "erofs":
        read_only_under(arg)
    elif kind == "db_full_after":
        database_full_after(int(arg))
    elif kind == "stall_after_checkpoints":
        stall_after_checkpoints(int(arg))
    else:
        raise SystemExit(f"unknown fault {fault}")
    sys.argv = ["run", *args]
    runpy.run_module("run", run_name="__main__", alter_sys=True)
