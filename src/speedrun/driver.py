"""The exported file's entry point: one run of the core from frozen settings, with no record keeping.

An exported run (artifact.code_rule=wrapped, the default) ships this module linked with the part of speedrun.core
it reaches for the run's Plan (speedrun.artifact.link) as one module, train_gpt_human.py, ending in the frozen
settings ``PLAN = RunSettings(...)`` and ``main(PLAN, __file__)``; train_gpt.py is that module minified and
compressed, the file whose bytes are counted. ``main`` is the order ``python -m run`` trains in, less its shell
(records, resume, checkpoints, periodic validation, loggers): build the data and the model, train to the budget,
collect GPTQ's Hessians, score the trained model, quantize it, score the round trip, score-first TTT, and print
the result block.

    python train_gpt.py
    DATA_PATH=<shards dir> TOKENIZER_PATH=<tokenizer .model> SEED=1 torchrun --standalone --nproc_per_node=8 train_gpt.py

The settings are the run's, resolved: a time budget's step-counted settings are the ones the run projected, and
GPTQ's reserve is the one it measured. Only the data (DATA_PATH, TOKENIZER_PATH), the seed (SEED) and the ranks
(torchrun's) come from the environment.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from speedrun.core import choice
from speedrun.core.attention import BACKENDS
from speedrun.core.compile import CompileOptions
from speedrun.core.data import dataset_paths
from speedrun.core.dist import World
from speedrun.core.model import GPT
from speedrun.core.pipeline import FinishHooks, FinishSettings, finish, gptq_hessians, make_model, open_data
from speedrun.core.quant import export_packed
from speedrun.core.train import Hooks, Stepper, TrainSettings, TrainState, fit
from speedrun.core.ttt_score import TTT

MODELS = choice("model_arch", {"gpt": GPT})
"""model.arch -> the model class (an exported file carries the core's models only)."""


@dataclass(frozen=True)
class DataSettings:
    """Where the run's tokens are and how they are read."""

    path: str
    tokenizer: str | None
    tokenizer_kind: str
    vocab_size: int
    eval_tokens: int | None
    """The validation tokens scored (None: the whole split)."""


@dataclass(frozen=True)
class RunSettings:
    """Everything an exported run reads, frozen from its Plan when the file was made."""

    seed: int
    device: str
    data: DataSettings
    micro_batch: int
    model_arch: str
    attn: str
    attn_options: tuple[tuple[str, Any], ...]
    model_options: tuple[tuple[str, Any], ...]
    document_mask: bool
    fused_qkv: bool
    fused_ce: int
    """Rows per chunk of the fused training loss (kernel.fused_ce), 0 for off."""
    fp8: tuple[str, ...]
    fp8_impl: str
    ns_dtype: str
    compile: bool
    kernel: CompileOptions
    train: TrainSettings
    finish: FinishSettings
    ttt: str | None
    """The TTT pass (ttt.name), None when off."""
    cap_bytes: int
    threads: int | None = None
    """A CPU run's torch threads: a sum over another number of threads rounds differently."""
    tf32: bool = False
    memory_cap_gb: float | None = None
    """An emulated card's memory (hardware=t4 on a larger GPU)."""
    hessian_reserve: float = 0.0
    """Seconds of a time budget kept for GPTQ's Hessians, as the run measured them."""
    dist_timeout_s: float = 600.0
    world_size: int = 1
    """The run's ranks: a re-run on another number keeps the tokens of a step (grad_accum scaled)."""


def from_environment(run: RunSettings, env: dict[str, str] | os._Environ[str]) -> RunSettings:
    """``run`` with the data, the seed and the ranks the environment names (DATA_PATH, TOKENIZER_PATH, SEED,
    torchrun's WORLD_SIZE: a step keeps its tokens, its gradient accumulation scaled to the ranks)."""
    data, seed = run.data, int(env.get("SEED") or run.seed)
    if env.get("DATA_PATH"):
        tokenizer = env.get("TOKENIZER_PATH") or data.tokenizer
        if not env.get("TOKENIZER_PATH") and (Path(env["DATA_PATH"]) / "tokenizer.model").is_file():
            tokenizer = str(Path(env["DATA_PATH"]) / "tokenizer.model")
        data = dataclasses.replace(data, path=env["DATA_PATH"], tokenizer=tokenizer)
    ttt = run.finish.ttt and dataclasses.replace(run.finish.ttt, seed=seed)
    run = dataclasses.replace(run, seed=seed, data=data, finish=dataclasses.replace(run.finish, ttt=ttt))
    ranks = int(env.get("WORLD_SIZE") or 1)
    if ranks != run.world_size:
        accum = run.train.grad_accum * run.world_size / ranks
        if accum != int(accum):
            raise SystemExit(f"error: this run's step of {run.world_size} rank(s) cannot be split over {ranks} ranks")
        run = dataclasses.replace(run, train=dataclasses.replace(run.train, grad_accum=int(accum)), world_size=ranks)
    return run


def main(run: RunSettings, file: str) -> dict[str, Any]:
    """Train, quantize and score ``run``; print and return the result keys. ``file``: the exported file running
    (its train_gpt.py is the code counted)."""
    run = from_environment(run, os.environ)
    env = os.environ
    world = World(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))
    cuda = run.device == "cuda"
    if cuda:
        torch.cuda.set_device(world.local_rank)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = run.tf32
        if run.memory_cap_gb:
            total = torch.cuda.get_device_properties(world.local_rank).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, run.memory_cap_gb * 1e9 / total))
    elif run.threads:
        torch.set_num_threads(run.threads)
    if not world.single:
        world.join("nccl" if cuda else "gloo", run.dist_timeout_s)
    say = print if world.rank == 0 else (lambda *_: None)
    torch.manual_seed(run.seed)

    attention = BACKENDS[run.attn](**dict(run.attn_options))
    d = run.data
    data = open_data(
        dataset_paths(Path(d.path), d.tokenizer or "", d.vocab_size),
        d.tokenizer_kind,
        d.tokenizer,
        seq_len=run.train.model.seq_len,
        micro_batch=run.micro_batch,
        eval_tokens=d.eval_tokens,
        include_tail=run.finish.eval.include_tail,
        device=run.device,
        log=say,
    )
    model, forward, eval_forward, optimizers = make_model(
        MODELS[run.model_arch],
        run.train.model,
        attention,
        bos_id=data.bos_id,
        document_mask=run.document_mask,
        fused_qkv=run.fused_qkv,
        fused_ce=run.fused_ce,
        options=dict(run.model_options),
        fp8=run.fp8,
        fp8_impl=run.fp8_impl,
        device=run.device,
        optim=run.train.optim,
        ns_dtype=run.ns_dtype,
        compiling=run,
    )
    world.prepare(model, optimizers)  # rank 0's initial weights everywhere; Muon's work split over the ranks
    say(f"model: {model.num_params():,} parameters")

    def reserve(step_times: Any, state: TrainState) -> None:
        state.hessian_reserve_seconds = run.hessian_reserve

    state = fit(
        Stepper(model, forward, optimizers, run.train, world=world),
        functools.partial(data.train_batches, rank=world.rank, world_size=world.world_size),
        state=TrainState(),
        report=lambda kind, values: say(values["text"]) if kind == "line" else None,
        hooks=Hooks(after_warmup=reserve),
    )
    result: dict[str, Any] = {
        "status": "ok",
        "steps": state.steps,
        "tokens_per_s": round(state.tokens / state.train_seconds, 1) if state.train_seconds > 0 else None,
    }
    if state.diverged:
        result.update(status="diverged", error=state.divergence)
    else:
        result.update(score(run, model, eval_forward, data, world, file, say))
    for key, value in result.items():  # the result block, as `python -m run` ends: "key: value" lines
        say(f"{key}: {value}")
    if not world.single:
        torch.distributed.destroy_process_group()
    return result


def score(run: RunSettings, model: Any, eval_forward: Any, data: Any, world: World, file: str, say: Any) -> dict:
    """GPTQ's Hessians, then the finish (speedrun.core.pipeline.finish); the artifact is written on rank 0 as
    final_model.<quant>.<compressor> in the current directory."""
    model.eval()  # as the shell scores it: fp8 layers take their bf16 path
    f = run.finish
    t0 = time.perf_counter()
    calibration = gptq_hessians(model, data, f, lambda kind, v: say(v.get("text", ""))) if world.rank == 0 else None
    keys: dict[str, Any] = {}
    if calibration is not None:
        keys["quant_hessian_seconds"] = round(time.perf_counter() - t0, 3)

    def quantized(_: Any, packed: Any) -> None:
        q = f.quant
        assert q is not None
        blob = export_packed(packed, q.compressor, q.level, say, q.pergroup_codec).blob
        Path(f"final_model.{q.name}.{q.compressor}").write_bytes(blob)
        code = Path(file).with_name("train_gpt.py")
        code_bytes = code.stat().st_size if code.is_file() else None
        keys.update(artifact_model_bytes=len(blob), artifact_code_bytes=code_bytes)
        if code_bytes is not None:
            keys.update(artifact_bytes=len(blob) + code_bytes, artifact_ok=len(blob) + code_bytes <= run.cap_bytes)

    def report(kind: str, values: dict[str, Any]) -> None:
        if kind == "line":
            say(values["text"])
        elif "result" in values:  # a phase's score as it ends: a run stopped later still printed it
            res = values["result"]
            say(f"{values['name']}: val_loss {res.val_loss} val_bpb {res.val_bpb} ({values['seconds']:.1f} s)")

    hooks = FinishHooks(quantized=quantized, ttt=TTT[run.ttt] if run.ttt else None)
    hessians = calibration.hessians if calibration is not None else None
    out = finish(model, eval_forward, data, f, report, world=world, hessians=hessians, hooks=hooks)
    keys.update(val_loss=out["eval"].val_loss, val_bpb=out["eval"].val_bpb)
    if "quant" in out:
        keys.update(val_loss_quant=out["quant"].val_loss, val_bpb_quant=out["quant"].val_bpb)
    if "ttt" in out:
        ttt = out["ttt"]
        keys.update(val_bpb_ttt=ttt.val_bpb, val_bpb_ttt_base=ttt.base_val_bpb, ttt_complete=ttt.complete)
    return keys
