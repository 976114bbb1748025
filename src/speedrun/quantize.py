"""The artifact: quantized weights, compressed, plus the compressed code that produced them.

``quant=int8`` follows parameter-golf's baseline export: 2-D float tensors large enough to matter become
per-row int8 with a clipped absmax scale (fp16 scales); small tensors are kept in fp16, scalar controls in fp32.
val_bpb_quant is measured on the dequantized round trip, so it is the number the artifact actually earns.
"""
from __future__ import annotations

import io
import lzma
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

KEEP_FLOAT_MAX_NUMEL = 65_536
"""Tensors this small stay in floating point: their int8 savings are negligible, their error is not."""
CLIP_QUANTILE = 0.9999984
"""Per-row clip at this quantile of |w| (parameter-golf's baseline value): one outlier must not set the scale."""

COMPRESSORS = {
    "zlib": (lambda data, level: zlib.compress(data, level), zlib.decompress),
    "lzma": (lambda data, level: lzma.compress(data, preset=level), lzma.decompress),
}


@dataclass(frozen=True)
class Artifact:
    blob: bytes
    """Compressed quantized state dict."""
    code_bytes: int
    """Compressed size of the code (the speedrun package and run.py)."""

    @property
    def total_bytes(self) -> int:
        return len(self.blob) + self.code_bytes


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


def dequantize_state_dict(packed: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    state = {}
    for name, entry in packed.items():
        if "q" in entry:
            state[name] = entry["q"].float() * entry["scale"].float().unsqueeze(1)
        elif "half" in entry:
            state[name] = entry["half"].float()
        else:
            state[name] = entry["raw"]
    return state


def code_files() -> list[Path]:
    src = Path(__file__).resolve().parent
    return sorted(src.rglob("*.py")) + [src.parent / "run.py"]


def compress(data: bytes, compressor: str, level: int) -> bytes:
    if compressor not in COMPRESSORS:
        raise ValueError(f"quant.compressor={compressor}: unknown; choose one of {', '.join(COMPRESSORS)}")
    return COMPRESSORS[compressor][0](data, level)


def decompress(blob: bytes, compressor: str) -> bytes:
    return COMPRESSORS[compressor][1](blob)


def export(state: dict[str, torch.Tensor], compressor: str, level: int) -> Artifact:
    buf = io.BytesIO()
    torch.save(quantize_state_dict(state), buf)
    code = b"".join(p.read_bytes() for p in code_files() if p.exists())
    return Artifact(blob=compress(buf.getvalue(), compressor, level), code_bytes=len(compress(code, compressor, level)))


def load_artifact(blob: bytes, compressor: str) -> dict[str, torch.Tensor]:
    packed = torch.load(io.BytesIO(decompress(blob, compressor)), map_location="cpu", weights_only=True)
    return dequantize_state_dict(packed)
