"""The artifact: quantized weights, compressed, plus the code that trains, evaluates and reads them (raw bytes).

``quant=int8`` follows parameter-golf's baseline export: 2-D float tensors large enough to matter become
per-row int8 with a clipped absmax scale (fp16 scales); small tensors are kept in fp16, scalar controls in fp32.

``quant=int6`` quantizes every block matrix (attention q/k/v/proj, MLP fc/proj) with GPTQ at ``quant.bits``
(speedrun.quant.gptq: Hessians from training batches, per-row fp16 scales by quant.clip). The token embedding
and an untied lm_head get round-to-nearest at ``quant.embed_bits`` with the same clip rule, or GPTQ against the
output head's Hessian with quant.embed_gptq. The record's other levers, each off by default: LQER corrections of the
worst-quantized matrices (quant.lqer, speedrun.quant.lqer) and per-row codes for the small gate tensors
(quant.gate_bits). Values are stored one per int8 byte (6 bits used) and the compressor's entropy coder removes the
unused bits: on the tiny model's 458,752 int6 block weights (empirical entropy 5.50 bits/value = 315,500 bytes)
the int8 containers compress to 316,226 bytes with brotli-11 and 321,844 with lzma-9, against 333,309 and 337,452
for the same values bit-packed 4-in-3 bytes first: packing splits values across byte boundaries, which
byte-oriented LZ matching and entropy models cannot see through.

The packed state dict maps each name to its fields: ``q`` + ``scale`` (codes and per-row fp16 scales; plus the
LQER fields), ``half`` (fp16) or ``raw`` (as it was). It is serialized with torch.save and compressed as one
stream (speedrun.quant.compression), or with quant.compressor=pergroup split into groups of like tensors
compressed apart (speedrun.quant.pergroup), a blob that carries its own header.

val_bpb_quant is measured on the dequantized round trip, so it is the number the artifact actually earns.
artifact_bytes = compressed blob + the code's bytes by artifact.code_rule (speedrun.artifact.code_count).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from speedrun.config.choices import QuantClip, QuantName
from speedrun.config.compressors import PERGROUP, check_compressor
from speedrun.config.quant import TENSOR_CLASSES, QuantConfig
from speedrun.progress import Progress
from speedrun.quant.classes import EMBED_NAMES, tensor_class
from speedrun.quant.compression import CHUNK_BYTES, COMPRESSORS, STREAMS, compress, decompress

__all__ = ["CHUNK_BYTES", "COMPRESSORS", "STREAMS", "check_compressor", "compress", "decompress"]
# GPTQ (speedrun.quant.gptq), LQER (lqer) and the per-group container (pergroup) are imported where a Plan that
# chooses them reaches them: a run's train_gpt.py carries only the modules its Plan uses (speedrun.artifact.closure)
GPTQ_NAMES = ("collect_hessians", "gptq_layers", "qmax_of", "quantize_gptq", "quantize_rtn", "search_scales")
"""speedrun.quant.gptq's names, importable from here too, loaded on first use."""


def __getattr__(name: str) -> Any:
    if name in GPTQ_NAMES + ("sigma_scales",):
        from speedrun.quant import gptq  # on first use, as above

        return getattr(gptq, name)
    raise AttributeError(f"module 'speedrun.quant.quantize' has no attribute {name!r}")


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
    """What the export measured on the way (timings, the per-tensor report): speedrun.run.finish fills it."""


def quantize_state_dict(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
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
        if "lqer_a" not in entry:
            return w
        from speedrun.quant.lqer import dequantize_correction  # a Plan's choice (artifact.closure)

        return w + dequantize_correction(entry)
    if "half" in entry:
        return entry["half"].float()
    return entry["raw"]


def dequantize_state_dict(packed: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: dequantize_entry(entry) for name, entry in packed.items()}


def export(
    state: dict[str, torch.Tensor],
    compressor: str,
    level: int,
    log: Callable[[str], None] | None = None,
    codec: str = "brotli",
) -> Artifact:
    """quant=int8: quantize, serialize, compress."""
    return export_packed(quantize_state_dict(state), compressor, level, log, codec)


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
    if compressor == PERGROUP:
        from speedrun.quant import pergroup  # a Plan's choice (artifact.closure)

        check_compressor(compressor, level, codec)
        blob, groups = pergroup.pack(packed, codec, level, log, workers)
    else:
        buf = io.BytesIO()
        torch.save(packed, buf)
        blob = compress(buf.getvalue(), compressor, level, log)
        groups = {"all": len(blob)}
    seconds = round(time.perf_counter() - t0, 3)
    return Artifact(blob=blob, compress_seconds=seconds, group_bytes=groups)


def load_packed(blob: bytes, compressor: str) -> dict[str, dict[str, torch.Tensor]]:
    """The packed state dict of an artifact (a pergroup blob names its codec in its header)."""
    if compressor == PERGROUP:
        from speedrun.quant import pergroup  # a Plan's choice (artifact.closure)

        return pergroup.unpack(blob)
    return torch.load(io.BytesIO(decompress(blob, compressor)), map_location="cpu", weights_only=True)


def load_artifact(blob: bytes, compressor: str) -> dict[str, torch.Tensor]:
    return dequantize_state_dict(load_packed(blob, compressor))


# ---------------------------------------------------------------------------------------------------------
# int6: GPTQ and the record's levers


def quantize_rows(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """quant.gate_bits: round-to-nearest with one fp16 absmax scale per row (the first dimension; a vector is one
    row) -> (int8 codes in w's shape, fp16 scales)."""
    from speedrun.quant.gptq import qmax_of  # a Plan's choice (artifact.closure)

    qmax = qmax_of(bits)
    rows = w.detach().float().reshape(w.shape[0] if w.ndim > 1 else 1, -1)
    scale = (rows.abs().amax(dim=1) / qmax).clamp_min(1e-8).half()
    q = torch.clamp(torch.round(rows / scale.float()[:, None]), -qmax, qmax).to(torch.int8)
    return q.reshape(w.shape), scale


def quantize_int6(
    state: dict[str, torch.Tensor],
    hessians: dict[str, torch.Tensor],
    q: QuantConfig,
    progress: Progress | None = None,
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, dict[str, Any]]]:
    """quant=int6 -> (packed state dict in state-dict order, the rule each tensor got: class, method, bits, clip).

    GPTQ for the tensors in ``hessians`` (the embedding's is there only with quant.embed_gptq; with quant.awq, the
    most salient column groups of all of them at awq.bits inside the same solve), round-to-nearest
    at embed_bits for an embedding without one, per-row codes for the gates with quant.gate_bits, the int8 export's
    rules for everything else; then LQER corrections of the quant.lqer.top_k matrices with the largest error.
    ``progress`` is ticked after each GPTQ matrix."""
    from speedrun.quant.gptq import FineColumns, quantize_gptq_fine, quantize_rtn  # a Plan's choice (closure)

    sigma = q.clip == QuantClip.sigma
    packed: dict[str, dict[str, torch.Tensor]] = {}
    rules: dict[str, dict[str, Any]] = {}
    rest: dict[str, torch.Tensor] = {}
    done = 0

    def matrix_rule(name: str, method: str) -> tuple[int, float | None]:
        cls = tensor_class(name)
        bits = q.embed_bits if cls == "embed" or method == "rtn" else q.bits
        k = q.sigmas.of(cls if cls in TENSOR_CLASSES else "matrix") if sigma else None  # a large gate: matrix
        rules[name] = {
            "class": cls,
            "method": method,
            "bits": bits,
            "clip": f"sigma {k:g}" if sigma else "absmax_search",
        }
        return bits, k

    promoted = awq_choice(state, hessians, q)
    for name, tensor in state.items():
        if name in hessians:
            H = hessians[name]
            bits, k = matrix_rule(name, "gptq")
            fine = FineColumns(tuple(promoted[name]), q.awq.group_size, q.awq.bits) if name in promoted else None
            codes, scale, step = quantize_gptq_fine(
                tensor.to(H.device),
                H,
                bits=bits,
                damp=q.damp,
                block_size=q.block_size,
                clip_ratios=q.clip_ratios,
                sigma=k,
                fine=fine,
            )
            packed[name] = {"q": codes.cpu(), "scale": scale.cpu()}
            if fine is not None and step is not None:
                packed[name].update(
                    awq_start=torch.tensor(fine.starts, dtype=torch.int16),
                    awq_size=torch.tensor([fine.size], dtype=torch.int16),
                    awq_scale=step.cpu(),
                )
                rules[name]["awq"] = {"starts": list(fine.starts), "size": fine.size, "bits": fine.bits}
            done += 1
            if progress is not None:
                progress.tick(done, len(hessians))
        elif q.gate_bits is not None and tensor_class(name) == "gate" and tensor.is_floating_point():
            codes, scale = quantize_rows(tensor.cpu(), q.gate_bits)
            packed[name] = {"q": codes, "scale": scale}
            rules[name] = {"class": "gate", "method": "rtn", "bits": q.gate_bits, "clip": "absmax"}
        elif name in EMBED_NAMES and tensor.is_floating_point():
            bits, k = matrix_rule(name, "rtn")
            codes, scale = quantize_rtn(tensor.detach(), bits, q.clip_ratios, sigma=k)
            packed[name] = {"q": codes.cpu(), "scale": scale.cpu()}
        else:
            rest[name] = tensor
    for name, entry in quantize_state_dict(rest).items():
        if "q" in entry:  # a large 2-D tensor GPTQ did not see (none in our GPT): per-row at embed_bits
            bits, k = matrix_rule(name, "rtn")
            codes, scale = quantize_rtn(rest[name].detach(), bits, q.clip_ratios, sigma=k)
            entry = {"q": codes.cpu(), "scale": scale.cpu()}
        else:
            kind = next(iter(entry))
            rules[name] = {"class": "float", "method": kind, "bits": entry[kind].element_size() * 8, "clip": None}
        packed[name] = entry
    if q.lqer.rank:
        add_lqer(state, packed, rules, q.lqer.rank, q.lqer.top_k, q.lqer.factor_bits, q.lqer.asym_group)
    return {name: packed[name] for name in state}, {name: rules[name] for name in state}


def awq_choice(
    state: dict[str, torch.Tensor], hessians: dict[str, torch.Tensor], q: QuantConfig
) -> dict[str, list[int]]:
    """quant.awq: the promoted column groups ({matrix: starts}) among the GPTQ'd matrices whose bits are below
    awq.bits (speedrun.quant.gptq.awq_groups); {} when off."""
    if not q.awq.top_k:
        return {}
    from speedrun.quant.gptq import awq_groups  # a Plan's choice (artifact.closure)

    coarse = {
        name: state[name]
        for name in state
        if name in hessians and (q.embed_bits if tensor_class(name) == "embed" else q.bits) < q.awq.bits
    }
    return awq_groups(coarse, hessians, q.awq.group_size, q.awq.top_k)


def add_lqer(
    state: dict[str, torch.Tensor],
    packed: dict[str, dict[str, torch.Tensor]],
    rules: dict[str, dict[str, Any]],
    rank: int,
    top_k: int,
    bits: int,
    group: int,
) -> list[str]:
    """Add LQER correction fields to the ``top_k`` quantized matrices (gates aside) whose ||W - dequant(Q)||_F is
    largest; returns their names, worst first."""
    from speedrun.quant.lqer import correction  # a Plan's choice (artifact.closure)

    errors = {
        name: float((state[name].detach().float().cpu() - dequantize_entry(entry)).norm())
        for name, entry in packed.items()
        if "q" in entry and rules[name]["class"] != "gate" and entry["q"].ndim == 2
    }
    chosen = sorted(errors, key=lambda name: -errors[name])[:top_k]
    for name in chosen:
        error = state[name].detach().float().cpu() - dequantize_entry(packed[name])
        packed[name].update(correction(error, rank, bits, group))
        rules[name]["lqer"] = {"rank": min(rank, *error.shape), "factor_bits": bits, "group": group}
    return chosen


def quantize_state_dict_gptq(
    state: dict[str, torch.Tensor],
    hessians: dict[str, torch.Tensor],
    *,
    bits: int,
    embed_bits: int,
    damp: float,
    block_size: int,
    clip_ratios: Sequence[float],
    progress: Progress | None = None,
) -> dict[str, dict[str, torch.Tensor]]:
    """quant=int6 with every lever off (quantize_int6's packed state dict)."""
    settings = QuantConfig(
        name=QuantName.int6,
        bits=bits,
        embed_bits=embed_bits,
        damp=damp,
        block_size=block_size,
        clip_ratios=list(clip_ratios),
    )
    return quantize_int6(state, hessians, settings, progress)[0]
