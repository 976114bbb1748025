"""End to end through the real entry point: `python -m run` on CPU with a tiny budget."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import run_cli
from speedrun.records.store import RESULT_KEYS

pytestmark = pytest.mark.slow

# A seconds-long CPU run (conf/debug/smoke.yaml); data_cache (conftest) builds the embedded dataset once.
SMOKE = ["debug=smoke"]


def rows(cwd: Path):
    con = sqlite3.connect(cwd / "outputs" / "results.sqlite")
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM runs")]


def test_smoke_run_writes_every_record(default_smoke_run):
    """The pytest session's default smoke run (conftest.default_smoke_run: `python -m run debug=smoke` with its data
    cache, run dir and database; tests/test_experiments.py and tests/test_dist_cli.py read it too) left every record.
    It was a run of its own here (with name=smoke and budget.train_seconds=4), whose checks are all checked on this
    one: the row's name and overrides as this run set them."""
    proc, run_dir = default_smoke_run.proc, default_smoke_run.run_dir
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    result_path = run_dir / "result.json"
    result = json.loads(result_path.read_text())
    assert set(RESULT_KEYS) <= set(result)
    assert result["status"] == "ok" and result["error"] is None
    tokens_per_step = OmegaConf.load(run_dir / ".hydra" / "config.yaml").budget.tokens_per_step  # as composed
    assert result["steps"] > 0 and result["tokens"] == result["steps"] * tokens_per_step
    assert 0 < result["val_bpb"] < 20 and result["val_bpb_quant"] > 0 and result["artifact_bytes"] > 0
    assert result["attn_kernel"] == "sdpa:flash" and result["hardware"] == "cpu" and result["emulated"] is False
    assert "gpu_uuid" in result and result["gpu_uuid"] is None  # no card on CPU (which card, on a GPU)
    assert result["run_dir"] == str(run_dir.resolve())
    for name in (".hydra/config.yaml", "run.log", "metrics.jsonl", "env.json", "plan.json"):
        assert (run_dir / name).exists(), name
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics and metrics[-1]["step"] == result["steps"]
    con = sqlite3.connect(default_smoke_run.db)
    con.row_factory = sqlite3.Row
    (row,) = [dict(r) for r in con.execute("SELECT * FROM runs")]
    assert row["status"] == "ok" and row["val_bpb"] == result["val_bpb"] and row["name"] == "default"
    assert "debug=smoke" in row["overrides"].split() and json.loads(row["config"])["seed"] == 0
    # the grep-able block at the end of the console output
    out = proc.stdout + proc.stderr
    assert re.search(r"val_bpb:\s+\d+\.\d+\s*$", out, re.M) and re.search(r"status:\s+ok\s*$", out, re.M)


def test_ctrl_c_mid_run_leaves_an_interrupted_row(tmp_path, data_cache):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        # the smoke run without its step cap, so that it is still training when Ctrl-C comes
        [
            sys.executable,
            "-m",
            "run",
            *SMOKE,
            "budget.max_steps=1000000",
            "budget.train_seconds=300",
            f"data.cache_dir={data_cache}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 240
    seen = []
    try:
        for line in proc.stdout:  # wait until training is under way
            seen.append(line)
            if "tok/s" in line or time.time() > deadline:
                break
        assert any("tok/s" in line for line in seen), "".join(seen)[-3000:]
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    (row,) = rows(tmp_path)
    assert row["status"] == "interrupted" and row["steps"] > 0 and row["finished_at"] is not None
    (result_path,) = (tmp_path / "outputs" / "runs").glob("*/*/result.json")
    assert json.loads(result_path.read_text())["status"] == "interrupted"


# A bad data path (fails fast, the path on the console, a failed row, the traceback in error.txt): a case of
# tests/test_user_errors.py's test_config_and_plan_errors_are_one_message_and_a_failed_row, which checks all of it.


def test_plan_error_is_recorded_before_any_work(tmp_path):
    proc = run_cli(["hardware=h100"], cwd=tmp_path) if not _has_cuda() else None
    if proc is None:
        pytest.skip("a CUDA device is present")
    assert proc.returncode != 0 and "needs a CUDA GPU" in proc.stderr + proc.stdout
    (row,) = rows(tmp_path)
    assert row["status"] == "failed" and "PlanError" in row["error"]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
