"""What a run leaves behind: run-dir files, the results database, and the environment it ran in.

Every file is written whole (speedrun.records.atomic: a temporary name, fsync, rename), so a run killed at any
moment leaves either the previous complete file or the new complete one. The database row is written when the run starts (status
running) and completed when it ends, so a crash, Ctrl-C or error leaves a row that says so.
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from speedrun.paths import REPO_ROOT
from speedrun.records.atomic import atomic_write_text
from speedrun.records.identity import code_fingerprint
from speedrun.records.rundir import read_text

# The result.json contract (docs/architecture.md): add keys freely, never rename these. Each comes with the column
# type the results database declares for it.
CONTRACT_TYPES: dict[str, str] = {
    "status": "TEXT",
    "error": "TEXT",
    "val_bpb": "REAL",
    "val_loss": "REAL",
    "val_bpb_quant": "REAL",
    "val_bpb_ttt": "REAL",
    "tokens_per_s": "REAL",
    "mfu": "REAL",
    "peak_mem_mb": "REAL",
    "artifact_bytes": "INTEGER",
    "train_seconds": "REAL",
    "compile_seconds": "REAL",
    "eval_seconds": "REAL",
    "steps": "INTEGER",
    "tokens": "INTEGER",
    "params": "INTEGER",
    "hardware": "TEXT",
    "device_name": "TEXT",
    "emulated": "INTEGER",
    "attn": "TEXT",
    "attn_kernel": "TEXT",
    "precision": "TEXT",
    "seed": "INTEGER",
    "sweep": "TEXT",
    "git_sha": "TEXT",
    "torch_version": "TEXT",
    "run_dir": "TEXT",
}
RESULT_KEYS = tuple(CONTRACT_TYPES)

HEARTBEAT_SECONDS = 30.0
"""How often a live run refreshes its row's ``heartbeat_at`` (and its run dir's lock file)."""

LOST_AFTER_SECONDS = 600.0
"""A ``running`` row whose heartbeat is older than this is ``lost``: its process died without a word (kill -9,
power loss, a node gone). Generous, so that a long stall (a compile, a slow filesystem) is not taken for a death;
on the row's own host a vanished pid tells sooner (effective_status)."""

ENDED = ("ok", "failed", "diverged", "oom")
"""Statuses of a run that is over: its dir is never written again (an interrupted or lost run may be resumed)."""


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """The run dir's result.json, or None where there is none (or it cannot be read)."""
    try:
        result = json.loads(read_text(Path(run_dir) / "result.json"))  # never through a symlink
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def recorded_status(run_dir: Path) -> str | None:
    """The status the run dir's result.json records, or None where there is none (or it cannot be read)."""
    status = (read_result(run_dir) or {}).get("status")
    return status if isinstance(status, str) else None


def empty_result() -> dict[str, Any]:
    return dict.fromkeys(RESULT_KEYS)


class MetricsLog:
    """metrics.jsonl: one JSON object per logged step, flushed as written (a killed run keeps its curve)."""

    def __init__(self, path: Path, after_step: int | None = None):
        """``after_step``: a resumed run keeps the records up to that step and appends (records written after its
        checkpoint belong to steps it will run again)."""
        self.path = path
        if after_step is not None and path.exists():
            keep = [line for line in path.read_text().splitlines() if _step_of(line) <= after_step]
            atomic_write_text(path, "".join(line + "\n" for line in keep))
        # never through a symlink planted at metrics.jsonl: it would truncate or append to the link's target
        how = os.O_APPEND if after_step is not None else os.O_TRUNC
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | how | os.O_NOFOLLOW, 0o644)
        self._f = open(fd, "a" if after_step is not None else "w", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, default=float) + "\n")

    def close(self) -> None:
        self._f.close()


def _step_of(line: str) -> float:
    try:
        return float(json.loads(line).get("step", 0))
    except (ValueError, AttributeError, TypeError):
        return float("inf")  # a line cut short by a kill: dropped


# ---------------------------------------------------------------------------------------------------------
# results database


_BASE_COLUMNS = {
    "run_id": "TEXT PRIMARY KEY",
    "name": "TEXT",
    "started_at": "REAL",
    "finished_at": "REAL",
    "overrides": "TEXT",
    "config": "TEXT",
    "plan": "TEXT",
}


def _column_type(key: str) -> str:
    """Declared types for the contract's keys; other columns get none, so SQLite keeps each value's own type."""
    return CONTRACT_TYPES.get(key, "")


class ResultsDB:
    """outputs/results.sqlite, table ``runs``: one row per run, the result keys as columns.

    Safe with several processes writing at once: WAL journal, a generous busy timeout, and each write its own
    short transaction. New result keys become new columns (ALTER TABLE), old rows keep NULL there.
    """

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        con.execute("PRAGMA busy_timeout = 60000")
        return con

    def _ensure(self, con: sqlite3.Connection, row: dict[str, Any]) -> None:
        cols = ", ".join(f'"{k}" {t}' for k, t in _BASE_COLUMNS.items())
        con.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
        have = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
        wanted = list(RESULT_KEYS) + list(row)
        for key in dict.fromkeys(wanted):
            if key not in have:
                try:
                    con.execute(f'ALTER TABLE runs ADD COLUMN "{key}" {_column_type(key)}')
                except sqlite3.OperationalError as e:  # another process added it first
                    if "duplicate column" not in str(e):
                        raise

    def upsert(self, run_id: str, row: dict[str, Any]) -> None:
        row = {k: _sql_value(v) for k, v in row.items()}
        row["run_id"] = run_id
        con = self._connect()
        try:
            try:
                con.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError:
                pass  # e.g. a network filesystem without shared memory: the default journal still works
            con.execute("BEGIN IMMEDIATE")
            self._ensure(con, row)
            keys = list(row)
            placeholders = ", ".join("?" for _ in keys)
            updates = ", ".join(f'"{k}"=excluded."{k}"' for k in keys if k != "run_id")
            con.execute(
                f"INSERT INTO runs ({', '.join(chr(34) + k + chr(34) for k in keys)}) VALUES ({placeholders}) "
                f"ON CONFLICT(run_id) DO UPDATE SET {updates}",
                [row[k] for k in keys],
            )
            con.execute("COMMIT")
        finally:
            con.close()

    def mark_lost(self, now: float | None = None) -> list[str]:
        """Write ``lost`` into every ``running`` row whose process is gone (effective_status), with an error saying
        so; returns their run ids. The next run on the database does this, so a dead run's row stops saying
        running. A row's run dir is read first: where its result.json holds a final status, that record wins and
        the row is rewritten from it (its last row write failed: a full disk, a lock held too long). A row from
        another kernel (another boot_id) is judged by its heartbeat as this machine saw it (``seen_*`` columns,
        written here), never by comparing two machines' clocks."""
        now = time.time() if now is None else now
        me = process_identity()
        lost, changed = [], []
        for r in self.rows("status = 'running'"):
            if r.get("boot_id") != me["boot_id"] and (r.get("seen_beat"), r.get("seen_by")) != (
                r.get("heartbeat_at"),
                me["boot_id"],
            ):
                # first sight of this heartbeat here: its age is counted from now, on this clock (a vanished pid of
                # a row without boot_id on this host still tells at once)
                seen = {"seen_beat": r.get("heartbeat_at"), "seen_at": now, "seen_by": me["boot_id"]}
                changed.append((r["run_id"], seen))
                r = {**r, **seen}
            if effective_status(r, now) != "lost":
                continue
            final = read_result(Path(str(r.get("run_dir") or r["run_id"])))
            if final is not None and final.get("status") in (*ENDED, "interrupted"):
                changed.append((r["run_id"], _result_row(final)))
                continue
            lost.append(r)
        for run_id, keys in changed:
            self.upsert(run_id, keys)
        con = self._connect()
        try:
            for r in lost:
                beat = r.get("heartbeat_at")
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(beat)) if beat is not None else "unknown"
                con.execute(
                    "UPDATE runs SET status = 'lost', error = ? WHERE run_id = ? AND status = 'running'",
                    (
                        f"lost: pid {r.get('pid')} on {r.get('host')} ended without a word (last heartbeat {when})",
                        r["run_id"],
                    ),
                )
        finally:
            con.close()
        return [r["run_id"] for r in lost]

    def resync(self) -> list[tuple[str, Any, Any]]:
        """Rewrite every row whose run dir's result.json holds another status from that result.json (its final
        record wins over a row whose last write failed, or a row marked lost); returns (run id, row status, result
        status) for each row rewritten. Rows of runs still running, or without a readable result.json, stay."""
        out = []
        for r in self.rows():
            final = read_result(Path(str(r.get("run_dir") or r["run_id"])))
            status = (final or {}).get("status")
            if final is None or status == r.get("status") or status not in (*ENDED, "interrupted"):
                continue
            self.upsert(r["run_id"], _result_row(final))
            out.append((r["run_id"], r.get("status"), status))
        return out

    def rows(self, where: str = "1=1", params: tuple = ()) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        con = self._connect()
        con.row_factory = sqlite3.Row
        # a value that is not UTF-8 (written by another tool) must not stop a run: it reads with U+FFFD in place
        con.text_factory = lambda data: data.decode("utf-8", "replace")
        try:
            return [dict(r) for r in con.execute(f"SELECT * FROM runs WHERE {where}", params)]
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return []
            raise
        finally:
            con.close()


def _result_row(result: dict[str, Any]) -> dict[str, Any]:
    """A row's keys from a run dir's result.json: its own values, of the names a column may take."""
    return {str(k): v for k, v in result.items() if isinstance(k, str) and k.replace("_", "").isalnum()}


def _read_first_line(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.readline().strip() or None
    except OSError:
        return None


def process_identity() -> dict[str, Any]:
    """What tells this process's machine and pid namespace apart: host name, the kernel's boot id (one per boot of
    one kernel, shared by its containers) and the pid namespace (a container's own, where pids repeat)."""
    try:
        pid_ns: str | None = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = None
    return {"host": platform.node(), "boot_id": _read_first_line("/proc/sys/kernel/random/boot_id"), "pid_ns": pid_ns}


def owner_keys() -> dict[str, Any]:
    """The row's keys that tell whether its process still lives: host, boot id, pid namespace, pid and a first
    heartbeat."""
    return {**process_identity(), "pid": os.getpid(), "heartbeat_at": time.time()}


def effective_status(row: dict[str, Any], now: float | None = None) -> str | None:
    """The row's status, with ``lost`` for a ``running`` row whose process is gone: its pid no longer exists in
    this kernel and pid namespace, or its heartbeat stopped more than LOST_AFTER_SECONDS ago. A heartbeat is aged
    on one clock only: this kernel's, for a row written under this boot id; else from when this machine first saw
    that heartbeat (the ``seen_*`` columns mark_lost writes). A row from before boot ids (no boot_id) under this host
    name whose pid is gone reads lost, as it did then; its heartbeat is aged as another kernel's. Rows from before
    heartbeats (no heartbeat_at) keep what they say."""
    status = row.get("status")
    if status != "running":
        return status
    me = process_identity()
    now = now if now is not None else time.time()
    pid, beat = row.get("pid"), row.get("heartbeat_at")
    if row.get("boot_id") is None and row.get("host") == me["host"] and isinstance(pid, int) and not pid_alive(pid):
        return "lost"  # a row from before boot ids: its host name is the identity it has, as then
    same_kernel = row.get("boot_id") is not None and row.get("boot_id") == me["boot_id"]
    if same_kernel and row.get("pid_ns") == me["pid_ns"] and isinstance(pid, int) and not pid_alive(pid):
        return "lost"
    if same_kernel:
        age = now - beat if isinstance(beat, (int, float)) else None
    elif row.get("seen_by") == me["boot_id"] and row.get("seen_beat") == beat and row.get("seen_at") is not None:
        age = now - float(row["seen_at"])  # seen_at is this machine's clock, as now is
    else:
        age = None
    if age is not None and age > LOST_AFTER_SECONDS:
        return "lost"
    return status


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _sql_value(value: Any) -> Any:
    if value is None or isinstance(value, (int, float, str)):
        return value
    return json.dumps(value, default=str)


# ---------------------------------------------------------------------------------------------------------
# environment capture


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def capture_environment(device: str) -> dict[str, Any]:
    """Code identity, versions and the device, as records in the speedrun leaderboards carry them."""
    import torch

    root = REPO_ROOT  # None from an installed wheel: no commit to name (git there would answer for another repo)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root) if root else None
    env: dict[str, Any] = {
        "git_sha": _run(["git", "rev-parse", "HEAD"], cwd=root) if root else None,
        "git_dirty": bool(status) if status is not None else None,
        # what a resumed sweep compares: the source as it is on disk, uncommitted and untracked files included
        "code_fingerprint": code_fingerprint(root),
        "code_layout": "checkout" if root else "installed",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "argv": sys.argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    for mod in ("hydra", "omegaconf", "sentencepiece", "numpy", "triton"):
        try:
            env[f"{mod}_version"] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - optional packages
            env[f"{mod}_version"] = None
    if device == "cuda":
        env["nvidia_smi"] = _run(["nvidia-smi"])
        env["cudnn_version"] = torch.backends.cudnn.version()
    return env
