"""The frozen Plan and its parts: what the resolver decided, and the only description of the run after it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from speedrun.config import (
    ArtifactConfig,
    CheckpointConfig,
    EMAConfig,
    LoggerConfig,
    OptimConfig,
    QuantConfig,
    ScheduleConfig,
    TTTConfig,
)
from speedrun.config.choices import NSCoefficients
from speedrun.config.track import TrackConfig
from speedrun.core.model import ModelShape
from speedrun.plan.dist_choice import DistPlan


@dataclass(frozen=True)
class Stage:
    """One context length of the training schedule."""

    seq_len: int
    until: float
    """Train at this length until this fraction of the budget (time or steps, per Plan.stage_progress)."""
    micro_batch: int
    """Sequences per micro-batch at this length (micro-batch tokens stay constant across stages)."""


@dataclass(frozen=True)
class EvalPlan:
    mode: str
    """standard or sliding."""
    stride: int | None
    """sliding: tokens each window advances."""
    document_isolated: bool
    """Score with the document mask on (no attention across BOS)."""
    tokens: int | None
    """Validation tokens to score; None: the whole split."""
    batch_size: int
    """Windows per eval forward."""
    label: str
    """What the scores mean, recorded as eval_mode: e.g. standard, sliding:64+doc."""
    batch_search: bool = False
    """Search the largest batch_size that fits during warm-up (eval.batch_size=auto, or hardware.micro_batch=auto
    with eval.batch_size unset); batch_size is then where the search starts, and plan.json is rewritten with the
    choice."""
    every_steps: int | None = None
    """Periodic validation every this many steps (None: off)."""
    every_seconds: float | None = None
    """Periodic validation every this many train seconds (None: off)."""
    periodic_tokens: int = 65536
    """Validation tokens each periodic evaluation scores (standard windows of model.seq_len)."""
    max_seconds: float | None = None
    """Wall-clock budget of each final scoring pass (eval.max_seconds); None: none."""
    include_tail: bool = False
    """Score the split's tail that does not fill a window of model.seq_len (eval.include_tail)."""

    @property
    def periodic(self) -> bool:
        return self.every_steps is not None or self.every_seconds is not None


@dataclass(frozen=True)
class DataPlan:
    path: str | None
    """Absolute shard directory; None for the embedded corpus."""
    tokenizer: str | None
    """Absolute SentencePiece model; None for the embedded corpus."""
    vocab_size: int
    cache_dir: str
    """Absolute directory where the embedded dataset is built."""
    name: str = "embedded"
    """The data setting's name (data.name): what a track's rules name the contest's data by."""
    tokenizer_kind: str = "sentencepiece"
    """sentencepiece, or tiktoken (data.tokenizer gpt2 or a .tiktoken file): which of speedrun.core.data.TOKENIZERS
    loads it."""


@dataclass(frozen=True)
class KernelPlan:
    """How the run's math is done (the kernel group, resolved): speedrun.plan.kernel_choice decides it."""

    source: str = "default"
    """Where the settings come from: default, tuned:<card>/<model> (a tuned table), or a custom option's name;
    "+set" when command-line fields were applied on top."""
    compile_mode: str = "default"
    """torch.compile mode of the training forward (evaluation always compiles with the default mode)."""
    compile_scope: str = "model"
    """What torch.compile wraps: the whole model, or each block (one shared graph; the rest eager)."""
    cuda_graphs: bool = False
    """Each micro-batch's forward+backward replays a CUDA graph, one per context length."""
    dynamic_shapes: bool = False
    """torch.compile(dynamic=True): one graph for every context length."""
    coordinate_descent_tuning: bool = False
    """inductor tunes its generated Triton kernels by coordinate descent."""
    fused_qkv: bool = False
    """Each block's q, k and v projections run as one matmul in training (speedrun.core.model.CausalSelfAttention)."""
    fused_ce: bool = False
    """The training loss runs as speedrun.core.fused_ce's chunked linear + softcapped cross-entropy."""
    fused_ce_chunk: int = 0
    """Its rows per chunk (0 when off)."""
    fp8: tuple[str, ...] = ()
    """FP8 targets among the block linears (mlp_down, mlp, attn_proj, attn_qkv, all); () for none."""
    fp8_impl: str = "speedrun"
    """speedrun (speedrun.core.fp8) or torchao (torchao.float8)."""
    flex_tiles: str | None = None
    """attn=flex: the tiles passed to both kernels (their kernel_options are in attn_options), or None."""
    flex_smem: tuple[tuple[str, int], ...] = ()
    """attn=flex: estimated shared memory per program of each tiled kernel (speedrun.kernels.tiles), bytes."""
    micro_batch: int | None = None
    """The micro-batch the kernel settings chose (kernel.micro_batch or a tuned table's), which the plan runs;
    None when hardware.micro_batch or the profile's default decided it."""
    profile: bool = False
    """Profile profile_steps training steps after warm-up (untimed, undone)."""
    profile_steps: int = 3

    def result_keys(self) -> dict[str, Any]:
        """What result.json and the results row record, so a sweep over kernel= groups in the report."""
        return {
            "kernel": self.source,
            "kernel_compile_mode": self.compile_mode,
            "kernel_compile_scope": self.compile_scope,
            "kernel_cuda_graphs": self.cuda_graphs,
            "kernel_fp8": ",".join(self.fp8) or "none",
            "kernel_fp8_impl": self.fp8_impl if self.fp8 else None,
            "kernel_flex_tiles": self.flex_tiles,
            "kernel_dynamic_shapes": self.dynamic_shapes,
            "kernel_coordinate_descent": self.coordinate_descent_tuning,
            "kernel_fused_qkv": self.fused_qkv,
            "kernel_fused_ce": self.fused_ce,
            "kernel_fused_ce_chunk": self.fused_ce_chunk or None,
            "kernel_micro_batch": self.micro_batch,
        }

    def describe(self) -> str:
        fp8 = f"fp8 {'+'.join(self.fp8)} ({self.fp8_impl})" if self.fp8 else "no fp8"
        tiles = f", flex {self.flex_tiles}" if self.flex_tiles else ""
        smem = ", smem " + "/".join(f"{part} {b // 1024} KB" for part, b in self.flex_smem) if self.flex_smem else ""
        cdt = " + coordinate descent" if self.coordinate_descent_tuning else ""
        micro = f", micro-batch {self.micro_batch}" if self.micro_batch else ""
        fused = ", fused qkv" if self.fused_qkv else ""
        fused += f", fused loss ({self.fused_ce_chunk} rows a chunk)" if self.fused_ce else ""
        return (
            f"{self.source}: compile {self.compile_mode}{' per block' if self.compile_scope == 'blocks' else ''}"
            f"{' dynamic' if self.dynamic_shapes else ''}{cdt}, "
            f"cuda graphs {'on' if self.cuda_graphs else 'off'}, {fp8}{fused}{tiles}{smem}{micro}"
            + (f", profile {self.profile_steps} steps" if self.profile else "")
        )


@dataclass(frozen=True)
class BudgetPlan:
    """The run's budgets, whichever ends first, resolved once (speedrun.plan.budget); None is "no limit" for each.

    ``seconds`` bounds ``train_seconds`` as result.json measures it: the timed steps plus GPTQ's Hessians after them
    (they read training data, so they are training under parameter-golf's rules). The loop itself stops
    ``hessian_reserve`` seconds earlier, so that both fit."""

    seconds: float | None
    """budget.train_seconds, or the profile's default where it is unset; None: no time limit."""
    steps: int | None
    tokens: int | None
    """Training tokens after which the run ends."""
    flops: float | None
    """Model FLOPs (MFU convention, per stage's seq_len) after which the run ends."""
    hessian_reserve: float | None = 0.0
    """Seconds of ``seconds`` kept for GPTQ's Hessians: quant.reserve_seconds where set; None where they are
    measured in warm-up instead (speedrun.run.quant_phase); 0 where nothing reads training data after the loop
    or there is no time limit."""

    @property
    def measures_reserve(self) -> bool:
        return self.hessian_reserve is None

    def loop_seconds(self, reserve: float) -> float | None:
        """The training loop's own time limit, given the reserve that applies (hessian_reserve, or the measured)."""
        return None if self.seconds is None else self.seconds - reserve

    def text(self) -> str:
        """The budgets, whichever ends first: e.g. "120 s (GPTQ's Hessians within it) or 1000 steps"."""
        if self.hessian_reserve is None:
            reserve = " (GPTQ's Hessians within it, their time measured in warm-up)"
        else:
            reserve = f" ({self.hessian_reserve:g} s of it for GPTQ's Hessians)" if self.hessian_reserve else ""
        parts = [f"{self.seconds:g} s{reserve}"] if self.seconds is not None else []
        parts += [f"{self.steps} steps"] if self.steps else []
        parts += [f"{self.tokens:.4g} tokens"] if self.tokens else []
        parts += [f"{self.flops:.4g} FLOPs"] if self.flops else []
        return " or ".join(parts) or "none"


@dataclass(frozen=True)
class Plan:
    name: str
    seed: int
    device: str
    """torch device: cuda or cpu."""
    hardware: str
    """The profile that sets dtypes, kernels and peaks (requested or detected)."""
    device_name: str
    emulated: bool
    """True when a smaller profile runs on a bigger device (its recipe, capped memory)."""
    memory_cap_gb: float | None
    precision: str
    """fp32, bf16, fp16 or fp8."""
    autocast: str | None
    """Autocast dtype (bf16 or fp16; fp8 runs its block linears in fp8 inside bf16 autocast); None for fp32."""
    grad_scaler: bool
    matmul_dtype: str
    """The dtype whose peak MFU divides by (tf32 for fp32 on sm80+)."""
    card: str | None
    """The card that runs, as named in speedrun.hardware.cards (None: CPU, or a GPU the table does not know)."""
    peak_flops: float | None
    """Dense peak FLOP/s of matmul_dtype on the card that runs (speedrun.hardware.cards): mfu's denominator. None on CPU
    and on a card the table does not know (mfu is then null, never a neighbour's figure)."""
    profile_peak_flops: float | None
    """When emulating: the same peak on the emulated profile (mfu_profile's denominator); else None."""
    ns_dtype: str
    """Dtype of Muon's Newton-Schulz iterations."""
    attn: str
    attn_options: tuple[tuple[str, Any], ...]
    """Constructor options of the attention backend (speedrun.core.attention.get_backend)."""
    attn_kernel: str
    """The kernel that will run, e.g. sdpa:flash."""
    document_mask: bool
    """Train (and evaluate) with attention confined to each BOS-delimited document."""
    model_name: str
    model: ModelShape
    micro_batch: int
    """Sequences per micro-batch at model.seq_len (the longest length)."""
    stages: tuple[Stage, ...]
    """Context-length stages; one for a constant schedule. Tokens per micro-batch and per step are the same in all."""
    stage_progress: str
    """time or step: what Stage.until measures."""
    schedule: ScheduleConfig
    """LR warm-up / warm-down fractions and the re-warm-up after a stage switch."""
    grad_accum: int
    tokens_per_step: int
    budget: BudgetPlan
    """Time, steps, tokens and FLOPs, whichever ends first (budget.train_seconds is read into it, once)."""
    warmup_steps: int
    """Untimed compile/autotune steps, undone before training."""
    eval: EvalPlan
    compile: bool
    memory_estimate_gb: float
    """Rough training memory (plan/memory.py): weights, grads, optimizer, activations, logits, scores."""
    memory_snapshot: bool
    """Record CUDA allocation history and dump it to the run dir if the run runs out of memory."""
    optim: OptimConfig
    quant: QuantConfig
    ttt: TTTConfig
    """TTT settings; batch_size resolved."""
    data: DataPlan
    logger: LoggerConfig
    checkpoint: CheckpointConfig
    model_arch: str = "gpt"
    """model.arch: the class the run builds (speedrun.plan.model_choice)."""
    model_options: tuple[tuple[str, Any], ...] = ()
    """The model class's own knobs (its schema's fields beyond ModelConfig's), sorted (name, value) pairs."""
    micro_batch_search: bool = False
    """hardware.micro_batch=auto: search the largest micro-batch that fits during warm-up (stages and grad_accum
    are replaced with the choice, plan.json rewritten); micro_batch is then where the search starts."""
    kernel: KernelPlan = KernelPlan()
    """Compile mode, CUDA graphs, FP8 targets, flex tiles, profiling (the kernel group, resolved)."""
    dist: DistPlan = DistPlan()
    """Ranks of the run (world_size, nodes, nproc per node, backend, who starts them); one process by default."""
    ema: EMAConfig = field(default_factory=EMAConfig)
    """Weight EMA (decay None: off; the resolver turns 0 into None)."""
    artifact: ArtifactConfig = field(default_factory=ArtifactConfig)
    """How the artifact's code is counted (code_rule)."""
    target_metric: str | None = None
    """budget.target_*: val_loss or val_bpb, the periodic evaluation's metric that ends the run at or below
    target_value (None: no target; the budgets alone end the run)."""
    target_value: float | None = None
    track: TrackConfig = field(default_factory=TrackConfig)
    """The contest's rules the run is held to (track=...; name None: none)."""
    threads: int | None = None
    """hardware.threads: a CPU run's torch threads (None: $OMP_NUM_THREADS, else the free cores when it starts,
    speedrun.hardware.threads)."""

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def eval_tokens(self) -> int | None:
        return self.eval.tokens

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["attn_options"] = dict(self.attn_options)
        return json.loads(json.dumps(d, default=str))  # Choice enums -> their strings

    def levers_text(self) -> str:
        """The record-stack levers that are on, for describe(); "" when all are off."""
        o = self.optim
        on = [f"muon_wd {o.muon_wd:g}"] if o.muon_wd else []
        on += ["MuonEq-R"] if o.muon_row_normalize else []
        on += [f"NS {o.ns_coefficients}"] if o.ns_coefficients != NSCoefficients.quintic else []
        on += [f"adam_wd {o.adam_wd:g}"] if o.adam_wd else []
        on += [f"embed_wd {o.embed_wd:g}"] if o.embed_wd else []
        on += [f"min_lr {self.schedule.min_lr:g}"] if self.schedule.min_lr else []
        if self.ema.on:
            ema = f"{self.ema.decay:g}" if self.ema.decay else f"over {self.ema.horizon:g} of the run's steps"
            on += [f"EMA {ema} (eval and export on the average)"]
        if self.optim.muon_momentum_warmup_frac is not None:
            on += [f"momentum warm-up over {self.optim.muon_momentum_warmup_frac:g} of the run's steps"]
        return ", ".join(on)

    def budget_text(self) -> str:
        """The budgets, whichever ends first, and the target that may end the run before them."""
        text = self.budget.text()
        if self.target_metric is not None:  # a target ends the run early; the budgets above stay its ceiling
            text += f", until periodic {self.target_metric} <= {self.target_value:g}"
        return text

    def describe(self) -> str:
        m = self.model
        stages = ", ".join(f"{st.seq_len} x {st.micro_batch} until {st.until:g}" for st in self.stages)
        lines = [
            f"hardware    {self.hardware}{' (emulated)' if self.emulated else ''} on {self.device_name}"
            + (f", memory cap {self.memory_cap_gb:g} GB" if self.memory_cap_gb else ""),
            f"precision   {self.precision}{' + GradScaler' if self.grad_scaler else ''} (MFU peak: {self.matmul_dtype}"
            + (f" on {self.card})" if self.card else ", no known card: mfu null)" if self.device == "cuda" else ")"),
            f"attention   {self.attn_kernel}{' + document mask' if self.document_mask else ''}",
            f"model       {self.model_name}: {m.n_layer}x{m.d_model}, {m.n_head}/{m.n_kv_head} heads, "
            f"mlp {m.mlp_mult}x, vocab {m.vocab_size}, seq {m.seq_len}",
            f"batch       {self.tokens_per_step} tokens/step = {self.micro_batch} seqs x {m.seq_len} x "
            f"{self.grad_accum} accum"
            + (f" x {self.world_size} ranks" if self.world_size > 1 else "")
            + (" (micro-batch searched in warm-up)" if self.micro_batch_search else ""),
            *(
                [
                    f"ranks       {self.world_size} = {self.dist.nodes} node(s) x {self.dist.nproc}, {self.dist.backend}, "
                    f"started by {self.dist.launch}"
                ]
                if self.world_size > 1
                else []
            ),
            *([f"stages      {stages} (of {self.stage_progress})"] if len(self.stages) > 1 else []),
            f"budget      {self.budget_text()}"
            + f", eval {self.eval.label} on {self.eval.tokens if self.eval.tokens is not None else 'all'} tokens, "
            f"compile {'on' if self.compile else 'off'}, memory estimate {self.memory_estimate_gb:g} GB",
            f"kernel      {self.kernel.describe()}",
            *([f"levers      {self.levers_text()}"] if self.levers_text() else []),
            *([f"track       {self.track.rules_text()}"] if self.track.on else []),
        ]
        return "\n".join(lines)


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2)
