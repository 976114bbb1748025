"""Schemas of the groups that say what trains: hardware, attn, precision, model, data, optim, schedule, budget."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from speedrun.config.checkpointing import parse_batch
from speedrun.config.choices import (
    HardwareName,
    NSCoefficients,
    PrecisionName,
    Progress,
    ScheduleName,
    SdpaKernel,
    _require,
)
from speedrun.config.specs import parse_count, parse_stages


@dataclass
class HardwareConfig:
    name: HardwareName = HardwareName.auto
    """Hardware profile: auto (detect), cpu, t4, a100, h100, b200. A profile smaller than the real device is
    emulated (its dtypes, kernels and memory cap); a larger one is refused."""
    micro_batch: Any = None
    """Sequences per forward/backward; gradient accumulation makes up budget.tokens_per_step. None: the profile's
    default, or the largest below it that splits budget.tokens_per_step over the ranks and the schedule's lengths
    (a value set here that does not split is refused); auto: the largest that fits the card (or the emulated
    profile's memory cap) and divides the sequences per step (each rank's share: on several ranks every rank
    searches and all run the smallest choice), found during warm-up and recorded in plan.json (an int, "auto" or
    null: typed Any, see parse_batch)."""
    compile: bool | None = None
    """torch.compile the model. None: on for CUDA, off for CPU (compile time would eat a CPU budget)."""
    memory_cap_gb: float | None = None
    """Cap usable GPU memory (GB). None: the profile's memory when emulating, no cap otherwise."""
    memory_snapshot: bool = False
    """Record the CUDA allocation history (torch.cuda.memory._record_memory_history) and, if the run runs out of
    memory, dump it to <run dir>/memory_snapshot.pickle (open it at https://pytorch.org/memory_viz). Costs some
    speed; for diagnosis."""
    threads: int | None = None
    """CPU runs: torch's intra-op threads. None: $OMP_NUM_THREADS when set, else the cores free when the run starts
    (speedrun.hardware.threads: affinity less the cores other work keeps busy, at least one). result.json records
    the count (cpu_threads) and where it came from (cpu_threads_source)."""

    def __post_init__(self) -> None:
        self.micro_batch = parse_batch(self.micro_batch, f"hardware.micro_batch={self.micro_batch}")
        _require(
            self.threads is None or self.threads >= 1,
            f"hardware.threads={self.threads} must be >= 1 (or null: the free cores)",
        )
        _require(
            self.memory_cap_gb is None or self.memory_cap_gb > 0,
            f"hardware.memory_cap_gb={self.memory_cap_gb} must be > 0 (or null)",
        )


@dataclass
class AttnConfig:
    name: str = "auto"
    """Attention backend: auto, sdpa, flex, math (the explicit reference), fa3 (FlashAttention-3 via `kernels`), or
    any backend in speedrun.core.attention.BACKENDS (a class + one conf/attn YAML; see README "Extending")."""
    kernel: SdpaKernel = SdpaKernel.auto
    """For sdpa: auto, flash, cudnn, efficient, math. The chosen kernel is pinned, never a silent fallback."""
    window: int | None = None
    """Sliding-window length in tokens (flex only). None: full causal."""
    document_mask: bool = False
    """Attend only within a document (BOS-delimited). Needs a backend that supports it (flex, math)."""
    fa3_repo: str | None = None
    """fa3 kernel repo on the Hugging Face Hub. None: by capability (sm90: varunneal/flash-attention-3,
    sm80-89: kernels-community/flash-attn3)."""
    fa3_version: int | None = 1
    """fa3 kernel version pin (kernels >= 0.15 needs a version or a revision)."""
    fa3_revision: str | None = None
    """fa3 kernel revision pin (a branch, tag or commit); set it to use a revision instead of fa3_version."""
    fa3_trust_remote_code: bool | None = None
    """Let `kernels` load fa3_repo although its publisher is not on the Hub's trusted list (kernels' own
    trust_remote_code). None: trusted only for the builds speedrun names (attention/fa3.py REPOS); a repo of
    your own choosing needs true."""

    def __post_init__(self) -> None:
        _require(self.window is None or self.window >= 1, f"attn.window={self.window} must be >= 1 (or null: full)")


@dataclass
class PrecisionConfig:
    name: PrecisionName = PrecisionName.auto
    """auto (profile's pick), fp32, bf16 (autocast), fp16 (autocast + GradScaler), fp8 (e4m3/e5m2 scaled matmuls
    for the block linears, the rest bf16; sm89+)."""


@dataclass
class DataConfig:
    name: str = "embedded"
    """embedded (Python docs shipped in the repo), python_sp1024 (built from the Python installation), fineweb_sp1024,
    fineweb_sp8192, fineweb10B_gpt2, the CaseOps fineweb_sp8192_caseops and python_sp1024_caseops (val_bpb on their
    val byte sidecar), or a custom name."""
    path: str | None = None
    """Directory holding fineweb_{train,val}_%06d.bin shards. None for the embedded corpus."""
    tokenizer: str | None = None
    """The shards' tokenizer; its kind follows from the value: ``gpt2`` (tiktoken's GPT-2 encoding, as in
    modded-nanogpt's shards; pip install 'speedrun[gpt2]') or a path ending in ``.tiktoken`` (a local GPT-2
    vocabulary, for offline machines) is a byte-level BPE; any other path is a SentencePiece .model file.
    None for the embedded corpus."""
    vocab_size: int = 1024
    """Tokenizer vocabulary (the embedded corpus trains one of this size)."""
    cache_dir: str = "~/.cache/speedrun"
    """Where the embedded dataset is built on first use."""

    def __post_init__(self) -> None:
        _require(
            self.path is None or self.tokenizer is not None,
            f"data.path={self.path} needs data.tokenizer=<the SentencePiece .model of those shards, or gpt2>",
        )
        # Without shards the embedded corpus is read with the tokenizer it trains itself: a tokenizer given alone
        # would be ignored, and the run would not be the one asked for.
        _require(
            self.tokenizer is None or self.path is not None,
            f"data.tokenizer={self.tokenizer} needs data.path=<the shards tokenized with it> (without data.path the "
            f"embedded corpus uses its own tokenizer); add data.path or drop data.tokenizer",
        )
        _require(self.vocab_size >= 2, f"data.vocab_size={self.vocab_size} must be >= 2")


@dataclass
class OptimConfig:
    name: str = "muon"
    """Muon for matrices + Adam for embeddings and scalars (parameter-golf baseline)."""
    matrix_lr: float = 0.04
    """Muon learning rate for 2-D weights in the blocks."""
    scalar_lr: float = 0.04
    """Adam learning rate for gains, scales and skip weights."""
    embed_lr: float = 0.6
    """Adam learning rate for an untied token embedding."""
    tied_embed_lr: float = 0.05
    """Adam learning rate for a tied embedding (it is also the head)."""
    head_lr: float = 0.008
    """Adam learning rate for an untied output head."""
    muon_momentum: float = 0.95
    """Muon momentum after warm-up."""
    muon_momentum_warmup_start: float = 0.85
    """Muon momentum at step 0, ramped linearly to muon_momentum."""
    muon_momentum_warmup_steps: int | None = None
    """Steps of that ramp (0: none). None: 500, or optim.muon_momentum_warmup_frac of the run when that is set."""
    muon_momentum_warmup_frac: float | None = None
    """The ramp as a fraction of the steps the run will make (speedrun.run.run_steps: the step count of a step
    or token budget, or the steps a time budget's warm-up projects), so a recipe keeps its meaning on another
    budget; the steps used are recorded (plan.json, result.json's muon_momentum_warmup_steps). The record: 1500 of
    ~4,900 steps, 0.306."""
    muon_backend_steps: int = 5
    """Newton-Schulz iterations."""
    beta1: float = 0.9
    """Adam beta1."""
    beta2: float = 0.95
    """Adam beta2."""
    eps: float = 1e-8
    """Adam epsilon."""
    grad_clip: float = 0.0
    """Global grad-norm clip; 0 = off."""
    # parameter-golf's April 2026 record stack (records/track_10min_16mb/2026-04-29_*/train_gpt.py), each off by
    # default: with all of them off a step is today's, bit for bit (tests/model/test_optim_levers.py).
    muon_wd: float = 0.0
    """Decoupled weight decay of Muon's matrices, per unit of learning rate: p *= 1 - lr * muon_wd before each
    update, lr being matrix_lr times the schedule's multiplier (so it warms down with the LR). 0: off. The record:
    0.095."""
    muon_row_normalize: bool = False
    """MuonEq-R: divide each row of Muon's Nesterov update (one row per output unit, in the weight's own (out, in)
    orientation) by its L2 norm before Newton-Schulz, so every output unit enters the orthogonalisation with the
    same norm. false: off. The record: true."""
    ns_coefficients: NSCoefficients = NSCoefficients.quintic
    """Newton-Schulz coefficients: quintic (Muon's (3.4445, -4.775, 2.0315) at every iteration) or polar_express
    (Polar Express: a minimax-optimal (a, b, c) for each iteration, as the record uses; it has 5, so
    muon_backend_steps must be <= 5)."""
    adam_wd: float = 0.0
    """Decoupled weight decay (AdamW's: p *= 1 - lr * adam_wd, lr as scheduled) of the Adam parameters other than
    the token embedding: gains, scales, skip weights, and an untied output head. 0: off. The record: 0.02."""
    embed_wd: float = 0.0
    """The same for the token embedding (which, tied, is also the output head). 0: off. The record: 0.085."""

    def __post_init__(self) -> None:
        # Muon and torch's Adam would refuse most of these only when the optimizers are built, after the data.
        _require(self.name == "muon", f"optim.name={self.name}: muon is the only optimizer; use optim=muon")
        defaults = {f.name: f.default for f in fields(OptimConfig)}

        def check(key: str, ok: bool, valid: str) -> None:
            value = getattr(self, key)
            _require(
                ok and math.isfinite(value),
                f"optim.{key}={value} must be {valid}; e.g. optim.{key}={defaults[key]} (the default)",
            )

        for key in ("matrix_lr", "scalar_lr", "embed_lr", "tied_embed_lr", "head_lr"):
            check(key, getattr(self, key) >= 0, ">= 0 (0 freezes those weights)")
        for key in ("muon_momentum", "muon_momentum_warmup_start", "beta1", "beta2"):
            check(key, 0 <= getattr(self, key) < 1, "in [0, 1)")
        frac = self.muon_momentum_warmup_frac
        _require(
            frac is None or self.muon_momentum_warmup_steps is None,
            f"optim.muon_momentum_warmup_steps={self.muon_momentum_warmup_steps} and optim.muon_momentum_warmup_frac="
            f"{frac} both set the momentum warm-up: set the other to null",
        )
        _require(
            frac is None or (math.isfinite(frac) and 0 <= frac <= 1),
            f"optim.muon_momentum_warmup_frac={frac} must be in [0, 1] (a fraction of the run's steps); e.g. 0.3",
        )
        if frac is None and self.muon_momentum_warmup_steps is None:
            self.muon_momentum_warmup_steps = 500  # parameter-golf's baseline
        _require(
            self.muon_momentum_warmup_steps is None or self.muon_momentum_warmup_steps >= 0,
            f"optim.muon_momentum_warmup_steps={self.muon_momentum_warmup_steps} must be >= 0 (0: no ramp); e.g. "
            f"optim.muon_momentum_warmup_steps=500",
        )
        check("muon_backend_steps", self.muon_backend_steps >= 1, ">= 1")
        # eps = 0 divides by zero in Adam wherever a gradient has always been 0 (an unused embedding row)
        check("eps", self.eps > 0, "> 0")
        check("grad_clip", self.grad_clip >= 0, ">= 0 (0: off)")
        for key in ("muon_wd", "adam_wd", "embed_wd"):
            check(key, getattr(self, key) >= 0, ">= 0 (0: off)")
        # the decay multiplier 1 - lr * wd must stay positive at the peak LR, or the weights flip sign every step
        for key, lrs in (
            ("muon_wd", ("matrix_lr",)),
            ("adam_wd", ("scalar_lr", "head_lr")),
            ("embed_wd", ("embed_lr", "tied_embed_lr")),
        ):
            lr_key = max(lrs, key=lambda k: getattr(self, k))
            _require(
                getattr(self, key) * getattr(self, lr_key) < 1,
                f"optim.{key}={getattr(self, key)} times optim.{lr_key}={getattr(self, lr_key)} must be < 1 (the "
                f"weights are multiplied by 1 - lr * {key} each step); lower optim.{key}",
            )
        _require(
            self.ns_coefficients != NSCoefficients.polar_express or self.muon_backend_steps <= 5,
            f"optim.ns_coefficients=polar_express has 5 iterations, optim.muon_backend_steps="
            f"{self.muon_backend_steps}; set optim.muon_backend_steps=5 (or use optim.ns_coefficients=quintic)",
        )


@dataclass
class ScheduleConfig:
    name: ScheduleName = ScheduleName.constant
    """constant: one context length (model.seq_len). progressive: context grows by schedule.seq_len. Both use
    the LR warm-up/warm-down below."""
    seq_len: Any = None
    """progressive: "L1@f1,L2@f2,...": train at length L1 until fraction f1 of the budget, then L2 until f2...;
    lengths ascending, fractions ascending, the last 1.0. On the command line quote it:
    'schedule.seq_len="1024@0.1,2048@0.7,3072@1.0"' (a bare comma list is a Hydra sweep)."""
    progress: Progress = Progress.time
    """What the fractions measure for switching lengths: time (of budget.train_seconds) or step (of
    budget.max_steps)."""
    rewarmup_steps: int = 10
    """Linear LR re-warm-up over this many steps after each length switch (0: none)."""
    warmup_frac: float = 0.0
    """Fraction of the budget for linear LR warm-up."""
    warmdown_frac: float = 0.2
    """Final fraction of the budget over which LR decays linearly to 0 (to min_lr when that is set)."""
    min_lr: float = 0.0
    """Floor of the warm-down, as a fraction of the peak LR: the multiplier is max((1 - progress) / warmdown_frac,
    min_lr), so it decays linearly as before and is held at min_lr from where the line crosses it to the end.
    0: decay to 0. The record: 0.1."""

    def __post_init__(self) -> None:
        if self.name == ScheduleName.progressive:
            parse_stages(self.seq_len)
        else:
            _require(
                self.seq_len is None,
                "schedule.seq_len is for schedule=progressive; add schedule=progressive or drop it",
            )
        defaults = {f.name: f.default for f in fields(ScheduleConfig)}
        for key in ("warmup_frac", "warmdown_frac"):
            value, default = getattr(self, key), defaults[key]
            _require(
                0 <= value <= 1,
                f"schedule.{key}={value} must be in [0, 1] (a fraction of the budget); e.g. schedule.{key}={default}",
            )
        _require(
            self.warmup_frac + self.warmdown_frac <= 1,
            f"schedule.warmup_frac={self.warmup_frac} + schedule.warmdown_frac={self.warmdown_frac} must be <= 1 "
            f"(together at most the whole budget); lower one of them",
        )
        _require(
            self.rewarmup_steps >= 0,
            f"schedule.rewarmup_steps={self.rewarmup_steps} must be >= 0 (0: none); e.g. schedule.rewarmup_steps=10",
        )
        _require(
            0 <= self.min_lr <= 1,
            f"schedule.min_lr={self.min_lr} must be in [0, 1] (a fraction of the peak LR; 0: decay to 0); e.g. "
            f"schedule.min_lr=0.1",
        )
        _require(
            self.min_lr == 0 or self.warmdown_frac > 0,
            f"schedule.min_lr={self.min_lr} is the floor of the warm-down, and schedule.warmdown_frac=0 has none; "
            f"set schedule.warmdown_frac (e.g. 0.2) or drop schedule.min_lr",
        )

    def stages(self) -> list[tuple[int, float]] | None:
        """[(seq_len, until), ...] for a progressive schedule; None for a constant one."""
        return parse_stages(self.seq_len) if self.name == ScheduleName.progressive else None


@dataclass
class EMAConfig:
    """The top-level ``ema`` key (conf/config.yaml: ``ema: {decay: null}``; set it with ``ema.decay=0.9965``)."""

    decay: float | None = None
    """Exponential moving average of the weights: after every optimizer step ema = decay * ema + (1 - decay) * w,
    fp32 copies of the parameters started from the initial weights (speedrun.core.optim.WeightEMA). The final
    evaluation, the quantized artifact and TTT use the EMA weights; periodic validation scores the live weights.
    It averages over about 1 / (1 - decay) steps. None or 0: off. The record: 0.9965."""
    horizon: float | None = None
    """The EMA's horizon 1 / (1 - decay) as a fraction of the steps the run will make (speedrun.run.run_steps),
    instead of ema.decay: decay = 1 - 1 / (horizon x steps), so a recipe keeps its averaging window on another budget;
    the decay used is recorded (plan.json, result.json's ema_decay). The record: 0.9965 over ~4,900 steps, a horizon
    of ~286 steps, 0.0583."""

    def __post_init__(self) -> None:
        _require(
            self.decay is None or (0 <= self.decay < 1 and math.isfinite(self.decay)),
            f"ema.decay={self.decay} must be in [0, 1) (null or 0: off); e.g. ema.decay=0.9965",
        )
        _require(
            self.horizon is None or (math.isfinite(self.horizon) and 0 < self.horizon <= 1),
            f"ema.horizon={self.horizon} must be in (0, 1] (a fraction of the run's steps); e.g. ema.horizon=0.06",
        )
        _require(
            self.horizon is None or self.decay is None,
            f"ema.decay={self.decay} and ema.horizon={self.horizon} both set the EMA: set the other to null",
        )

    @property
    def on(self) -> bool:
        return bool(self.decay) or self.horizon is not None


@dataclass
class BudgetConfig:
    train_seconds: float | None = None
    """Wall-clock training budget (compile and warm-up excluded). None: the hardware profile's default."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (whichever budget comes first). None: no step limit."""
    tokens: Any = None
    """Stop after this many training tokens (whichever budget comes first): the same amount of training on any
    card. None: no token limit. Set alone (with budget.flops), it lifts the profile's default time budget. An
    integer, also written 2e9 or 2_000_000_000 (typed Any, see parse_count)."""
    flops: float | None = None
    """Stop after this many model FLOPs (the MFU convention: ModelShape.flops_per_token at each stage's seq_len),
    whichever budget comes first; e.g. budget.flops=1e17. None: no FLOPs limit. Like budget.tokens, set without
    budget.train_seconds it lifts the profile's default time budget."""
    tokens_per_step: Any = None
    """Tokens per optimizer step (gradient accumulation fills it). None: the hardware profile's default. An
    integer, also written 524_288 or 5.24288e5 (typed Any, see parse_count)."""
    warmup_steps: int = 1
    """Untimed steps run before training (compile, autotune), after which model and optimizer are restored."""
    target_val_loss: float | None = None
    """Time to target (modded-nanogpt's metric, e.g. 3.28): training stops at the first periodic evaluation
    (eval.every_steps / eval.every_seconds, needed) whose val_loss is at or below this, and result.json records
    reached, time_to_target, steps_to_target and tokens_to_target. The other budgets stay as a ceiling: a run
    that never gets there ends at its budget with reached false. None: no target. Exclusive with
    budget.target_val_bpb."""
    target_val_bpb: float | None = None
    """As budget.target_val_loss, on the periodic evaluation's val_bpb. None: no target."""

    def __post_init__(self) -> None:
        _require(
            self.target_val_loss is None or self.target_val_bpb is None,
            f"budget.target_val_loss={self.target_val_loss} and budget.target_val_bpb={self.target_val_bpb} are "
            "both set: a run has one target; drop one of them (budget.target_val_bpb=null)",
        )
        for key, value in (("target_val_loss", self.target_val_loss), ("target_val_bpb", self.target_val_bpb)):
            _require(
                value is None or (math.isfinite(value) and value > 0),
                f"budget.{key}={value} must be a finite number > 0 (or null: no target)",
            )
        self.tokens = parse_count(self.tokens, "budget.tokens")
        self.tokens_per_step = parse_count(self.tokens_per_step, "budget.tokens_per_step")
        _require(self.max_steps is None or self.max_steps >= 1, f"budget.max_steps={self.max_steps} must be >= 1")
        _require(
            self.tokens_per_step is None or self.tokens_per_step >= 1,
            f"budget.tokens_per_step={self.tokens_per_step} must be >= 1",
        )
        _require(self.warmup_steps >= 0, f"budget.warmup_steps={self.warmup_steps} must be >= 0")
        _require(self.tokens is None or self.tokens >= 1, f"budget.tokens={self.tokens} must be >= 1 (or null)")
        _require(self.flops is None or self.flops > 0, f"budget.flops={self.flops} must be > 0 (or null)")
        _require(
            self.train_seconds is None
            or self.train_seconds > 0
            or self.max_steps is not None
            or self.tokens is not None
            or self.flops is not None,
            "budget.train_seconds must be > 0 unless budget.max_steps, budget.tokens or budget.flops is set",
        )

    @property
    def target(self) -> tuple[str, float] | None:
        """The time-to-target metric and value (("val_loss", 3.28)), or None when no target is set."""
        if self.target_val_loss is not None:
            return "val_loss", float(self.target_val_loss)
        if self.target_val_bpb is not None:
            return "val_bpb", float(self.target_val_bpb)
        return None
