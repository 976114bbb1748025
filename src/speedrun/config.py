"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Each YAML under conf/<group>/ starts its defaults list with ``<group>_schema``, so Hydra validates it against
the dataclass here: a misspelt key or a wrong type fails at compose time with Hydra's own message, before any
work is done. ``None`` on a field means "let the resolver (speedrun.plan) pick it for the detected hardware".

Only run.py sees a DictConfig; ``to_config`` turns it into these dataclasses for everything below.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from .paths import CONF_DIR  # noqa: F401 - re-exported for run.py and the tests


@dataclass
class HardwareConfig:
    name: str = "auto"
    """Hardware profile: auto (detect), cpu, t4, a100, h100, b200. A profile smaller than the real device is
    emulated (its dtypes, kernels and memory cap); a larger one is refused."""
    micro_batch: Optional[int] = None
    """Sequences per forward/backward; gradient accumulation makes up budget.tokens_per_step. None: profile default."""
    compile: Optional[bool] = None
    """torch.compile the model. None: on for CUDA, off for CPU (compile time would eat a CPU budget)."""
    memory_cap_gb: Optional[float] = None
    """Cap usable GPU memory (GB). None: the profile's memory when emulating, no cap otherwise."""


@dataclass
class AttnConfig:
    name: str = "auto"
    """Attention backend: auto, sdpa, flex, math (the explicit reference), fa3 (FlashAttention-3 via `kernels`)."""
    kernel: str = "auto"
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


@dataclass
class PrecisionConfig:
    name: str = "auto"
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
    name: str = "constant"
    """constant: one context length (model.seq_len). progressive: context grows by schedule.seq_len. Both use
    the LR warm-up/warm-down below."""
    seq_len: Any = None
    """progressive: "L1@f1,L2@f2,...": train at length L1 until fraction f1 of the budget, then L2 until f2...;
    lengths ascending, fractions ascending, the last 1.0. On the command line quote it:
    'schedule.seq_len="1024@0.1,2048@0.7,3072@1.0"' (a bare comma list is a Hydra sweep)."""
    progress: str = "time"
    """What the fractions measure for switching lengths: time (of budget.train_seconds) or step (of
    budget.max_steps)."""
    rewarmup_steps: int = 10
    """Linear LR re-warm-up over this many steps after each length switch (0: none)."""
    warmup_frac: float = 0.0
    """Fraction of the budget for linear LR warm-up."""
    warmdown_frac: float = 0.2
    """Final fraction of the budget over which LR decays linearly to 0."""


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


@dataclass
class EvalConfig:
    name: str = "standard"
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


@dataclass
class TTTConfig:
    name: str = "off"
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


@dataclass
class QuantConfig:
    name: str = "int8"
    """off; int8: per-row int8 weights (parameter-golf's export); int6: GPTQ on the block matrices with
    Hessians from training batches, embeddings at embed_bits. Scored on the dequantized round trip."""
    compressor: str = "zlib"
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


@dataclass
class LoggerConfig:
    name: str = "console"
    """console, or wandb."""
    log_every_seconds: float = 10.0
    """Seconds between progress lines."""
    project: str = "speedrun"
    """W&B project (logger=wandb)."""
    entity: Optional[str] = None
    """W&B entity (logger=wandb)."""
    mode: str = "auto"
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
    """Seed for model init and data order."""
    name: str = "default"
    """A label for this run, stored with its record."""
    results_db: str = "outputs/results.sqlite"
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
