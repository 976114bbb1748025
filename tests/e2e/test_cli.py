"""End to end through the real entry point: `python -m run` on CPU with a tiny budget (the default smoke run's
records, Ctrl-C, a plan error, GPT-2-style tiktoken shards), and `python -m run ... --plan`, which prints the
resolved Plan, as plan.json holds it, without a run. A run under track=pgolf_10min_16mb records why it is no
submission, its GPTQ Hessians inside train_seconds."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from speedrun.export.track import RECORD_NAME
from speedrun.records.store import RESULT_KEYS
from support.bpe import DOCS, write_tiktoken_file
from support.cli import Forked, run_cli

pytestmark = pytest.mark.slow

# A seconds-long CPU run (conf/debug/smoke.yaml); data_cache (conftest) builds the embedded dataset once.
SMOKE = ["debug=smoke"]


def rows(cwd: Path):
    con = sqlite3.connect(cwd / "outputs" / "results.sqlite")
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM runs")]


def test_smoke_run_writes_every_record(default_smoke_run):
    """The pytest session's default smoke run (conftest.default_smoke_run: `python -m run debug=smoke` with its data
    cache, run dir and database; tests/e2e/test_experiments.py and tests/e2e/test_dist_cli.py read it too) left every record.
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
    # the smoke run without its step cap, so that it is still training when Ctrl-C comes; forked from this process
    args = [*SMOKE, "budget.max_steps=1000000", "budget.train_seconds=300", f"data.cache_dir={data_cache}"]
    proc = Forked(["-m", "run", *args], tmp_path)
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
# tests/e2e/test_user_errors.py's test_config_and_plan_errors_are_one_message_and_a_failed_row, which checks all of it.


def test_plan_error_is_recorded_before_any_work(tmp_path):
    proc = run_cli(["hardware=h100"], cwd=tmp_path, fork=True) if not _has_cuda() else None
    if proc is None:
        pytest.skip("a CUDA device is present")
    assert proc.returncode != 0 and "needs a CUDA GPU" in proc.stderr + proc.stdout
    (row,) = rows(tmp_path)
    assert row["status"] == "failed" and "PlanError" in row["error"]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------------------
# a track (conf/track/): judged at the end, GPTQ's Hessians inside the training clock


def test_a_cpu_run_records_why_it_is_no_submission_and_its_hessians_in_train_seconds(tmp_path, data_cache):
    """The record's recipe on CPU under the track (its whole-split and data rules lifted so the smoke run stays
    seconds long on the embedded corpus): GPTQ's Hessians collected after the last step, inside train_seconds, before any score; track_ok false.
    A twelfth of smoke's tokens a step (2 micro-batches, not 24: the Hessians' batches are micro-batches, the same
    either way), fp32 (bf16 on a CPU is ~5x slower; the track's bookkeeping is the same) and a progress line after
    every step, so that step 1's line, which the log order below needs, is there however fast the steps run
    (smoke's 1 s lines printed it only because a step took more than 1 s)."""
    proc = run_cli(
        [
            "experiment=pgolf_record",
            "debug=smoke",
            "ttt=off",
            "quant=int6",
            "track=pgolf_10min_16mb",
            "track.full_validation=false",
            "track.data=[]",  # the embedded corpus: the track refuses it at compose otherwise
            "budget.tokens_per_step=512",
            "precision=fp32",
            "budget.train_seconds=120",  # a time limit for the Hessians' reserve (smoke's steps alone have none)
            "logger.log_every_seconds=0.001",
            f"data.cache_dir={data_cache}",
            f"hydra.run.dir={tmp_path / 'run'}",
            f"results_db={tmp_path / 'r.sqlite'}",
        ],
        cwd=tmp_path,
        fork=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "run" / "result.json").read_text())
    assert r["status"] == "ok" and r["track"] == RECORD_NAME and r["track_ok"] is False
    problems = " | ".join(r["track_problems"])
    for says in ("ran on 1 CPU process, not 8 GPUs", "not H100"):
        assert says in problems, problems
    assert r["hessian_reserve_seconds"] > 0 and r["quant_hessian_seconds"] > 0 and r["quant_reserve_ok"] is True
    # each key is rounded to the millisecond on its own
    assert r["train_seconds"] >= r["train_loop_seconds"] + r["quant_hessian_seconds"] - 0.002
    assert r["budget_seconds"] == 120 and "track_projection" not in r  # no peak to project a CPU with
    log = (tmp_path / "run" / "run.log").read_text()
    assert log.index("GPTQ's Hessians take") < log.index("step      1")  # the reserve is measured in warm-up
    assert log.index("training: loop") < log.index("eval (standard)")  # the last read of training data comes first


# ---------------------------------------------------------------------------------------------------------
# tiktoken shards (GPT-2's byte-level BPE, tests/support/bpe.py)


def test_a_smoke_run_trains_and_scores_on_tiktoken_shards(tmp_path):
    """The whole run path with a byte-level BPE: shards from prepare_data, data.tokenizer=<file>.tiktoken, the
    byte LUT and <|endoftext|> as the document boundary; val_bpb is finite and the bytes are the val text's."""
    pytest.importorskip("tiktoken", reason="tiktoken is not installed (pip install 'speedrun[gpt2]')")
    import numpy as np
    import torch

    from speedrun.core.data import build_tiktoken_luts, list_shards, load_encoding, read_shard
    from speedrun.data.bpb import stream_bytes
    from speedrun.data.prepare import prepare_tiktoken_dataset

    vocab = write_tiktoken_file(tmp_path / "small.tiktoken")
    docs = [f"{d} {i}" * 8 for i in range(12) for d in DOCS]
    prepare_tiktoken_dataset(docs[4:], docs[:4], tmp_path / "ds", str(vocab), num_threads=1)
    n_vocab = load_encoding(vocab).n_vocab
    proc = run_cli(
        [
            "debug=smoke",
            f"data.path={tmp_path / 'ds'}",
            f"data.tokenizer={vocab}",
            f"data.vocab_size={n_vocab}",
            "model.vocab_multiple=16",
            "budget.tokens_per_step=512",  # 2 micro-batches a step, not smoke's 24: the BPE path is what is tested
            "eval.tokens=null",
            f"hydra.run.dir={tmp_path / 'run'}",
            f"results_db={tmp_path / 'r.sqlite'}",
        ],
        cwd=tmp_path,
        timeout=300,
        fork=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "ok" and np.isfinite(result["val_bpb"])
    # The scored bytes are the byte LUT's count over the scored val prefix: the GPT-2 path was taken.
    val = torch.from_numpy(read_shard(list_shards(tmp_path / "ds", "val")[0]).astype(np.int64))
    scored = val[: result["eval_tokens"] + 1]
    assert result["eval_bytes"] == stream_bytes(scored, build_tiktoken_luts(load_encoding(vocab)))
    assert result["eval_bytes"] > 0
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["model"]["vocab_size"] == -(-n_vocab // 16) * 16


# ---------------------------------------------------------------------------------------------------------
# --plan


def plan_cli(args, cwd):
    return run_cli([*args, "--plan=json"], cwd=cwd, timeout=120, fork=True)


def test_plan_prints_the_resolved_plan_and_writes_nothing(tmp_path):
    proc = plan_cli(["debug=smoke", "budget.tokens_per_step=8192", "seed=3"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout)
    assert plan["seed"] == 3 and plan["tokens_per_step"] == 8192
    assert plan["device"] == "cpu" and plan["precision"] == "fp32"  # `auto` resolved for this machine
    assert plan["micro_batch"] * plan["grad_accum"] * plan["model"]["seq_len"] == 8192
    assert list(tmp_path.iterdir()) == []  # no run dir, no results database


@pytest.mark.parametrize(
    "args,needle",
    [
        (["precision=fp16"], "precision=fp16 needs a CUDA GPU"),  # the resolver's refusal
        (["attn=nope"], "attn=nope is no option of attn"),  # caught before compose (cli_step.unknown_override)
        (["seed=abc"], "Error merging override seed=abc"),  # Hydra's compose error
        (["-m", "seed=0,1"], "--plan takes overrides only"),
    ],
)
def test_plan_refuses_in_one_line(tmp_path, args, needle, monkeypatch, capsys):
    """print_plan, which `python -m run ... --plan` exits with (run.py; the test above runs the command itself), in
    this process: an exception it let through would fail here as a traceback would on the console, and a fresh
    interpreter per case cost ~3 s of imports."""
    from speedrun.run.cli_step import print_plan

    monkeypatch.chdir(tmp_path)
    code = print_plan(["run", *args, "--plan"])
    out, err = capsys.readouterr()
    assert code == 1 and out == "", out[-2000:]
    assert err.strip().splitlines() == [f"error: {err.strip()[7:]}"] and needle in err
    assert list(tmp_path.iterdir()) == []
