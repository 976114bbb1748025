"""A rank of `python -m run dist.nproc=2` killed outright (kill -9) mid-training, on CPU (gloo): the row keeps what
rank 0 recorded during the run (params, git_sha, the steps it logged) and says failed, with an error that names the
rank that died and how, not the rank that then lost its connection to it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


SMOKE = [
    "debug=smoke",
    "budget.tokens_per_step=512",
    "budget.max_steps=1000000",
    "budget.train_seconds=300",
    "checkpoint.every_steps=2",
]
"""A tiny CPU model still training when the kill comes (smoke's 4 steps lifted), with checkpoints on the way; one
micro-batch of 2 x 128 per rank a step (512 tokens, not smoke's 6144): the kill, not the training, is tested."""


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:  # the field after the state is the parent's pid
            out.append(int(stat.parent.name))
    return out


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The rank's process: a child of the launching process (the elastic agent runs in it) with RANK=<rank>."""
    for pid in _children(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return pid
    return None


def _steps_logged(cwd: Path) -> int:
    return sum(
        1
        for metrics in (cwd / "outputs").glob("**/metrics.jsonl")
        for line in metrics.read_text().splitlines()
        if line.endswith("}") and '"kind"' not in line
    )


def kill_rank_mid_training(tmp_path: Path, data_cache: Path, rank: int) -> tuple[dict, dict, str]:
    """Start the run, kill -9 ``rank`` once rank 0 logged 3 steps, wait for the launching process: (row, result.json,
    console)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "run", *SMOKE, "dist.nproc=2", f"data.cache_dir={data_cache}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 300  # 120 s ran out before 3 steps at load 12: the rank was killed in setup
        while _steps_logged(tmp_path) < 3 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        pid = _rank_pid(proc.pid, rank)
        assert pid is not None and proc.poll() is None, f"no rank {rank} training: {proc.poll()}"
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    con = sqlite3.connect(tmp_path / "outputs" / "results.sqlite")
    con.row_factory = sqlite3.Row
    (row,) = [dict(r) for r in con.execute("SELECT * FROM runs")]
    result = json.loads((Path(row["run_id"]) / "result.json").read_text())
    return row, result, out


@pytest.mark.parametrize("rank", [0, 1])
def test_a_killed_rank_is_named_and_rank_0s_record_kept(tmp_path, data_cache, rank):
    row, result, out = kill_rank_mid_training(tmp_path, data_cache, rank)
    expected = f"rank {rank} died (killed by signal 9, SIGKILL)"
    for record in (row, result):
        assert record["status"] == "failed" and record["error"].startswith(expected), (record["error"], out[-3000:])
        assert record["params"] and record["git_sha"] and record["device_name"] and record["world_size"] == 2
        assert record["steps"] >= 3 and record["tokens"] == record["steps"] * 512 and record["phase"] == "train"
    assert row["finished_at"] is not None
    assert expected in out  # the launching process's last line says it too
