"""The quant group's schema: how the artifact is quantized and compressed, and the levers of parameter-golf's
2026-04-29 record export (sigma clipping per tensor class, GPTQ'd embeddings, LQER, quantized gates, per-group
compression, the Hessians' time reserved in the training budget). Every lever is off by default: with all off the
artifact is today's, byte for byte."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any

from speedrun.config.choices import Compressor, PergroupCodec, QuantClip, QuantName, _require
from speedrun.config.specs import parse_count

TENSOR_CLASSES = ("attn", "mlp", "matrix", "embed")
"""The classes of quantized matrices quant.sigmas names (speedrun.core.pergroup assigns them by name)."""


@dataclass
class ClipSigmas:
    """quant.sigmas: k of quant.clip=sigma per tensor class, in standard deviations of the row (clip = k x std)."""

    matrix: float = 12.85
    """Quantized matrices of no other class: linears of a model of one's own outside ``attn``/``mlp`` modules, a
    large 2-D parameter GPTQ does not see. The record's MATRIX_CLIP_SIGMAS (12.85), which in its own tied 11x512
    model applies to no tensor (every large matrix there is attention, MLP or the embedding)."""
    mlp: float = 12.0
    """MLP fc and proj (``blocks.<i>.mlp.*``). The record: 12 (MLP_CLIP_SIGMAS=12 in its run command; 10 is its
    script's default)."""
    attn: float = 13.0
    """Attention c_q, c_k, c_v and proj (``blocks.<i>.attn.*``). The record: 13 (ATTN_CLIP_SIGMAS)."""
    embed: float = 15.0
    """The token embedding and an untied lm_head. The record: 15 (EMBED_CLIP_SIGMAS=15 in its run command; 20 is
    its script's default). The record files an untied head under matrix; its model has none."""

    def __post_init__(self) -> None:
        for name in TENSOR_CLASSES:
            k = getattr(self, name)
            _require(
                math.isfinite(k) and k > 0,
                f"quant.sigmas.{name}={k} must be > 0 (the clip in row standard deviations); e.g. 12",
            )

    def of(self, tensor_class: str) -> float:
        """k for a class of TENSOR_CLASSES."""
        return float(getattr(self, tensor_class))


@dataclass
class LQERConfig:
    """quant.lqer: a low-rank correction of the worst-quantized matrices, stored beside their codes and added back
    when the artifact is dequantized (the record's LQER_*)."""

    rank: int = 0
    """Rank r of each correction: the top r singular triplets of the quantization error W - dequant(Q), as two
    factors (r x rows and r x cols values). 0: off. The record: 4."""
    top_k: int = 3
    """How many quantized matrices get a correction: those with the largest quantization error ||W - dequant(Q)||_F
    (absolute Frobenius norm, the record's ranking), whatever their class. The record: 3."""
    factor_bits: int = 4
    """Bits of the factors' codes (2..8): each group of asym_group values is stored as unsigned codes with an fp16
    step and an fp16 minimum (asymmetric). The record: 4 (its second factor; the first it keeps at 2 bits with one
    scale per matrix)."""
    asym_group: int = 64
    """Values per quantization group along each factor row (a row of n values is cut into ceil(n / asym_group)
    equal groups). The record: 64."""

    def __post_init__(self) -> None:
        _require(self.rank >= 0, f"quant.lqer.rank={self.rank} must be >= 0 (0: off); e.g. quant.lqer.rank=4")
        _require(self.top_k >= 1, f"quant.lqer.top_k={self.top_k} must be >= 1; e.g. quant.lqer.top_k=3")
        _require(
            2 <= self.factor_bits <= 8,
            f"quant.lqer.factor_bits={self.factor_bits} must be in 2..8 (one byte per code); e.g. 4",
        )
        _require(self.asym_group >= 2, f"quant.lqer.asym_group={self.asym_group} must be >= 2; e.g. 64")


@dataclass
class AWQConfig:
    """quant.awq: AWQ-lite (the 2026-04 records' AWQ_LITE_*), activation-aware precision for the few most salient
    input-column groups. Each group of group_size consecutive input columns of a GPTQ'd matrix is scored by
    sum over its columns of rms(activation) x mean |w| (rms from the GPTQ Hessian's diagonal: H = X^T X / n); the
    top_k groups of the whole model are rounded inside the same GPTQ solve at ``bits`` instead of the matrix's
    bits, with a per-row scale of their own (the same clip over the finer grid)."""

    top_k: int = 0
    """How many column groups, over all GPTQ'd matrices together, get the finer grid. 0: off. The records: 1."""
    bits: int = 8
    """Bits of the promoted groups' codes (AWQ_LITE_BITS); must exceed the matrix's own. The records: 8."""
    group_size: int = 64
    """Consecutive input columns per group (AWQ_LITE_GROUP_SIZE). The records: 64."""

    def __post_init__(self) -> None:
        _require(self.top_k >= 0, f"quant.awq.top_k={self.top_k} must be >= 0 (0: off); e.g. quant.awq.top_k=1")
        _require(2 <= self.bits <= 8, f"quant.awq.bits={self.bits} must be in 2..8 (one int8 byte per code); e.g. 8")
        _require(self.group_size >= 1, f"quant.awq.group_size={self.group_size} must be >= 1; e.g. 64")


@dataclass
class QuantConfig:
    name: QuantName = QuantName.int8
    """off; int8: per-row int8 weights (parameter-golf's export); int6: GPTQ on the block matrices with
    Hessians from training batches, embeddings at embed_bits. Scored on the dequantized round trip."""
    compressor: Compressor = Compressor.zlib
    """zlib, lzma (stdlib), brotli, zstd (the `compress` extra: pip install 'speedrun[compress]'), or pergroup:
    tensors grouped by kind and class, each group byte-shuffled and compressed apart with quant.pergroup_codec in
    parallel threads (speedrun.core.pergroup)."""
    level: int = 9
    """Compression level (zlib 0-9, lzma 0-9, brotli 0-11, zstd 1-22; pergroup: its codec's)."""
    cap_bytes: Any = 16_000_000
    """Artifact size limit; recorded as artifact_ok. An integer, also written 16e6 or 16_000_000 (typed Any, see
    parse_count)."""
    bits: int = 6
    """int6: bits of the GPTQ block matrices (values in [-(2^(bits-1)-1), 2^(bits-1)-1], stored one per byte)."""
    embed_bits: int = 8
    """int6: bits of the token embedding and an untied lm_head (round-to-nearest per row, or GPTQ with
    quant.embed_gptq)."""
    calib_batches: int = 8
    """int6: training micro-batches whose activations make the GPTQ Hessians (never validation data)."""
    damp: float = 0.01
    """int6: GPTQ dampening, added to the Hessian diagonal as damp x its mean."""
    block_size: int = 128
    """int6: GPTQ column block size (error propagation is done lazily per block)."""
    clip_ratios: list[float] = field(default_factory=lambda: [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7])
    """int6, clip=absmax_search: per-row clip search candidates, fractions of the row's absmax; each row keeps the
    one with the least Hessian-diagonal-weighted rounding error."""
    clip: QuantClip = QuantClip.absmax_search
    """int6: how each row's clip (the magnitude its largest code stands for; scale = clip / (2^(bits-1)-1)) is
    chosen. absmax_search: the search over clip_ratios above. sigma: clip = k x the row's standard deviation, k
    from quant.sigmas by the tensor's class; a large k (the record's 12-15) makes the grid coarse, so the codes
    cluster near zero and compress to far fewer bits than the container's, at some rounding error."""
    sigmas: ClipSigmas = field(default_factory=ClipSigmas)
    """int6, clip=sigma: k per tensor class (attn, mlp, embed, matrix)."""
    embed_gptq: bool = False
    """int6: GPTQ the token embedding (and an untied lm_head) at embed_bits instead of rounding to nearest. The
    Hessian is that of the output head's input, X^T X of the final norm's output (the record's), for a tied
    embedding and an untied head alike; an untied embedding is only looked up, which makes its Hessian diagonal
    in the rows, so it stays round-to-nearest (speedrun.core.gptq)."""
    lqer: LQERConfig = field(default_factory=LQERConfig)
    """int6: low-rank corrections of the top_k worst-quantized matrices (rank 0: off)."""
    awq: AWQConfig = field(default_factory=AWQConfig)
    """int6: AWQ-lite, the top_k most salient input-column groups at awq.bits inside GPTQ (top_k 0: off)."""
    logit_rescale: bool = False
    """The asymmetric logit rescale (the 2026-04 records' ASYM_LOGIT_RESCALE): the model's softcap becomes two
    scalars, one for positive logits and one for negative (logit = c * tanh(logit / c), c = pos if logit > 0 else
    neg), both starting at model.logit_softcap, so the trained model computes exactly what it did. Training never
    updates them; they ship in the artifact (8 bytes, fp32) and phased global TTT (ttt.phased) fine-tunes them with
    the rest of the weights, which is where the lever acts: without global TTT they stay at the softcap."""
    gate_bits: int | None = None
    """int6: bits of the model's small gate tensors (smear gate, attention output gate, skip gates: names
    containing ``gate``, and the smear gate's ``smear_w``), per-row round-to-nearest with an fp16 absmax scale.
    None: kept in float as every small tensor is (fp16; fp32 up to 64 values)."""
    reserve_seconds: float | None = None
    """int6: seconds of budget.train_seconds kept for GPTQ's Hessian collection, which reads training data and so
    counts as training (parameter-golf's rule): the training loop stops this much earlier (its LR schedule follows
    the shorter budget), the Hessians are collected right after its last step, and train_seconds records loop +
    Hessians, with quant_reserve_ok whether that stayed within budget.train_seconds. None: warm-up measures it
    (speedrun.run.quant_phase); 0 is refused, since it would leave the Hessians outside the budget. The
    record: 8 (on 8 GPUs)."""
    pergroup_codec: PergroupCodec = PergroupCodec.brotli
    """compressor=pergroup: the codec of every group (brotli or lzma), at quant.level."""
    keep_weights: bool = False
    """Write the float weights the export quantizes (the EMA's when ema.decay is set) to <run dir>/model.pt, so
    scripts/quant_table.py can re-quantize them under other settings."""

    def __post_init__(self) -> None:
        self.cap_bytes = parse_count(self.cap_bytes, "quant.cap_bytes")
        _require(
            2 <= self.bits <= 8 and 2 <= self.embed_bits <= 8,
            f"quant.bits={self.bits} and quant.embed_bits={self.embed_bits} must be in 2..8 (one int8 byte per "
            f"value); use e.g. quant.bits=6 quant.embed_bits=8",
        )
        _require(
            self.calib_batches >= 1 and self.block_size >= 1 and self.damp >= 0,
            f"quant.calib_batches ({self.calib_batches}) and quant.block_size ({self.block_size}) must be >= 1 "
            f"and quant.damp ({self.damp}) >= 0; use the int6 defaults (8, 128, 0.01)",
        )
        _require(
            bool(self.clip_ratios) and all(0 < r <= 1 for r in self.clip_ratios),
            f"quant.clip_ratios={list(self.clip_ratios)} must be fractions in (0, 1]; use e.g. [1.0,0.9,0.8]",
        )
        _require(self.cap_bytes is not None and self.cap_bytes >= 1, f"quant.cap_bytes={self.cap_bytes} must be >= 1")
        _require(
            self.gate_bits is None or 2 <= self.gate_bits <= 8,
            f"quant.gate_bits={self.gate_bits} must be in 2..8 (one int8 byte per value), or null to keep gates "
            f"in float; e.g. quant.gate_bits=8",
        )
        _require(
            self.reserve_seconds is None or (math.isfinite(self.reserve_seconds) and self.reserve_seconds >= 0),
            f"quant.reserve_seconds={self.reserve_seconds} must be a number of seconds, or null to measure it in "
            "warm-up; e.g. quant.reserve_seconds=8",
        )
        _require(
            not self.awq.top_k or self.awq.bits > self.bits,
            f"quant.awq.bits={self.awq.bits} must exceed quant.bits={self.bits}: AWQ-lite promotes groups to a "
            f"finer grid; e.g. quant.awq.bits=8",
        )
        levers = self.levers_on()
        _require(
            self.name == QuantName.int6 or not levers,
            f"{', '.join(levers)} act on GPTQ's export: add quant=int6 (now quant={self.name}), or drop them",
        )

    def levers_on(self) -> list[str]:
        """The GPTQ levers set away from their defaults, as the command line names them."""
        on = [f"quant.clip={self.clip}"] if self.clip != QuantClip.absmax_search else []
        on += ["quant.embed_gptq=true"] if self.embed_gptq else []
        on += [f"quant.lqer.rank={self.lqer.rank}"] if self.lqer.rank else []
        on += [f"quant.awq.top_k={self.awq.top_k}"] if self.awq.top_k else []
        on += [f"quant.gate_bits={self.gate_bits}"] if self.gate_bits is not None else []
        on += [f"quant.reserve_seconds={self.reserve_seconds:g}"] if self.reserve_seconds else []
        return on


# ---- compressors: the levels each takes and the packages it needs, checked by the resolver before any work ----

COMPRESS_EXTRA = "pip install 'speedrun[compress]'"

LEVELS = {"zlib": (0, 9), "lzma": (0, 9), "brotli": (0, 11), "zstd": (1, 22)}
"""Valid compression levels per compressor (inclusive)."""
MODULES = {"brotli": "brotli", "zstd": "zstandard"}
"""Compressors that need a package from the `compress` extra."""
PERGROUP = "pergroup"
"""quant.compressor=pergroup: no codec of its own; each tensor group is compressed with quant.pergroup_codec."""
PERGROUP_CODECS = ("brotli", "lzma")
"""The codecs a pergroup artifact may use: both release the GIL, so groups compress in parallel threads."""


def check_compressor(name: str, level: int, codec: str | None = None) -> None:
    """Raise ValueError naming the fix if ``name`` is unknown, its level out of range or its package missing
    (for pergroup: those of ``codec``, quant.pergroup_codec). Looks the package up without importing it (cheap;
    the resolver calls this before any work)."""
    what, other = f"quant.compressor={name}", "quant.compressor=lzma or zlib"
    if name == PERGROUP:
        if codec not in PERGROUP_CODECS:
            raise ValueError(f"quant.pergroup_codec={codec}: choose one of {', '.join(PERGROUP_CODECS)}")
        what, other, name = (
            f"quant.compressor=pergroup with quant.pergroup_codec={codec}",
            "quant.pergroup_codec=lzma",
            codec,
        )
    if name not in LEVELS:
        raise ValueError(f"quant.compressor={name}: unknown; choose one of {', '.join([*LEVELS, PERGROUP])}")
    lo, hi = LEVELS[name]
    if not lo <= level <= hi:
        raise ValueError(f"quant.level={level} is out of range for {what}; use {lo}..{hi}")
    module = MODULES.get(name)
    if module and importlib.util.find_spec(module) is None:
        raise ValueError(
            f"{what} needs the '{module}' package, which is not installed: {COMPRESS_EXTRA} (or use {other})"
        )
