"""The artifact's weights: quantized, packed, compressed, and read back.

``quant=int8`` follows parameter-golf's baseline export: 2-D float tensors large enough to matter become
per-row int8 with a clipped absmax scale (fp16 scales); small tensors are kept in fp16, scalar controls in fp32.

``quant=int6`` quantizes every block matrix (attention q/k/v/proj, MLP fc/proj) with GPTQ at ``quant.bits``
(speedrun.core.gptq: Hessians from training batches, per-row fp16 scales by quant.clip). The token embedding
and an untied lm_head get round-to-nearest at ``quant.embed_bits`` with the same clip rule, or GPTQ against the
output head's Hessian with quant.embed_gptq. The record's other levers, each off by default: LQER corrections of the
worst-quantized matrices (quant.lqer) and per-row codes for the small gate tensors (quant.gate_bits). Values are
stored one per int8 byte (6 bits used) and the compressor's entropy coder removes the unused bits: on the tiny
model's 458,752 int6 block weights (empirical entropy 5.50 bits/value = 315,500 bytes) the int8 containers compress
to 316,226 bytes with brotli-11 and 321,844 with lzma-9, against 333,309 and 337,452 for the same values bit-packed
4-in-3 bytes first: packing splits values across byte boundaries, which byte-oriented LZ matching and entropy
models cannot see through.

The packed state dict maps each name to its fields: ``q`` + ``scale`` (codes and per-row fp16 scales; plus the
LQER and AWQ fields), ``half`` (fp16) or ``raw`` (as it was). It is serialized with torch.save and compressed as one
stream, or with quant.compressor=pergroup split into groups of like tensors compressed apart
(speedrun.core.pergroup), a blob that carries its own header.

val_bpb_quant is measured on the dequantized round trip, so it is the number the artifact actually earns.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from speedrun.core import choice
from speedrun.core.gptq import (
    FineColumns,
    awq_groups,
    calibrate,
    correction,
    dequantize_correction,
    qmax_of,
    quantize_gptq_fine,
    quantize_rtn,
)
from speedrun.core.pergroup import EMBED_NAMES, compress, decompress, pack, tensor_class, unpack
from speedrun.progress import Progress


@dataclass(frozen=True)
class Sigmas:
    """quant.sigmas: k of quant.clip=sigma per tensor class (clip = k x the row's standard deviation)."""

    matrix: float = 12.85
    mlp: float = 12.0
    attn: float = 13.0
    embed: float = 15.0


@dataclass(frozen=True)
class LQERSettings:
    rank: int = 0
    top_k: int = 3
    factor_bits: int = 4
    asym_group: int = 64


@dataclass(frozen=True)
class AWQSettings:
    top_k: int = 0
    bits: int = 8
    group_size: int = 64


@dataclass(frozen=True)
class QuantSettings:
    """What the export reads of ``quant.*`` (speedrun.config.quant.QuantConfig has each knob's meaning and checks)."""

    name: str = "int8"
    compressor: str = "zlib"
    level: int = 9
    bits: int = 6
    embed_bits: int = 8
    calib_batches: int = 8
    damp: float = 0.01
    block_size: int = 128
    clip_ratios: tuple[float, ...] = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)
    clip: str = "absmax_search"
    sigmas: Sigmas = Sigmas()
    embed_gptq: bool = False
    lqer: LQERSettings = LQERSettings()
    awq: AWQSettings = AWQSettings()
    gate_bits: int | None = None
    pergroup_codec: str = "brotli"


KEEP_FLOAT_MAX_NUMEL = 65_536
"""Tensors this small stay in floating point: their int8 savings are negligible, their error is not."""
CLIP_QUANTILE = 0.9999984
"""Per-row clip at this quantile of |w| (parameter-golf's baseline value): one outlier must not set the scale."""


@dataclass(frozen=True)
class Artifact:
    blob: bytes
    """Compressed quantized state dict."""
    compress_seconds: float = 0.0
    """Wall seconds the compression took (all groups, with pergroup)."""
    group_bytes: dict[str, int] = field(default_factory=dict)
    """Compressed bytes per group (pergroup), or {"all": the blob} for a one-stream compressor."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What the export measured on the way (timings, the per-tensor report), filled by the shell."""


def quantize_state_dict(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """quant=int8 (see the module doc)."""
    packed: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        t = tensor.detach().to("cpu")
        if not t.is_floating_point():
            packed[name] = {"raw": t}
        elif t.ndim == 2 and t.numel() > KEEP_FLOAT_MAX_NUMEL:
            w = t.float()
            clip = torch.quantile(w.abs(), CLIP_QUANTILE, dim=1, keepdim=True).clamp_min(1e-8)
            scale = clip / 127.0
            q = torch.clamp(torch.round(w.clamp(-clip, clip) / scale), -127, 127).to(torch.int8)
            packed[name] = {"q": q, "scale": scale.squeeze(1).to(torch.float16)}
        elif t.numel() <= 64:
            packed[name] = {"raw": t.float()}  # gains and mixing scalars: precision matters, size does not
        else:
            packed[name] = {"half": t.to(torch.float16)}
    return packed


def dequantize_entry(entry: dict[str, torch.Tensor]) -> torch.Tensor:
    """One packed tensor back in float: codes x per-row scales (rows = the first dimension, so a gate vector is one
    row), plus its LQER correction if it has one."""
    if "q" in entry:
        q, scale = entry["q"], entry["scale"].float()
        w = (q.float().reshape(scale.numel(), -1) * scale[:, None]).reshape(q.shape)
        if "awq_start" in entry:  # AWQ-lite's promoted column groups: their codes are on a finer step of their own
            size, step = int(entry["awq_size"][0]), entry["awq_scale"].float()[:, None]
            for start in entry["awq_start"].tolist():
                w[:, start : start + size] = q[:, start : start + size].float() * step
        if "lqer_a" in entry:
            w = w + LQER["on"][1](entry)
        return w
    if "half" in entry:
        return entry["half"].float()
    return entry["raw"]


def dequantize_state_dict(packed: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: dequantize_entry(entry) for name, entry in packed.items()}


def export_packed(
    packed: dict[str, dict[str, torch.Tensor]],
    compressor: str,
    level: int,
    log: Callable[[str], None] | None = None,
    codec: str = "brotli",
    workers: int | None = None,
) -> Artifact:
    """Serialize and compress a packed state dict; ``codec`` is quant.pergroup_codec and ``workers`` its threads
    (compressor=pergroup only; default every core)."""
    t0 = time.perf_counter()
    blob, groups = CONTAINERS[compressor][0](packed, compressor, level, log, codec, workers)
    return Artifact(blob=blob, compress_seconds=round(time.perf_counter() - t0, 3), group_bytes=groups)


def load_packed(blob: bytes, compressor: str) -> dict[str, dict[str, torch.Tensor]]:
    """The packed state dict of an artifact (a pergroup blob names its codec in its header)."""
    return CONTAINERS[compressor][1](blob, compressor)


def save_stream(packed: dict[str, dict[str, torch.Tensor]], compressor: str, level: int, log: Any, *_: Any) -> Any:
    """One torch.save stream, compressed: (blob, {"all": its bytes})."""
    buf = io.BytesIO()
    torch.save(packed, buf)
    blob = compress(buf.getvalue(), compressor, level, log)
    return blob, {"all": len(blob)}


def load_stream(blob: bytes, compressor: str) -> dict[str, dict[str, torch.Tensor]]:
    return torch.load(io.BytesIO(decompress(blob, compressor)), map_location="cpu", weights_only=True)


CONTAINERS: dict[str, tuple[Callable[..., Any], Callable[[bytes, str], Any]]] = choice(
    "quant.compressor",
    {
        "zlib": (save_stream, load_stream),
        "lzma": (save_stream, load_stream),
        "brotli": (save_stream, load_stream),
        "zstd": (save_stream, load_stream),
        "pergroup": (
            lambda packed, compressor, level, log, codec, workers: pack(packed, codec, level, log, workers),
            lambda blob, compressor: unpack(blob),
        ),
    },
)
"""quant.compressor -> (write, read) of the artifact's container: one compressed torch.save stream, or the per-group
container (speedrun.core.pergroup), whose blob names its codec."""


# ---------------------------------------------------------------------------------------------------------
# int6: GPTQ and the record's levers


def quantize_rows(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """quant.gate_bits: round-to-nearest with one fp16 absmax scale per row (the first dimension; a vector is one
    row) -> (int8 codes in w's shape, fp16 scales)."""
    qmax = qmax_of(bits)
    rows = w.detach().float().reshape(w.shape[0] if w.ndim > 1 else 1, -1)
    scale = (rows.abs().amax(dim=1) / qmax).clamp_min(1e-8).half()
    q = torch.clamp(torch.round(rows / scale.float()[:, None]), -qmax, qmax).to(torch.int8)
    return q.reshape(w.shape), scale


def quantize_int6(
    state: dict[str, torch.Tensor],
    hessians: dict[str, torch.Tensor],
    q: QuantSettings,
    progress: Progress | None = None,
) -> dict[str, dict[str, torch.Tensor]]:
    """quant=int6 -> the packed state dict, in state-dict order.

    GPTQ for the tensors in ``hessians`` (the embedding's is there only with quant.embed_gptq; with quant.awq, the
    most salient column groups of all of them at awq.bits inside the same solve), round-to-nearest
    at embed_bits for an embedding without one, per-row codes for the gates with quant.gate_bits, the int8 export's
    rules for everything else; then LQER corrections of the quant.lqer.top_k matrices with the largest error.
    ``progress`` is ticked after each GPTQ matrix. speedrun.records.quant_report.rules_of names the rule each
    tensor got."""
    packed: dict[str, dict[str, torch.Tensor]] = {}
    rest: dict[str, torch.Tensor] = {}
    done = 0

    def sigma(name: str) -> float | None:  # quant.clip=sigma's k for this tensor's class (a large gate: matrix's)
        cls = tensor_class(name)
        return float(getattr(q.sigmas, "matrix" if cls == "gate" else cls)) if q.clip == "sigma" else None

    def rtn(name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:  # round-to-nearest at embed_bits
        codes, scale = quantize_rtn(w.detach(), q.embed_bits, q.clip_ratios, sigma=sigma(name))
        return {"q": codes.cpu(), "scale": scale.cpu()}

    promoted = AWQ["on"](state, hessians, q) if q.awq.top_k else {}
    for name, tensor in state.items():
        if name in hessians:
            H = hessians[name]
            fine = FineColumns(tuple(promoted[name]), q.awq.group_size, q.awq.bits) if name in promoted else None
            codes, scale, step = quantize_gptq_fine(
                tensor.to(H.device),
                H,
                bits=q.embed_bits if tensor_class(name) == "embed" else q.bits,
                damp=q.damp,
                block_size=q.block_size,
                clip_ratios=q.clip_ratios,
                sigma=sigma(name),
                fine=fine,
            )
            packed[name] = {"q": codes.cpu(), "scale": scale.cpu()}
            if fine is not None and step is not None:
                packed[name].update(
                    awq_start=torch.tensor(fine.starts, dtype=torch.int16),
                    awq_size=torch.tensor([fine.size], dtype=torch.int16),
                    awq_scale=step.cpu(),
                )
            done += 1
            if progress is not None:
                progress.tick(done, len(hessians))
        elif q.gate_bits is not None and tensor_class(name) == "gate" and tensor.is_floating_point():
            codes, scale = quantize_rows(tensor.cpu(), q.gate_bits)
            packed[name] = {"q": codes, "scale": scale}
        elif name in EMBED_NAMES and tensor.is_floating_point():
            packed[name] = rtn(name, tensor)
        else:
            rest[name] = tensor
    for name, entry in quantize_state_dict(rest).items():
        # a large 2-D tensor GPTQ did not see (none in our GPT): per-row at embed_bits
        packed[name] = rtn(name, rest[name]) if "q" in entry else entry
    if q.lqer.rank:
        LQER["on"][0](state, packed, q.lqer.rank, q.lqer.top_k, q.lqer.factor_bits, q.lqer.asym_group)
    return {name: packed[name] for name in state}


def awq_choice(
    state: dict[str, torch.Tensor], hessians: dict[str, torch.Tensor], q: QuantSettings
) -> dict[str, list[int]]:
    """quant.awq: the promoted column groups ({matrix: starts}) among the GPTQ'd matrices whose bits are below
    awq.bits (speedrun.core.gptq.awq_groups)."""
    coarse = {
        name: state[name]
        for name in state
        if name in hessians and (q.embed_bits if tensor_class(name) == "embed" else q.bits) < q.awq.bits
    }
    return awq_groups(coarse, hessians, q.awq.group_size, q.awq.top_k)


def add_lqer(
    state: dict[str, torch.Tensor],
    packed: dict[str, dict[str, torch.Tensor]],
    rank: int,
    top_k: int,
    bits: int,
    group: int,
) -> list[str]:
    """Add LQER correction fields to the ``top_k`` quantized matrices (gates aside) whose ||W - dequant(Q)||_F is
    largest; returns their names, worst first."""
    errors = {
        name: float((state[name].detach().float().cpu() - dequantize_entry(entry)).norm())
        for name, entry in packed.items()
        if "q" in entry and tensor_class(name) != "gate" and entry["q"].ndim == 2
    }
    chosen = sorted(errors, key=lambda name: -errors[name])[:top_k]
    for name in chosen:
        error = state[name].detach().float().cpu() - dequantize_entry(packed[name])
        packed[name].update(correction(error, rank, bits, group))
    return chosen


AWQ = choice("quant.awq.top_k", {"on": awq_choice})
LQER = choice("quant.lqer.rank", {"on": (add_lqer, dequantize_correction)})
"""LQER's corrections: added to the packed matrices (add_lqer), and read back (dequantize_correction)."""


HESSIANS = choice("quant.name", {"int6": calibrate})
"""quant.name -> GPTQ's Hessians of the trained model (speedrun.core.gptq.calibrate): int6 only, so an int8 run links
no calibration."""


# ---------------------------------------------------------------------------------------------------------
# the model's export


@dataclass
class Quantized:
    """What the export computed before compression (rank 0): the codes and what the per-tensor report needs."""

    packed: dict[str, dict[str, torch.Tensor]]
    """The packed state dict (codes, scales, LQER factors, fp16 and raw tensors), on the CPU."""
    state: dict[str, torch.Tensor]
    """The float weights that were quantized: a CPU copy, since the model's own tensors take the dequantized ones."""
    hessians: dict[str, torch.Tensor]
    extra: dict[str, Any] = field(default_factory=dict)
    """What the shell measured on the way (quant_hessian_seconds)."""


QUANTIZERS: dict[str, Callable[..., dict[str, dict[str, torch.Tensor]]]] = choice(
    "quant.name", {"int8": lambda state, hessians, q, progress: quantize_state_dict(state), "int6": quantize_int6}
)
"""quant.name -> (state, hessians, settings, progress) -> the packed state dict."""


def quantize_model(
    q: QuantSettings,
    model: torch.nn.Module,
    hessians: dict[str, torch.Tensor],
    progress: Progress | None = None,
) -> Quantized:
    """Quantize the model's weights where they are (GPTQ and the clip searches on its device), rank 0; the codes,
    the Hessians and a float copy of the weights come back on the CPU (the report's thread touches no GPU)."""
    state = model.state_dict()
    float_state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
    packed = QUANTIZERS[q.name](state, hessians, q, progress)
    packed = {name: {f: t.detach().cpu() for f, t in entry.items()} for name, entry in packed.items()}
    used = {name: h.detach().cpu() for name, h in hessians.items()} if q.name != "int8" else {}
    return Quantized(packed, float_state, used)


def check_round_trip(
    read: dict[str, dict[str, torch.Tensor]], scored: dict[str, dict[str, torch.Tensor]], path: Any
) -> None:
    """The artifact read back must hold exactly the codes whose dequantized weights were scored (val_bpb_quant is
    a claim about the file), tensor for tensor, bit for bit."""
    for name, entry in scored.items():
        for f, t in entry.items():
            got = read.get(name, {}).get(f)
            if got is None or got.dtype != t.dtype or not torch.equal(got, t):
                raise RuntimeError(f"{path}: {name}.{f} read back differs from the codes scored")
    if list(read) != list(scored):
        raise RuntimeError(f"{path}: holds other tensors than those scored: {sorted(set(read) ^ set(scored))}")
