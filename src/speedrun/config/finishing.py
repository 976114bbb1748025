"""Schemas of the groups that say what happens after training and how it is reported: eval, ttt, logger, and
quant (its schema is config/quant.py, re-exported here)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from speedrun.config.checkpointing import parse_batch
from speedrun.config.choices import EvalName, LoggerName, TTTName, TTTOptimizer, WandbMode, _require
from speedrun.config.quant import QuantConfig
from speedrun.config.specs import parse_count, parse_short_chunks, parse_targets

TTT_COMPILE_SCOPES = ("blocks", "model")
"""What ttt.compile_scope may name (TTTConfig.compile_scope)."""
TTT_ROW_WIDTHS = ("pow2", "half_octave")
"""What ttt.row_widths may name besides a number (TTTConfig.row_widths), and ttt.graph_rows."""

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
    include_tail: bool = False
    """Score the validation tail too: the last targets that do not fill a whole window of model.seq_len, cut by
    default (parameter-golf's EVAL_INCLUDE_TAIL=1). eval=standard scores them with one more window ending at the last
    token, eval=sliding with its usual last window; TTT scores the same tokens."""

    every_steps: int | None = None
    """Periodic validation every this many optimizer steps (None: off), on the first eval.periodic_tokens validation
    tokens with standard windows; its time is kept out of train_seconds (val_seconds_periodic) and each result is
    a val_bpb record in metrics.jsonl. The final evaluation is unchanged."""
    every_seconds: float | None = None
    """Periodic validation every this many seconds of training (train_seconds; None: off)."""
    periodic_tokens: Any = 65536
    """Validation tokens each periodic evaluation scores (a fixed slice from the start of the val split); an
    integer, also written 6.5536e4 or 65_536 (typed Any, see parse_count)."""
    max_seconds: float | None = None
    """Wall-clock budget of each final scoring pass (val_bpb, and val_bpb_quant apart): when spent, the pass stops
    after the batch in progress and scores what it covered, a prefix of the eval tokens, recorded as
    val_tokens_scored of val_tokens_total with eval_complete false (eval_complete_quant for the round trip).
    parameter-golf allows 600 s for a submission's whole evaluation. None: no limit. Periodic validation and TTT
    (ttt.max_seconds) are not affected."""

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
        _require(
            self.max_seconds is None or self.max_seconds > 0,
            f"eval.max_seconds={self.max_seconds} must be > 0; use null for no limit",
        )


@dataclass
class PhasedTTTConfig:
    """ttt.phased: phased global TTT, the records' PHASED_TTT_* / GLOBAL_TTT_* (speedrun.core.ttt_global).
    The documents LoRA TTT scores first (``prefix_docs`` of them, in the order they are scored) are cut into
    ``phases`` equal groups; when a group is scored, the model's own weights are fine-tuned with SGD on every
    document scored so far, and the documents after it are scored (and LoRA-adapted) on the fine-tuned model."""

    phases: int = 0
    """Global fine-tunes (0: off; the records: 3). Needs ttt=lora."""
    prefix_docs: int = 2000
    """Documents, counted in the order TTT scores them, whose scoring the phases cut up: phase p fine-tunes on the
    first prefix_docs x p / phases of them (every earlier phase's documents again). The records: 2000."""
    lr: float = 1e-3
    """SGD learning rate at the start of each phase; it follows a cosine to 0 over the phase's chunks."""
    momentum: float = 0.9
    """SGD momentum (0 <= momentum < 1); the momentum buffer starts at zero in every phase."""
    chunk_tokens: int = 32768
    """Tokens per chunk of a phase's documents: the unit of the cosine learning-rate schedule. A chunk holds whole
    documents (at least one), so it can exceed this."""
    batch_seqs: int = 32
    """Rows per SGD step, over all ranks together (so the updates do not depend on the number of ranks). A row is
    one document, or model.seq_len tokens of a longer one: no row crosses a document boundary."""
    grad_clip: float = 1.0
    """Clip the gradient's global norm to this before each step (0: off)."""
    epochs: int = 1
    """Passes over each chunk before the next."""

    def __post_init__(self) -> None:
        _require(self.phases >= 0, f"ttt.phased.phases={self.phases} must be >= 0 (0: off); use e.g. 3")
        _require(
            self.prefix_docs >= max(1, self.phases),
            f"ttt.phased.prefix_docs={self.prefix_docs} must be >= ttt.phased.phases={self.phases} (each phase "
            f"needs a document); use e.g. ttt.phased.prefix_docs=2000",
        )
        _require(self.lr > 0, f"ttt.phased.lr={self.lr} must be > 0; use e.g. ttt.phased.lr=0.001")
        _require(0 <= self.momentum < 1, f"ttt.phased.momentum={self.momentum} must be in [0, 1); use e.g. 0.9")
        _require(
            self.chunk_tokens >= 1 and self.batch_seqs >= 1 and self.epochs >= 1,
            f"ttt.phased.chunk_tokens ({self.chunk_tokens}), .batch_seqs ({self.batch_seqs}) and .epochs "
            f"({self.epochs}) must be >= 1; the records use 32768, 32 and 1",
        )
        _require(self.grad_clip >= 0, f"ttt.phased.grad_clip={self.grad_clip} must be >= 0 (0: off)")


@dataclass
class TTTConfig:
    name: TTTName = TTTName.off
    """off; lora: score-first LoRA test-time training at eval, per document, on the (dequantized) model; record:
    the same with the 2026-04 records' settings (conf/ttt/record.yaml: their adapters and phased global TTT)."""
    rank: int = 8
    """LoRA rank of every adapter."""
    alpha: float | None = None
    """LoRA scaling: every adapter's delta B A is multiplied by alpha / rank, so a change of rank keeps the
    delta's scale. None: no scaling (x 1). The records: 144 at rank 96 (x 1.5)."""
    lr: float = 0.01
    """Learning rate of the adapters."""
    local_lr_mult: float = 1.0
    """A factor on ttt.lr for the per-document adapters' optimizer (the local, score-first updates), leaving global
    TTT's ttt.phased.lr as it is: the 2026-04/05 records' TTT_LOCAL_LR_MULT (0.75 in parameter-golf's PR #2014,
    whose adapters then step at 0.75 x 1e-4)."""
    optimizer: TTTOptimizer = TTTOptimizer.adam
    """adam (AdamW: ttt.beta1, ttt.beta2, ttt.eps, decoupled ttt.weight_decay) or sgd (ttt.momentum, and
    ttt.weight_decay as SGD's own, added to the gradient)."""
    beta1: float = 0.9
    """Adam beta1 of the adapters (the records: 0)."""
    beta2: float = 0.95
    """Adam beta2 of the adapters (the records: 0.999)."""
    eps: float = 1e-8
    """Adam epsilon of the adapters (the records: 1e-10)."""
    momentum: float | None = None
    """ttt.optimizer=sgd: momentum (None: 0, plain SGD). Adam's is ttt.beta1."""
    weight_decay: float = 0.0
    """Weight decay of the adapters (the records: 1.0, with Adam)."""
    warm_start_a: bool = False
    """Keep each adapter's A as the previous batch of documents left it (B still starts at 0, so a document still
    starts from the unadapted model, and the optimizer starts afresh): A accumulates directions over the documents
    a rank adapts, and goes back to its seeded draw only after each ttt.phased phase, as the records'
    TTT_WARM_START_A=1. false: A is the same seeded draw for every document, and a document's score depends on
    nothing but itself. With true, a score depends on the documents adapted before it in its chain
    (ttt.warm_start_chains)."""
    warm_start_chains: int = 8
    """With ttt.warm_start_a: A is carried along this many chains of batches, not along whatever batches a rank
    happens to get, so that val_bpb_ttt does not depend on the number of GPUs. Between two global phases the batches
    are dealt into the chains by cost whatever the rank count, then whole chains onto the ranks. At least the rank
    count (the default 8: the records' GPUs, each of whose ranks carried its own A). A rank keeps a copy of every
    adapter's A per chain it runs (at the records' settings and width 512, about 0.7 GB a chain)."""
    chunk_size: int = 256
    """Tokens per chunk: each chunk is scored, then the adapters take one step on it."""
    short_chunks: str = ""
    """Chunk sizes for short documents, "LEN:CHUNK,...", e.g. "256:8,2000:24": a document with at most LEN
    scored tokens uses CHUNK (first matching LEN in ascending order); longer ones use chunk_size. "" = off."""
    targets: str = "all"
    """What gets adapters: a preset (all, no_qv, qkvo, qv, record) or a comma list of q, k, v, o (attention), up,
    down (MLP), attn_bypass, mlp_bypass (a low-rank path beside each whole attention or MLP) and head (the output
    head, tied or untied)."""
    batch_size: int | None = None
    """Documents adapted side by side (independent adapters): the records' TTT_BATCH_SIZE (64). None: the eval
    batch size."""
    max_seconds: float | None = None
    """Wall-clock budget for TTT; when spent it stops after the current chunk and records what was scored
    (ttt_tokens_scored, ttt_fraction). None: no limit."""
    score_base: bool = True
    """Also score every chunk unadapted, in the same pass and windows (val_bpb_ttt_base, so the gain is
    val_bpb_ttt_base - val_bpb_ttt): one more forward per chunk after a document's first, about +40% TTT time
    on CPU. false: skip it (val_bpb_ttt_base null)."""
    compile: bool = False
    """torch.compile the adapted model's forward (and the unadapted one's, for val_bpb_ttt_base) with dynamic
    shapes, as the records do, warmed up on random tokens before TTT's clock starts (ttt_compile_seconds; graphs
    built after the warm-up: ttt_recompiles; a batch of a single document runs two rows, one of them padding, so
    that no size-1 dimension specializes a graph of its own). The global phases run eagerly. Off by default for its
    warm-up, minutes from a cold cache; check ``ttt_rate`` measures compiled TTT at the records' settings."""
    compile_scope: str = "blocks"
    """What ttt.compile compiles: ``blocks`` (each block and the head on their own, as kernel.compile_scope=blocks:
    one small graph reused by every block) or ``model`` (the whole adapted model as one graph, several times longer
    to trace and lower at the pgolf_record shape)."""
    cuda_graphs: bool | None = None
    """Replay every TTT step from a CUDA graph, one per step shape (rows padded to a power of two, the window's
    width), all captured before TTT's clock starts (speedrun.core.ttt_graphs; the capture counts in
    ttt_compile_seconds, ttt_cuda_graphs_captured says how many shapes): compiled TTT spends most of its time
    launching kernels, not running them (check ``ttt_rate`` measures the graphed rate). CUDA only. With
    ttt.beta1=0 the optimizer's step is inside the graph; otherwise it runs after. None: on with ttt.compile on a
    CUDA GPU, else off (plan.json says which); true on a machine without CUDA is refused."""
    max_batch_share: float | None = 0.125
    """Halve a batch of documents (its first half, then the rest) while its predicted cost
    (speedrun.core.ttt_docs.batch_cost) is more than this share of the whole TTT's: on a small validation set,
    one batch of its longest documents can be a third of the work, which one rank runs while the others wait. The
    split depends on the documents alone (a frozen cost model), not on the rank count or on how TTT runs, so 1 and 8
    ranks score the same batches. It does change the scores against no split: under ttt.warm_start_a a batch starts
    from its chain's previous A, and the phases fall at batch ends. At parameter-golf's 50,000 documents no batch
    comes near 1/8; null: never split."""
    row_widths: str = "pow2"
    """The widths a TTT step's rows are padded to: ``pow2`` (64, 128, 256, ... up to the window), ``half_octave``
    (64, 96, 128, 192, 256, 384, ...): less padding for twice the shapes to compile and capture, or a number N such
    as 128 (multiples of N: less padding still, more shapes; a multiple of ttt.chunk_size pads least)."""
    graph_rows: str = "pow2"
    """The row counts a CUDA-graphed TTT step (and its base passes) is padded to: ``pow2`` (2, 4, 8, ... up to the
    batch) or ``half_octave`` (3, 6, 12, 24, 48 as well): less padding, more graphs to capture."""
    shared_attn_a: bool = False
    """One LoRA-A product for the adapters that read the attention's input (q, k, v, attn_bypass) instead of one
    each: the same arithmetic, the input read once and the backward's input gradient one product. Needs the built-in
    GPT's attention adapter hook (a registry model without one is refused). No faster than separate adapters on
    an H100, so off by default."""
    phased: PhasedTTTConfig = field(default_factory=PhasedTTTConfig)
    """Phased global TTT (ttt.phased.phases, .prefix_docs, .lr, ...): the model's own weights fine-tuned with SGD
    on documents already scored; off by default (phases 0)."""

    def __post_init__(self) -> None:
        parse_targets(self.targets)
        parse_short_chunks(self.short_chunks)
        _require(
            self.compile_scope in TTT_COMPILE_SCOPES,
            f"ttt.compile_scope={self.compile_scope!r} is not one of {', '.join(TTT_COMPILE_SCOPES)}; "
            f"use ttt.compile_scope=blocks",
        )
        _require(
            self.max_batch_share is None or 0 < self.max_batch_share <= 1,
            f"ttt.max_batch_share={self.max_batch_share} must be in (0, 1]; use e.g. 0.125, or null to never split",
        )
        _require(
            self.row_widths in TTT_ROW_WIDTHS or (str(self.row_widths).isdigit() and int(self.row_widths) >= 16),
            f"ttt.row_widths={self.row_widths!r} is not one of {', '.join(TTT_ROW_WIDTHS)} or a multiple of at "
            f"least 16 tokens; use ttt.row_widths=pow2, half_octave or e.g. 128",
        )
        _require(
            self.graph_rows in TTT_ROW_WIDTHS,
            f"ttt.graph_rows={self.graph_rows!r} is not one of {', '.join(TTT_ROW_WIDTHS)}; use ttt.graph_rows=pow2",
        )
        _require(
            self.rank >= 1 and self.chunk_size >= 1 and (self.batch_size is None or self.batch_size >= 1),
            f"ttt.rank ({self.rank}), ttt.chunk_size ({self.chunk_size}) and ttt.batch_size ({self.batch_size}) "
            f"must be >= 1; use e.g. ttt.rank=8",
        )
        _require(self.lr > 0, f"ttt.lr={self.lr} must be > 0; use e.g. ttt.lr=0.01")
        _require(
            math.isfinite(self.local_lr_mult) and self.local_lr_mult > 0,
            f"ttt.local_lr_mult={self.local_lr_mult} must be > 0 (a factor on ttt.lr); e.g. ttt.local_lr_mult=0.75",
        )
        _require(
            self.warm_start_chains >= 1,
            f"ttt.warm_start_chains={self.warm_start_chains} must be >= 1; use e.g. 8 (at least the GPU count)",
        )
        _require(
            self.max_seconds is None or self.max_seconds > 0,
            f"ttt.max_seconds={self.max_seconds} must be > 0; use null for no limit",
        )
        _require(
            self.alpha is None or self.alpha > 0,
            f"ttt.alpha={self.alpha} must be > 0; use null for no scaling, or e.g. ttt.alpha=144 at ttt.rank=96",
        )
        _require(
            0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0 and self.weight_decay >= 0,
            f"ttt.beta1 ({self.beta1}) and ttt.beta2 ({self.beta2}) must be in [0, 1), ttt.eps ({self.eps}) > 0 and "
            f"ttt.weight_decay ({self.weight_decay}) >= 0; the records use 0, 0.999, 1e-10 and 1.0",
        )
        if self.optimizer == TTTOptimizer.sgd:
            _require(
                self.momentum is None or 0 <= self.momentum < 1,
                f"ttt.momentum={self.momentum} must be in [0, 1); use e.g. ttt.momentum=0.9",
            )
        else:
            _require(
                self.momentum is None,
                f"ttt.momentum={self.momentum} is for ttt.optimizer=sgd; Adam's momentum is ttt.beta1 (set "
                f"ttt.optimizer=sgd, or drop ttt.momentum)",
            )
        _require(
            self.phased.phases == 0 or self.name != TTTName.off,
            f"ttt.phased.phases={self.phased.phases} runs inside LoRA TTT; add ttt=lora (or ttt=record), or set "
            f"ttt.phased.phases=0",
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
