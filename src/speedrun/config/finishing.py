"""Schemas of the groups that say what happens after training and how it is reported: eval, ttt, logger, and
quant (its schema is config/quant.py, re-exported here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speedrun.config.checkpointing import parse_batch
from speedrun.config.choices import EvalName, LoggerName, TTTName, WandbMode, _require
from speedrun.config.quant import QuantConfig
from speedrun.config.specs import parse_count, parse_short_chunks, parse_targets

__all__ = ["EvalConfig", "LoggerConfig", "QuantConfig", "TTTConfig"]  # QuantConfig lives in config/quant.py


@dataclass
class EvalConfig:
    name: EvalName = EvalName.standard
    """standard: non-overlapping windows of model.seq_len; sliding: windows of model.seq_len advancing by
    eval.stride, each val token scored exactly once with at least seq_len - stride tokens of context."""
    tokens: Any = None
    """Validation tokens to score: the first N of the split. None (or 0): the whole split, as parameter-golf
    scores it; runs record eval_tokens and eval_fingerprint, and the report compares only runs of one set. An
    integer, also written 1e6 or 1_000_000 (typed Any, see parse_count)."""
    batch_size: Any = None
    """Windows per eval forward. None: hardware.micro_batch (searched too when that is auto); auto: the largest
    that fits, found on the device during warm-up, so an eval never runs out of memory where training did not."""
    stride: int | None = None
    """eval=sliding: tokens each window advances (1 <= stride <= model.seq_len); stride == seq_len is the
    standard eval. Must be unset for eval=standard."""
    document_isolated: bool = False
    """Score with no attention across BOS (each token sees only its own document), through the attention
    backend's document mask: needs attn=flex or attn=math."""

    every_steps: int | None = None
    """Periodic validation every this many optimizer steps (None: off), on the first eval.periodic_tokens validation
    tokens with standard windows; its time is kept out of train_seconds (val_seconds_periodic) and each result is
    a val_bpb record in metrics.jsonl. The final evaluation is unchanged."""
    every_seconds: float | None = None
    """Periodic validation every this many seconds of training (train_seconds; None: off)."""
    periodic_tokens: Any = 65536
    """Validation tokens each periodic evaluation scores (a fixed slice from the start of the val split); an
    integer, also written 6.5536e4 or 65_536 (typed Any, see parse_count)."""

    def __post_init__(self) -> None:
        self.batch_size = parse_batch(self.batch_size, f"eval.batch_size={self.batch_size}")
        self.tokens = parse_count(self.tokens, "eval.tokens")
        self.periodic_tokens = parse_count(self.periodic_tokens, "eval.periodic_tokens")
        _require(
            self.every_steps is None or self.every_steps >= 1,
            f"eval.every_steps={self.every_steps} must be >= 1 (or null: off)",
        )
        _require(
            self.every_seconds is None or self.every_seconds > 0,
            f"eval.every_seconds={self.every_seconds} must be > 0 (or null: off)",
        )
        _require(
            self.periodic_tokens is not None and self.periodic_tokens >= 2,
            f"eval.periodic_tokens={self.periodic_tokens} must be >= 2",
        )
        if self.name == EvalName.sliding:
            _require(
                self.stride is not None and self.stride >= 1,
                f"eval=sliding needs eval.stride >= 1 (at most model.seq_len), got {self.stride}; "
                f"use e.g. eval.stride=64",
            )
        else:
            _require(
                self.stride is None,
                "eval.stride is for eval=sliding; use eval=sliding eval.stride=N, or drop eval.stride",
            )
        _require(self.tokens is None or self.tokens >= 0, f"eval.tokens={self.tokens} must be >= 0 (0: all)")


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
    batch_size: int | None = None
    """Documents adapted side by side (independent adapters). None: the eval batch size."""
    max_seconds: float | None = None
    """Wall-clock budget for TTT; when spent it stops after the current chunk and records what was scored
    (ttt_tokens_scored, ttt_fraction). None: no limit."""
    score_base: bool = True
    """Also score every chunk unadapted, in the same pass and windows (val_bpb_ttt_base, so the gain is
    val_bpb_ttt_base - val_bpb_ttt): one more forward per chunk after a document's first, about +40% TTT time
    on CPU. false: skip it (val_bpb_ttt_base null)."""

    def __post_init__(self) -> None:
        parse_targets(self.targets)
        parse_short_chunks(self.short_chunks)
        _require(
            self.rank >= 1 and self.chunk_size >= 1 and (self.batch_size is None or self.batch_size >= 1),
            f"ttt.rank ({self.rank}), ttt.chunk_size ({self.chunk_size}) and ttt.batch_size ({self.batch_size}) "
            f"must be >= 1; use e.g. ttt.rank=8",
        )
        _require(self.lr > 0, f"ttt.lr={self.lr} must be > 0; use e.g. ttt.lr=0.01")
        _require(
            self.max_seconds is None or self.max_seconds > 0,
            f"ttt.max_seconds={self.max_seconds} must be > 0; use null for no limit",
        )

    def chunk_sizes(self) -> list[int]:
        """Every chunk size TTT may use (chunk_size and the short-document ones)."""
        return [self.chunk_size] + [c for _, c in parse_short_chunks(self.short_chunks)]


@dataclass
class LoggerConfig:
    name: LoggerName = LoggerName.console
    """console, or wandb."""
    log_every_seconds: float = 10.0
    """Seconds between progress lines."""
    dense: bool = True
    """A metrics.jsonl record for every optimizer step (train_loss, lr_mult, tokens, elapsed_s). The losses are kept
    on the device and copied out every flush_every_steps steps or at a progress line, so no step waits for the
    host. false: one record per progress line."""
    flush_every_steps: int = 100
    """Steps between copies of the buffered losses to the host (also the latest a non-finite loss is noticed)."""
    project: str = "speedrun"
    """W&B project (logger=wandb)."""
    entity: str | None = None
    """W&B entity (logger=wandb)."""
    mode: WandbMode = WandbMode.auto
    """W&B mode: auto (online if a key is set, else offline), online, offline."""

    def __post_init__(self) -> None:
        _require(self.log_every_seconds > 0, f"logger.log_every_seconds={self.log_every_seconds} must be > 0")
        _require(self.flush_every_steps >= 1, f"logger.flush_every_steps={self.flush_every_steps} must be >= 1")
