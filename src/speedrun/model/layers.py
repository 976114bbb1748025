"""The GPT's parameter-free pieces, as plain functions with a reference test each: RMSNorm, RoPE (full and
partial), XSA."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dim, computed in fp32, returned in x's dtype."""
    return F.rms_norm(x.float(), (x.size(-1),)).to(x.dtype)


def rope_tables(
    seq_len: int, head_dim: int, base: float, rope_dims: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (seq_len, rd // 2), fp32, rd = rope_dims or head_dim: the frequencies are spread over the
    rotated channels (the record's Rotary(rope_dims=16): inv_freq = 1 / base^(arange(0, rd, 2) / rd))."""
    rd = rope_dims or head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) by position; halves convention (x1 = first D/2 dims), as parameter-golf."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dims: int) -> torch.Tensor:
    """Rotate the first rope_dims channels of (B, H, T, D) (halves convention within them), pass the rest through
    (the record's apply_rotary_emb with rope_dims > 0). rope_dims >= D is apply_rope."""
    if rope_dims >= x.size(-1):
        return apply_rope(x, cos, sin)
    return torch.cat((apply_rope(x[..., :rope_dims], cos, sin), x[..., rope_dims:]), dim=-1)


def xsa(y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """XSA (the record's _xsa_efficient): y (B, H, T, D) attention output, v (B, Hkv, T, D) values; returns
    y - (y . v_hat) v_hat per head and position, v_hat = v / |v| of the head's KV group (query head h reads KV head
    h // (H // Hkv), as GQA's repeat_interleave). Computed in fp32, returned in y's dtype."""
    B, H, T, D = y.shape
    hkv = v.size(1)
    yg = y.float().reshape(B, hkv, H // hkv, T, D)
    vn = F.normalize(v.float(), dim=-1).unsqueeze(2)
    return (yg - (yg * vn).sum(dim=-1, keepdim=True) * vn).reshape(B, H, T, D).to(y.dtype)
