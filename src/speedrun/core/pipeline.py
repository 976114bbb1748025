"""A run's order around its training, from plain settings: building the data streams and the model (open_data,
make_model), then, after speedrun.core.train.fit, GPTQ's Hessians (gptq_hessians) and the finish: scoring the
trained model, the quantized one and score-first TTT (finish), each phase reported through one Report. The shell
finds the dataset's files (building the embedded corpus, checking a user's shards) and the model's class (the
model.arch registry), then hands them here, and keeps the record of what each phase reports.

The attention backend is looked up by name by the shell, once; the model never sees a backend string.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from speedrun.core.compile import CompilePlan, compile_model
from speedrun.core.data import (
    TOKENIZERS,
    ByteLUTs,
    DatasetPaths,
    TokenStream,
    load_val_bytes,
    load_val_tokens,
    read_header,
)
from speedrun.core.evaluate import EvalResult, document_mask, run_eval
from speedrun.core.fp8 import convert_linears, convert_torchao
from speedrun.core.gptq import Calibration
from speedrun.core.model import ModelShape
from speedrun.core.optim import OptimSettings, build_optimizers
from speedrun.core.quant import HESSIANS, Quantized, QuantSettings, dequantize_state_dict, quantize_model
from speedrun.core.train import autocast_dtype
from speedrun.progress import Progress, Report

if TYPE_CHECKING:  # a TTT-off run's file carries no TTT: the shell hands its pass in (core.ttt_score.TTT)
    from speedrun.core.ttt_lora import TTTSettings


@dataclass
class DataBundle:
    paths: DatasetPaths
    luts: ByteLUTs
    bos_id: int
    val_tokens: torch.Tensor
    train_batches: Callable[..., TokenStream]
    """train_batches(seq_len=None, micro_batch=None, position=0, rank=0, world_size=1): a deterministic stream of
    micro-batches from token ``position`` of the training shards (defaults: the run's longest length and its
    micro-batch); with rank/world_size, that rank's share of every span of world_size micro-batches."""
    train_tokens: int
    """Tokens in the training shards (to report how many passes a run made over them)."""


def open_data(
    paths: DatasetPaths,
    tokenizer_kind: str,
    tokenizer: str | None,
    *,
    seq_len: int,
    micro_batch: int,
    eval_tokens: int | None,
    include_tail: bool,
    device: str,
    log: Callable[[str], None],
) -> DataBundle:
    """The tokenizer's byte tables, the validation tokens (the first ``eval_tokens``; None: the whole split) and
    the training streams of the dataset at ``paths``."""
    luts, bos_id = TOKENIZERS[tokenizer_kind](paths, tokenizer)
    val_tokens = load_val_tokens(
        paths.val, eval_tokens, seq_len, vocab_size=paths.vocab_size, include_tail=include_tail
    )
    sidecar = load_val_bytes(paths, val_tokens.numel())  # CaseOps data: BPB on the original text's bytes
    if sidecar is not None:
        luts = dataclasses.replace(luts, sidecar=sidecar)
    log(
        f"data: {len(paths.train)} train shard(s), {val_tokens.numel() - 1:,} val tokens scored"
        f"{', bytes from the val byte sidecar' if sidecar is not None else ''}, "
        f"tokenizer {paths.tokenizer} (vocab {paths.vocab_size})"
    )
    pin = device == "cuda"

    def train_batches(
        seq_len: int = seq_len,
        micro_batch: int = micro_batch,
        position: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> TokenStream:
        stream = TokenStream(
            paths.train,
            seq_len,
            micro_batch,
            rank=rank,
            world_size=world_size,
            vocab_size=paths.vocab_size,
            pin_memory=pin,
        )
        stream.load_state_dict({"position": position})
        return stream

    return DataBundle(
        paths=paths,
        luts=luts,
        bos_id=bos_id,
        val_tokens=val_tokens,
        train_batches=train_batches,
        train_tokens=sum(read_header(p) for p in paths.train),
    )


def make_model(
    model_class: Callable[..., Any],
    shape: ModelShape,
    attention: Any,
    *,
    bos_id: int,
    document_mask: bool,
    fused_qkv: bool,
    options: dict[str, Any],
    fused_ce: int = 0,
    fp8: tuple[str, ...],
    fp8_impl: str,
    device: str,
    optim: OptimSettings,
    ns_dtype: str,
    compiling: CompilePlan,
) -> tuple[Any, Any, Any, list]:
    """-> (model, train forward, eval forward returning per-token nats, optimizers). ``compiling``: whether and
    how torch.compile wraps it (speedrun.core.compile.compile_model). ``fused_ce``: rows per chunk of the fused
    training loss (kernel.fused_ce; the Plan allows it only for a model with a ``fused_ce`` attribute), 0 for off."""
    # bos_id switches on document masking in the model; only backends that can mask documents get it. doc_bos_id
    # is the token alone, for model levers that must not cross documents (model.smear_gate) whatever the mask.
    model = model_class(
        shape,
        attention,
        bos_id=bos_id if document_mask else None,
        fused_qkv=fused_qkv,
        doc_bos_id=bos_id,
        options=options,
    )
    if fused_ce:
        model.fused_ce = fused_ce
    if fp8:  # precision=fp8 resolves to every block linear; kernel.fp8 picks some
        (convert_torchao if fp8_impl == "torchao" else convert_linears)(model.blocks, fp8)
    model = model.to(device)
    optimizers = build_optimizers(model, optim, ns_dtype=torch.bfloat16 if ns_dtype == "bf16" else torch.float32)
    if compiling.compile:
        # Static shapes: one graph per context length, all compiled during warm-up (progressive schedules
        # switch lengths mid-run); raise dynamo's per-function cache limit so those graphs, plus eval's, fit.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    compiled, compiled_eval, mark_step = compile_model(model, compiling)

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if mark_step:  # inductor's CUDA graphs (compile_mode reduce-overhead / max-autotune): a new micro-batch
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(x, y)

    def eval_forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return compiled_eval(x, y, reduction="none")

    return model, forward, eval_forward, optimizers


# ---------------------------------------------------------------------------------------------------------
# after training: eval -> quant -> TTT


@dataclass(frozen=True)
class EvalSettings:
    """How a score reads the validation tokens: the eval group's windows and limits (what ``eval.*`` resolves
    to, less its label)."""

    mode: str
    stride: int | None
    batch_size: int
    max_seconds: float | None = None
    include_tail: bool = False
    document_isolated: bool = False


@dataclass(frozen=True)
class FinishSettings:
    """The phases after training: None for quant or ttt skips that phase."""

    seq_len: int
    device: str
    autocast: str | None
    eval: EvalSettings
    quant: QuantSettings | None = None
    ttt: TTTSettings | None = None


@dataclass
class FinishHooks:
    """Control the shell takes over the finish (None: nothing): ``quantized(quantized, packed)`` on rank 0 right
    after quantizing, before the round-trip score (the shell writes the artifact beside it); ``tick()`` after each
    scored batch, on the scoring thread; ``ttt_clock()`` when TTT's clock starts. ``ttt``: the TTT pass
    (speedrun.core.ttt_score.TTT[ttt.name]), which the shell looks up, so a TTT-off run's file carries none."""

    quantized: Callable[[Quantized, dict[str, dict[str, torch.Tensor]]], None] | None = None
    tick: Callable[[], Any] | None = None
    ttt_clock: Callable[[], None] | None = None
    ttt: Callable[..., Any] | None = None


class _TickingProgress(Progress):
    """A score's progress line that also calls ``tick`` after every batch."""

    def __init__(self, label: str, log: Callable[[str], None], tick: Callable[[], Any] | None):
        super().__init__(label, log)
        self.between = tick

    def tick(self, done: float, total: float | None = None) -> bool:
        if self.between is not None:
            self.between()
        return super().tick(done, total)


def score_model(
    model: Any,
    eval_forward: Callable,
    data: DataBundle,
    s: FinishSettings,
    label: str,
    report: Report,
    *,
    world: Any = None,
    tick: Callable[[], Any] | None = None,
) -> EvalResult:
    """The model as it is now over the validation tokens with the eval group's windows (split over the ranks),
    within eval.max_seconds."""
    e = s.eval
    with document_mask(model, data.bos_id if e.document_isolated else None):
        return run_eval(
            e.mode,
            eval_forward,
            data.val_tokens,
            data.luts,
            seq_len=s.seq_len,
            stride=e.stride,
            batch_size=e.batch_size,
            device=s.device,
            autocast_dtype=autocast_dtype(s.autocast),
            shard=world,
            progress=_TickingProgress(label, _line(report), tick),
            max_seconds=e.max_seconds,
            include_tail=e.include_tail,
        )


def finish(
    model: Any,
    eval_forward: Callable,
    data: DataBundle,
    s: FinishSettings,
    report: Report,
    *,
    world: Any = None,
    hessians: dict[str, torch.Tensor] | None = None,
    hooks: FinishHooks | None = None,
) -> dict[str, Any]:
    """Score the trained model, quantize it and score the dequantized weights (s.quant set), then score-first TTT
    on the model as it is then (s.ttt set and a pass in hooks.ttt). Each phase reports ("phase", {"name": ...}) as
    it starts and ("phase", {"name": ..., "seconds": its score's, "result": ...}) as it ends. Returns {"eval":
    EvalResult, "quant": EvalResult, "quantized": Quantized (rank 0; None elsewhere), "ttt": TTTResult} for the
    phases that ran. ``hessians``: GPTQ's, collected after training (None: collected here)."""
    out: dict[str, Any] = {"eval": score_trained(model, eval_forward, data, s, report, world=world, hooks=hooks)}
    if s.quant is not None:
        out["quant"], out["quantized"] = score_quantized(
            model, eval_forward, data, s, report, world=world, hessians=hessians, hooks=hooks
        )
    if s.ttt is not None and hooks is not None and hooks.ttt is not None:
        out["ttt"] = score_ttt(model, data, s, report, world=world, hooks=hooks)
    return out


def score_trained(
    model: Any,
    eval_forward: Callable,
    data: DataBundle,
    s: FinishSettings,
    report: Report,
    *,
    world: Any = None,
    hooks: FinishHooks | None = None,
) -> EvalResult:
    """The eval phase: val_loss and val_bpb of the model as training left it (its EMA weights when it kept one)."""
    report("phase", {"name": "eval"})
    t0 = time.perf_counter()
    res = score_model(model, eval_forward, data, s, "eval", report, world=world, tick=hooks.tick if hooks else None)
    report("phase", {"name": "eval", "seconds": time.perf_counter() - t0, "result": res})
    return res


def score_quantized(
    model: Any,
    eval_forward: Callable,
    data: DataBundle,
    s: FinishSettings,
    report: Report,
    *,
    world: Any = None,
    hessians: dict[str, torch.Tensor] | None = None,
    hooks: FinishHooks | None = None,
) -> tuple[EvalResult, Quantized | None]:
    """The quant phase: quantize the model (rank 0), load the dequantized weights into it and score that round
    trip; hooks.quantized gets the codes before the score starts."""
    report("phase", {"name": "quant"})
    rank0 = world is None or world.rank == 0
    quantized = _quantize(model, data, s, report, hessians) if rank0 else None

    def codes() -> dict[str, dict[str, torch.Tensor]]:
        assert quantized is not None  # rank 0's
        return quantized.packed

    # every rank scores rank 0's codes (the export ran on rank 0 alone)
    packed = world.from_rank0(codes) if world is not None else codes()
    if quantized is not None and hooks is not None and hooks.quantized is not None:
        hooks.quantized(quantized, packed)
    restored = dequantize_state_dict(packed)
    model.load_state_dict({k: restored[k].to(v.dtype) for k, v in model.state_dict().items()})
    t0 = time.perf_counter()
    label = "eval (quantized)"
    res = score_model(model, eval_forward, data, s, label, report, world=world, tick=hooks.tick if hooks else None)
    report("phase", {"name": "quant", "seconds": time.perf_counter() - t0, "result": res, "quantized": quantized})
    return res, quantized


def score_ttt(
    model: Any, data: DataBundle, s: FinishSettings, report: Report, *, world: Any, hooks: FinishHooks
) -> Any:
    """The TTT phase: hooks.ttt (score-first TTT, speedrun.core.ttt_score) on the model as it is now."""
    assert s.ttt is not None and hooks.ttt is not None
    report("phase", {"name": "ttt"})
    t0 = time.perf_counter()
    res = hooks.ttt(
        model,
        data.val_tokens,
        data.luts,
        s.ttt,
        bos_id=data.bos_id,
        seq_len=s.seq_len,
        device=s.device,
        autocast_dtype=autocast_dtype(s.autocast),
        log=_line(report),
        shard=world,
        on_clock=hooks.ttt_clock,
    )
    report("phase", {"name": "ttt", "seconds": time.perf_counter() - t0, "result": res})
    return res


def gptq_hessians(model: Any, data: DataBundle, s: FinishSettings, report: Report) -> Calibration | None:
    """GPTQ's Hessians of the model as it is (quant=int6; None for a quantizer without them), from a fresh stream of
    training batches, never validation data: GPTQ fits the weights to it. A run collects them right after its last
    step, on the training clock."""
    q = s.quant
    if q is None or q.name not in HESSIANS:
        return None
    return HESSIANS[q.name](
        model,
        data.train_batches(),
        q.calib_batches,
        device=s.device,
        autocast_dtype=autocast_dtype(s.autocast),
        head=q.embed_gptq,
        log=_line(report),
    )


def _quantize(
    model: Any,
    data: DataBundle,
    s: FinishSettings,
    report: Report,
    hessians: dict[str, torch.Tensor] | None,
) -> Quantized:
    """Rank 0: the model's codes; GPTQ's Hessians collected here from a fresh training stream when none came."""
    q = s.quant
    assert q is not None
    extra: dict[str, Any] = {}
    if hessians is None and (calibration := gptq_hessians(model, data, s, report)) is not None:
        hessians = calibration.hessians
        extra["quant_hessian_seconds"] = round(calibration.seconds, 3)
    progress = Progress(f"gptq: int{q.bits}", _line(report), unit="matrices") if q.name != "int8" else None
    quantized = quantize_model(q, model, hessians or {}, progress)
    quantized.extra.update(extra)
    return quantized


def _line(report: Report) -> Callable[[str], None]:
    return lambda text: report("line", {"text": text})
