"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Each YAML under conf/<group>/ starts its defaults list with ``<group>_schema``, so Hydra validates it against
the dataclass here: a misspelt key or a wrong type fails at compose time with Hydra's own message, before any
work is done. ``None`` on a field means "let the resolver (speedrun.plan) pick it for the detected hardware".

Fixed value sets are Enums, so Hydra lists the valid values when one is misspelt. Checks that need no device sit
beside their fields, in ``__post_init__`` (run by ``to_config``, before anything is built); checks that need the
device are the resolver's (speedrun.plan).

Only run.py sees a DictConfig; ``to_config`` turns it into these dataclasses, and ``speedrun.plan.resolve``
turns those into the frozen Plan that everything after it reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError
from .paths import CONF_DIR, DEFAULT_RESULTS_DB  # noqa: F401 - CONF_DIR re-exported for run.py and the tests
from .specs import parse_short_chunks, parse_stages, parse_targets


class Choice(str, Enum):
    """A fixed set of string values. Members compare equal to their strings and print as them."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class HardwareName(Choice):
    auto = "auto"
    cpu = "cpu"
    t4 = "t4"
    a100 = "a100"
    h100 = "h100"
    b200 = "b200"

class SdpaKernel(Choice):
    auto = "auto"
    flash = "flash"
    cudnn = "cudnn"
    efficient = "efficient"
    math = "math"

class PrecisionName(Choice):
    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"

class ScheduleName(Choice):
    constant = "constant"
    progressive = "progressive"

class Progress(Choice):
    time = "time"
    step = "step"

class EvalName(Choice):
    standard = "standard"
    sliding = "sliding"

class TTTName(Choice):
    off = "off"
    lora = "lora"

class QuantName(Choice):
    off = "off"
    int8 = "int8"
    int6 = "int6"

class Compressor(Choice):
    zlib = "zlib"
    lzma = "lzma"
    brotli = "brotli"
    zstd = "zstd"

class LoggerName(Choice):
    console = "console"
    wandb = "wandb"

class WandbMode(Choice):
    auto = "auto"
    online = "online"
    offline = "offline"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass
class HardwareConfig:
    name: HardwareName = HardwareName.auto
    """Hardware profile: auto (detect), cpu, t4, a100, h100, b200. A profile smaller than the real device is
    emulated (its dtypes, kernels and memory cap); a larger one is refused."""
    micro_batch: Optional[int] = None
    """Sequences per forward/backward; gradient accumulation makes up budget.tokens_per_step. None: profile default."""
    compile: Optional[bool] = None
    """torch.compile the model. None: on for CUDA, off for CPU (compile time would eat a CPU budget)."""
    memory_cap_gb: Optional[float] = None
    """Cap usable GPU memory (GB). None: the profile's memory when emulating, no cap otherwise."""

    def __post_init__(self) -> None:
        _require(self.micro_batch is None or self.micro_batch >= 1,
                 f"hardware.micro_batch={self.micro_batch} must be >= 1 (or null for the profile's default)")
        _require(self.memory_cap_gb is None or self.memory_cap_gb > 0,
                 f"hardware.memory_cap_gb={self.memory_cap_gb} must be > 0 (or null)")


@dataclass
class AttnConfig:
    name: str = "auto"
    """Attention backend: auto, sdpa, flex, math (the explicit reference), fa3 (FlashAttention-3 via `kernels`), or
    any backend registered in speedrun.attention (one module + one conf/attn YAML; see README "Extending")."""
    kernel: SdpaKernel = SdpaKernel.auto
    """For sdpa: auto, flash, cudnn, efficient, math. The chosen kernel is pinned, never a silent fallback."""
    window: Optional[int] = None
    """Sliding-window length in tokens (flex only). None: full causal."""
    document_mask: bool = False
    """Attend only within a document (BOS-delimited). Needs a backend that supports it (flex, math)."""
    block_m: Optional[int] = None
    """flex Triton BLOCK_M. None: from the hardware profile."""
    block_n: Optional[int] = None
    """flex Triton BLOCK_N. None: from the hardware profile."""
    num_warps: Optional[int] = None
    """flex Triton num_warps. None: Triton's default."""
    num_stages: Optional[int] = None
    """flex Triton num_stages. None: Triton's default."""
    fa3_repo: Optional[str] = None
    """fa3 kernel repo on the Hugging Face Hub. None: by capability (sm90: varunneal/flash-attention-3,
    sm80-89: kernels-community/flash-attn3)."""
    fa3_version: Optional[int] = 1
    """fa3 kernel version pin (kernels >= 0.15 needs a version or a revision)."""
    fa3_revision: Optional[str] = None
    """fa3 kernel revision pin (a branch, tag or commit); set it to use a revision instead of fa3_version."""

    def __post_init__(self) -> None:
        _require(self.window is None or self.window >= 1, f"attn.window={self.window} must be >= 1 (or null: full)")
        for key in ("block_m", "block_n", "num_warps", "num_stages"):
            value = getattr(self, key)
            _require(value is None or value >= 1, f"attn.{key}={value} must be >= 1 (or null: the default)")


@dataclass
class PrecisionConfig:
    name: PrecisionName = PrecisionName.auto
    """auto (profile's pick), fp32, bf16 (autocast), fp16 (autocast + GradScaler), fp8 (e4m3/e5m2 scaled matmuls
    for the block linears, the rest bf16; sm89+)."""


@dataclass
class ModelConfig:
    name: str = "auto"
    """Preset name. auto: the hardware profile's default model (tiny on CPU, pgolf_baseline on a GPU); shape
    fields set on the command line (model.n_layer=6) override the preset's."""
    vocab_size: Optional[int] = None
    """Token vocabulary. None: the data's tokenizer vocabulary."""
    n_layer: Optional[int] = None
    """Transformer blocks (None: from the preset)."""
    d_model: Optional[int] = None
    """Residual width (None: from the preset)."""
    n_head: Optional[int] = None
    """Query heads (None: from the preset)."""
    n_kv_head: Optional[int] = None
    """Key/value heads (grouped-query attention); must divide n_head (None: from the preset)."""
    mlp_mult: Optional[int] = None
    """MLP hidden width = mlp_mult * d_model, ReLU^2 (None: from the preset)."""
    seq_len: Optional[int] = None
    """Training context length in tokens (None: from the preset)."""
    tie_embeddings: Optional[bool] = None
    """Share the token embedding with the output head (None: from the preset)."""
    logit_softcap: float = 30.0
    """softcap * tanh(logits / softcap); 0 turns it off."""
    rope_base: float = 10000.0
    """RoPE base frequency."""
    qk_norm: bool = True
    """RMS-normalise queries and keys per head."""

    def __post_init__(self) -> None:
        # Each set field alone; how they fit together (divisibility, RoPE) is ModelShape's check, once resolved.
        for key in ("vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "mlp_mult", "seq_len"):
            value = getattr(self, key)
            _require(value is None or value >= 1, f"model.{key}={value} must be >= 1 (or null: from the preset)")
        _require(self.logit_softcap >= 0, f"model.logit_softcap={self.logit_softcap} must be >= 0 (0 turns it off)")


@dataclass
class DataConfig:
    name: str = "embedded"
    """embedded (Python docs shipped in the repo), fineweb_sp1024, fineweb_sp8192, or a custom name."""
    path: Optional[str] = None
    """Directory holding fineweb_{train,val}_%06d.bin shards. None for the embedded corpus."""
    tokenizer: Optional[str] = None
    """SentencePiece .model file. None for the embedded corpus."""
    vocab_size: int = 1024
    """Tokenizer vocabulary (the embedded corpus trains one of this size)."""
    cache_dir: str = "~/.cache/speedrun"
    """Where the embedded dataset is built on first use."""

    def __post_init__(self) -> None:
        _require(self.path is None or self.tokenizer is not None,
                 f"data.path={self.path} needs data.tokenizer=<the SentencePiece .model of those shards>")
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
    muon_momentum_warmup_steps: int = 500
    """Steps of that ramp."""
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
    """Final fraction of the budget over which LR decays linearly to 0."""

    def __post_init__(self) -> None:
        if self.name == ScheduleName.progressive:
            parse_stages(self.seq_len)
        else:
            _require(self.seq_len is None,
                     "schedule.seq_len is for schedule=progressive; add schedule=progressive or drop it")
        _require(0 <= self.warmup_frac <= 1 and 0 <= self.warmdown_frac <= 1
                 and self.warmup_frac + self.warmdown_frac <= 1,
                 f"schedule.warmup_frac={self.warmup_frac} and warmdown_frac={self.warmdown_frac} must be fractions "
                 f"of the budget that add up to at most 1")
        _require(self.rewarmup_steps >= 0, f"schedule.rewarmup_steps={self.rewarmup_steps} must be >= 0")

    def stages(self) -> Optional[list[tuple[int, float]]]:
        """[(seq_len, until), ...] for a progressive schedule; None for a constant one."""
        return parse_stages(self.seq_len) if self.name == ScheduleName.progressive else None


@dataclass
class BudgetConfig:
    train_seconds: Optional[float] = None
    """Wall-clock training budget (compile and warm-up excluded). None: the hardware profile's default."""
    max_steps: Optional[int] = None
    """Stop after this many optimizer steps (whichever of the two budgets comes first). None: no step limit."""
    tokens_per_step: Optional[int] = None
    """Tokens per optimizer step (gradient accumulation fills it). None: the hardware profile's default."""
    warmup_steps: int = 1
    """Untimed steps run before training (compile, autotune), after which model and optimizer are restored."""

    def __post_init__(self) -> None:
        _require(self.max_steps is None or self.max_steps >= 1, f"budget.max_steps={self.max_steps} must be >= 1")
        _require(self.tokens_per_step is None or self.tokens_per_step >= 1,
                 f"budget.tokens_per_step={self.tokens_per_step} must be >= 1")
        _require(self.warmup_steps >= 0, f"budget.warmup_steps={self.warmup_steps} must be >= 0")
        _require(self.train_seconds is None or self.train_seconds > 0 or self.max_steps is not None,
                 "budget.train_seconds must be > 0 unless budget.max_steps is set")


@dataclass
class EvalConfig:
    name: EvalName = EvalName.standard
    """standard: non-overlapping windows of model.seq_len; sliding: windows of model.seq_len advancing by
    eval.stride, each val token scored exactly once with at least seq_len - stride tokens of context."""
    tokens: Optional[int] = None
    """Validation tokens to score. None: the hardware profile's default; 0: the whole split."""
    batch_size: Optional[int] = None
    """Windows per eval forward. None: hardware.micro_batch."""
    stride: Optional[int] = None
    """eval=sliding: tokens each window advances (1 <= stride <= model.seq_len); stride == seq_len is the
    standard eval. Must be unset for eval=standard."""
    document_isolated: bool = False
    """Score with no attention across BOS (each token sees only its own document), through the attention
    backend's document mask: needs attn=flex or attn=math."""

    def __post_init__(self) -> None:
        if self.name == EvalName.sliding:
            _require(self.stride is not None and self.stride >= 1,
                     f"eval=sliding needs eval.stride >= 1 (at most model.seq_len), got {self.stride}; "
                     f"use e.g. eval.stride=64")
        else:
            _require(self.stride is None, "eval.stride is for eval=sliding; use eval=sliding eval.stride=N, or drop "
                                          "eval.stride")
        _require(self.tokens is None or self.tokens >= 0, f"eval.tokens={self.tokens} must be >= 0 (0: all)")
        _require(self.batch_size is None or self.batch_size >= 1, f"eval.batch_size={self.batch_size} must be >= 1")


@dataclass
class TTTConfig:
    name: TTTName = TTTName.off
    """off, or lora: score-first test-time training at eval, per document, on the (dequantized) model."""
    rank: int = 8
    """LoRA rank of every adapter."""
    lr: float = 0.01
    """Adam learning rate of the adapters."""
    beta1: float = 0.9
    """Adam beta1 of the adapters."""
    beta2: float = 0.95
    """Adam beta2 of the adapters."""
    weight_decay: float = 0.0
    """AdamW (decoupled) weight decay of the adapters."""
    chunk_size: int = 256
    """Tokens per chunk: each chunk is scored, then the adapters take one step on it."""
    short_chunks: str = ""
    """Chunk sizes for short documents, "LEN:CHUNK,...", e.g. "256:8,2000:24": a document with at most LEN
    scored tokens uses CHUNK (first matching LEN in ascending order); longer ones use chunk_size. "" = off."""
    targets: str = "all"
    """Block linears that get adapters: a preset (all, no_qv, qkvo, qv) or a comma list of q, k, v, o (attention),
    up, down (MLP). The output head cannot: the GPT applies its weight with F.linear, not a module call."""
    batch_size: Optional[int] = None
    """Documents adapted side by side (independent adapters). None: the eval batch size."""
    max_seconds: Optional[float] = None
    """Wall-clock budget for TTT; when spent it stops after the current chunk and records what was scored
    (ttt_tokens_scored, ttt_fraction). None: no limit."""

    def __post_init__(self) -> None:
        parse_targets(self.targets)
        parse_short_chunks(self.short_chunks)
        _require(self.rank >= 1 and self.chunk_size >= 1 and (self.batch_size is None or self.batch_size >= 1),
                 f"ttt.rank ({self.rank}), ttt.chunk_size ({self.chunk_size}) and ttt.batch_size ({self.batch_size}) "
                 f"must be >= 1; use e.g. ttt.rank=8")
        _require(self.lr > 0, f"ttt.lr={self.lr} must be > 0; use e.g. ttt.lr=0.01")
        _require(self.max_seconds is None or self.max_seconds > 0,
                 f"ttt.max_seconds={self.max_seconds} must be > 0; use null for no limit")

    def chunk_sizes(self) -> list[int]:
        """Every chunk size TTT may use (chunk_size and the short-document ones)."""
        return [self.chunk_size] + [c for _, c in parse_short_chunks(self.short_chunks)]


@dataclass
class QuantConfig:
    name: QuantName = QuantName.int8
    """off; int8: per-row int8 weights (parameter-golf's export); int6: GPTQ on the block matrices with
    Hessians from training batches, embeddings at embed_bits. Scored on the dequantized round trip."""
    compressor: Compressor = Compressor.zlib
    """zlib, lzma (stdlib), brotli, zstd (the `compress` extra: pip install 'speedrun[compress]')."""
    level: int = 9
    """Compression level (zlib 0-9, lzma 0-9, brotli 0-11, zstd 1-22)."""
    cap_bytes: int = 16_000_000
    """Artifact size limit; recorded as artifact_ok."""
    bits: int = 6
    """int6: bits of the GPTQ block matrices (values in [-(2^(bits-1)-1), 2^(bits-1)-1], stored one per byte)."""
    embed_bits: int = 8
    """int6: bits of the token embedding (and untied lm_head): per-row round-to-nearest with the clip search."""
    calib_batches: int = 8
    """int6: training micro-batches whose activations make the GPTQ Hessians (never validation data)."""
    damp: float = 0.01
    """int6: GPTQ dampening, added to the Hessian diagonal as damp x its mean."""
    block_size: int = 128
    """int6: GPTQ column block size (error propagation is done lazily per block)."""
    clip_ratios: list[float] = field(default_factory=lambda: [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7])
    """int6: per-row clip search candidates, fractions of the row's absmax; each row keeps the one with the
    least Hessian-diagonal-weighted rounding error."""

    def __post_init__(self) -> None:
        _require(2 <= self.bits <= 8 and 2 <= self.embed_bits <= 8,
                 f"quant.bits={self.bits} and quant.embed_bits={self.embed_bits} must be in 2..8 (one int8 byte per "
                 f"value); use e.g. quant.bits=6 quant.embed_bits=8")
        _require(self.calib_batches >= 1 and self.block_size >= 1 and self.damp >= 0,
                 f"quant.calib_batches ({self.calib_batches}) and quant.block_size ({self.block_size}) must be >= 1 "
                 f"and quant.damp ({self.damp}) >= 0; use the int6 defaults (8, 128, 0.01)")
        _require(bool(self.clip_ratios) and all(0 < r <= 1 for r in self.clip_ratios),
                 f"quant.clip_ratios={list(self.clip_ratios)} must be fractions in (0, 1]; use e.g. [1.0,0.9,0.8]")
        _require(self.cap_bytes >= 1, f"quant.cap_bytes={self.cap_bytes} must be >= 1")


@dataclass
class LoggerConfig:
    name: LoggerName = LoggerName.console
    """console, or wandb."""
    log_every_seconds: float = 10.0
    """Seconds between progress lines."""
    project: str = "speedrun"
    """W&B project (logger=wandb)."""
    entity: Optional[str] = None
    """W&B entity (logger=wandb)."""
    mode: WandbMode = WandbMode.auto
    """W&B mode: auto (online if a key is set, else offline), online, offline."""


@dataclass
class Config:
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    attn: AttnConfig = field(default_factory=AttnConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ttt: TTTConfig = field(default_factory=TTTConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    seed: int = 0
    """Seed for model initialisation, TTT's adapter init and document order. It does not change the training data
    order: every run reads the shards in the same order from the same position."""
    name: str = "default"
    """A label for this run, stored with its record."""
    results_db: str = DEFAULT_RESULTS_DB
    """Results database (relative paths are taken from the directory `python -m run` was started in)."""
    sweep: Optional[str] = None
    """Sweep id, set by multirun; recorded with each run."""


GROUPS = {
    "hardware": HardwareConfig,
    "attn": AttnConfig,
    "precision": PrecisionConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "eval": EvalConfig,
    "ttt": TTTConfig,
    "quant": QuantConfig,
    "logger": LoggerConfig,
}


def register_configs() -> None:
    """Register the top-level schema and one ``<group>_schema`` per group (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for group, schema in GROUPS.items():
        cs.store(group=group, name=f"{group}_schema", node=schema)


def to_config(cfg: DictConfig | dict[str, Any]) -> Config:
    """A composed DictConfig (or plain dict) -> typed Config, validated against the schemas."""
    structured = OmegaConf.merge(OmegaConf.structured(Config), cfg)
    obj = OmegaConf.to_object(structured)
    assert isinstance(obj, Config)
    return obj
