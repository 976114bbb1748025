"""What a run records when it ends early or runs out of memory, run in-process on CPU (seconds each): results
written phase by phase, ``oom`` as its own status, ``gpu_shared``, training-only CPU memory, comparable evals."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
import types

import pytest
import torch
from omegaconf import OmegaConf

from speedrun.config import to_config
from speedrun.errors import RunOutOfMemory
from speedrun.plan import resolve
from speedrun.run.runner import RunContext, run_job
from support.devices import fake_device
from support.tiny import BOS, TTT_TINY, byte_luts, docs_stream

FAST = [
    "debug=smoke",
    "budget.tokens_per_step=256",
    "budget.max_steps=2",
    "budget.warmup_steps=0",
    "eval.tokens=1024",
    "quant.calib_batches=1",
]
FAKE_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


def run(compose, tmp_path, data_cache, *overrides, raises=None):
    """One run through the runner, as `python -m run` does after compose: (result.json, results row)."""
    db = tmp_path / "r.sqlite"
    cfg = compose([*FAST, f"data.cache_dir={data_cache}", f"results_db={db}", *overrides])
    ctx = RunContext(tmp_path / "run", list(overrides), None, tmp_path)
    if raises is None:
        run_job(cfg, ctx)
    else:
        with pytest.raises(raises):
            run_job(cfg, ctx)
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    (row,) = [dict(r) for r in con.execute("SELECT * FROM runs")]
    return json.loads((tmp_path / "run" / "result.json").read_text()), row


def fake_oom(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError(FAKE_OOM)


def test_a_run_stopped_during_ttt_keeps_eval_and_artifact(compose, tmp_path, data_cache, monkeypatch):
    """Stopped by SIGTERM during TTT, the row says interrupted and keeps val_bpb, val_bpb_quant and artifact_bytes."""
    import speedrun.run.finish_ttt

    def sigterm(*args, **kwargs):
        raise KeyboardInterrupt("signal 15")  # what sigterm_as_interrupt turns SIGTERM into

    monkeypatch.setattr(speedrun.run.finish_ttt, "ttt_pass", lambda plan: sigterm)  # the pass the core runs
    result, row = run(compose, tmp_path, data_cache, "ttt=lora", "ttt.chunk_size=64", raises=KeyboardInterrupt)
    for record in (result, row):
        assert record["status"] == "interrupted" and record["steps"] == 2 and record["val_bpb_ttt"] is None
        assert record["val_bpb"] is not None and record["val_bpb"] > 0 and record["val_bpb_quant"] > 0
        assert record["artifact_bytes"] == record["artifact_model_bytes"] + record["artifact_code_bytes"] > 0
        assert record["phase"] == "ttt" and record["eval_fingerprint"]


def test_a_finished_run_says_done(compose, tmp_path, data_cache):
    result, row = run(compose, tmp_path, data_cache, "quant=off")
    assert (result["status"], result["phase"], row["phase"]) == ("ok", "done", "done")
    assert result["artifact_bytes"] is None and result["val_bpb"] > 0


def test_a_run_whose_loss_blows_up_is_diverged_and_not_evaluated(compose, tmp_path, data_cache, monkeypatch):
    """A run whose training loss rises far above where it started (pgolf_baseline on CPU can go 6.9 -> 15.0 in 3
    steps, worse than uniform) is not ok. Here the second step's loss is pushed 8 nats up: the run is diverged,
    says why, and is not evaluated or exported."""
    from speedrun.core.train import Stepper

    step = Stepper.__call__
    calls = []

    def rising(self, batches):
        calls.append(1)
        return step(self, batches) + (8.0 if len(calls) > 1 else 0.0)

    monkeypatch.setattr(Stepper, "__call__", rising)
    result, row = run(compose, tmp_path, data_cache)
    for record in (result, row):
        assert (record["status"], record["steps"]) == ("diverged", 2)
        assert record["error"].startswith("training loss rose from 6.9")
        assert record["error"].endswith("at step 2, above ln(1024) = 6.9315 (uniform guessing)")
        assert record["val_bpb"] is None and record["artifact_bytes"] is None
    assert not list((tmp_path / "run").glob("model.*"))


def test_oom_in_training_is_its_own_outcome(compose, tmp_path, data_cache, monkeypatch):
    import speedrun.core.train

    monkeypatch.setattr(speedrun.core.train, "train", fake_oom)  # the loop fit runs after warm-up
    result, row = run(compose, tmp_path, data_cache, raises=RunOutOfMemory)
    for record in (result, row):
        assert (record["status"], record["phase"]) == ("oom", "train")
        assert record["error"].startswith("out of memory in train; tried to allocate 2.00 GiB")
        assert "plan estimate" in record["error"] and "fix: lower hardware.micro_batch (now 2" in record["error"]
        assert record["memory_estimate_gb"] is not None and "\n" not in record["error"]
    assert "OutOfMemoryError" in (tmp_path / "run" / "error.txt").read_text()


def test_oom_in_eval_keeps_training_and_names_the_eval_fix(compose, tmp_path, data_cache, monkeypatch):
    import speedrun.core.pipeline

    monkeypatch.setattr(speedrun.core.pipeline, "run_eval", fake_oom)
    result, row = run(compose, tmp_path, data_cache, raises=RunOutOfMemory)
    assert (row["status"], row["phase"], row["steps"]) == ("oom", "eval", 2) and row["tokens_per_s"] > 0
    assert "out of memory in eval" in result["error"] and "lower eval.batch_size (now 2)" in result["error"]
    assert row["val_bpb"] is None


def test_oom_wrapped_by_another_exception_is_still_oom(compose, tmp_path, data_cache, monkeypatch):
    """torch.compile (inductor) re-raises errors from inside a graph wrapped in its own exception types."""
    import speedrun.core.train

    def wrapped(*args, **kwargs):
        try:
            fake_oom()
        except torch.cuda.OutOfMemoryError as e:
            raise RuntimeError("backend compiler failed") from e

    monkeypatch.setattr(speedrun.core.train, "train", wrapped)
    result, _ = run(compose, tmp_path, data_cache, raises=RunOutOfMemory)
    assert result["status"] == "oom"


def test_main_ends_an_oom_with_one_line_and_exit_1(monkeypatch, capsys):
    import speedrun
    import speedrun.run.runner

    def oom_job(cfg):
        raise RunOutOfMemory("out of memory in train; fix: lower hardware.micro_batch (now 8)")

    monkeypatch.setattr(speedrun.run.runner, "run_job", oom_job)
    with pytest.raises(SystemExit) as e:
        speedrun.main(OmegaConf.create({}))
    assert e.value.code == 1


def test_gpu_shared_is_recorded_from_the_pool_launcher(compose, tmp_path, data_cache, monkeypatch):
    from speedrun.records.identity import GPU_SHARED_ENV

    monkeypatch.setenv(GPU_SHARED_ENV, "1")
    result, row = run(compose, tmp_path, data_cache, "quant=off")
    assert result["gpu_shared"] is True and row["gpu_shared"] == 1


@pytest.mark.parametrize("slots,shared", [(["0", "0"], "1"), (["0", "1"], "0")])
def test_pool_launcher_tells_a_job_whether_it_shares_its_gpu(tmp_path, slots, shared):
    from hydra_plugins.speedrun_plugins.job_pool import Job, Pool

    job = Job(
        num=0,
        overrides=[],
        config=OmegaConf.create({}),
        job_dir=tmp_path / "0",
        cmd=[sys.executable, "-c", "import os; print('shared=' + os.environ['SPEEDRUN_GPU_SHARED'])"],
    )
    Pool(slots, fail_fast=False, echo=False, stop_timeout_s=5)._start(job, [0])
    job.proc.wait(60)
    job.pump.join(10)
    assert f"shared={shared}" in (tmp_path / "0" / "console.log").read_text()


def test_cpu_peak_memory_covers_training_not_the_data_build(compose, tmp_path, data_cache, monkeypatch):
    """A cold-cache dataset build can use more memory than training; peak_mem_mb must not report it."""
    import speedrun.run.build
    import speedrun.run.job

    build_data = speedrun.run.build.build_data
    spike = {}

    def build_with_a_spike(plan, log):
        block = bytearray(600 * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # resident, not just reserved
        with open("/proc/self/status") as f:
            spike["mb"] = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
        del block
        return build_data(plan, log)

    monkeypatch.setattr(speedrun.run.job, "build_data", build_with_a_spike)
    result, _ = run(compose, tmp_path, data_cache, "quant=off")
    assert 0 < result["peak_mem_mb"] < spike["mb"] - 150, (result["peak_mem_mb"], spike)  # not the 600 MB spike
    assert result["peak_mem_scope"] == "training"


def test_the_default_eval_scores_the_whole_split_on_every_card(compose):
    for device in ("cpu", "t4", "h100"):
        assert resolve(to_config(compose([])), fake_device(device)).eval.tokens is None, device
    assert resolve(to_config(compose(["eval.tokens=4096"])), fake_device("h100")).eval.tokens == 4096


def test_eval_fingerprint_names_exactly_the_scored_tokens(compose, tmp_path):
    """16 hex digits of blake2b over the int32 ids the windows read: a token past the last window changes nothing,
    a scored one changes it."""
    from speedrun.core.attention import get_backend
    from speedrun.core.model import GPT
    from speedrun.run.finish import evaluate_and_export

    plan = resolve(
        to_config(
            compose(
                [
                    "hardware=cpu",
                    "model=tiny",
                    "model.n_layer=2",
                    "model.d_model=32",
                    "model.seq_len=24",
                    "data.vocab_size=64",
                    "hardware.micro_batch=4",
                    "budget.tokens_per_step=96",
                    "quant=off",
                ]
            )
        ),
        fake_device("cpu"),
    )
    gpt = GPT(TTT_TINY, get_backend("sdpa", kernel="math"))

    def fingerprint(tokens):
        data = types.SimpleNamespace(val_tokens=tokens, luts=byte_luts(), bos_id=BOS)
        return evaluate_and_export(
            plan, gpt, lambda x, y: gpt(x, y, reduction="none"), data, tmp_path, lambda line: None
        )

    tokens = docs_stream([40, 45])  # 85 tokens: 3 windows of 24 score targets 1..72
    out = fingerprint(tokens)
    assert (out["eval_tokens"], out["eval_split"]) == (72, "val")
    expected = hashlib.blake2b(tokens[:73].to(torch.int32).numpy().tobytes(), digest_size=8).hexdigest()
    assert out["eval_fingerprint"] == expected
    unscored, scored = tokens.clone(), tokens.clone()
    unscored[80] = (unscored[80] % 63) + 1
    scored[50] = (scored[50] % 63) + 1
    assert fingerprint(unscored)["eval_fingerprint"] == expected != fingerprint(scored)["eval_fingerprint"]
