"""LQER (quant.lqer): a low-rank correction of a quantized matrix, stored in the artifact and added back when it is
dequantized.

The quantization error E = W - dequant(Q) of a matrix is not noise-like after GPTQ and clipping: a few directions
carry much of it. Its best rank-r approximation (Eckart-Young: the top r singular triplets, E_r = U_r S_r V_r^T)
costs r x (rows + cols) values, a fraction of a percent of the matrix, and removes the most error any rank-r term
can. The two factors are balanced (A = S^1/2 U^T, r x rows; B = S^1/2 V^T, r x cols), so both have the same
range, and each is stored at quant.lqer.factor_bits: every factor row is cut into ceil(n / asym_group) equal
groups, each with an fp16 minimum and an fp16 step, and codes 0..2^bits - 1 (asymmetric: a group's codes span
exactly its [min, max], whatever its sign balance). The record also corrects its top 3 matrices at rank 4 with
4-bit groups of 64; its first factor it keeps at 2 bits with one scale per matrix, where ours is quantized the
same way as the second.

Packed entry fields, beside a matrix's ``q`` and ``scale``: ``lqer_a``/``lqer_b`` (uint8 codes, r x rows and
r x cols), ``lqer_a_min``/``lqer_a_step`` and ``lqer_b_min``/``lqer_b_step`` (fp16, r x groups).
"""

from __future__ import annotations

import math

import torch

FIELDS = ("lqer_a", "lqer_a_min", "lqer_a_step", "lqer_b", "lqer_b_min", "lqer_b_step")


def low_rank(error: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best rank-``rank`` approximation of ``error`` as balanced factors (A, B), A^T B = U_r S_r V_r^T:
    A (r, rows) and B (r, cols), float32. r is capped by the matrix's smaller side."""
    U, S, Vh = torch.linalg.svd(error.float(), full_matrices=False)
    r = min(rank, S.numel())
    root = S[:r].sqrt()
    return (U[:, :r] * root).T.contiguous(), (root[:, None] * Vh[:r]).contiguous()


def _groups(n: int, group: int) -> tuple[int, int]:
    """(number of groups, values per group) of a row of n values: ceil(n / group) groups of equal size."""
    count = max(1, math.ceil(n / group))
    return count, math.ceil(n / count)


def quantize_groups(m: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric per-group quantization of each row of ``m`` (r, n) -> (uint8 codes (r, n), fp16 min (r, g),
    fp16 step (r, g)): value ~ min + code x step, codes in 0..2^bits - 1, min and step as stored (fp16)."""
    if not 2 <= bits <= 8:
        raise ValueError(f"quant.lqer.factor_bits must be in 2..8, got {bits}")
    rows, n = m.shape
    count, size = _groups(n, group)
    pad = count * size - n
    # the last group is padded with its own last value, which moves neither its minimum nor its maximum
    full = torch.cat([m.float(), m[:, -1:].float().expand(rows, pad)], dim=1).view(rows, count, size)
    levels = 2**bits - 1
    lo = full.amin(dim=2).half()
    step = ((full.amax(dim=2) - lo.float()) / levels).half()
    safe = torch.where(step.float() > 0, step.float(), torch.ones_like(step.float()))  # a constant group: code 0
    codes = torch.clamp(torch.round((full - lo.float()[..., None]) / safe[..., None]), 0, levels)
    return codes.view(rows, count * size)[:, :n].to(torch.uint8).contiguous(), lo, step


def dequantize_groups(codes: torch.Tensor, lo: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The values quantize_groups stored: min + code x step, per group, as float32 (r, n)."""
    n = codes.size(1)
    index = torch.arange(n, device=codes.device) // math.ceil(n / lo.size(1))  # each value's group, as stored
    return lo.float()[:, index] + codes.float() * step.float()[:, index]


def correction(error: torch.Tensor, rank: int, bits: int, group: int) -> dict[str, torch.Tensor]:
    """The packed fields (FIELDS) of the rank-``rank`` correction of ``error`` = W - dequant(Q)."""
    a, b = low_rank(error, rank)
    qa, a_min, a_step = quantize_groups(a, bits, group)
    qb, b_min, b_step = quantize_groups(b, bits, group)
    return dict(zip(FIELDS, (qa, a_min, a_step, qb, b_min, b_step)))


def dequantize_correction(entry: dict[str, torch.Tensor]) -> torch.Tensor:
    """A^T B of a packed entry's correction fields: the (rows, cols) term added to dequant(Q)."""
    a = dequantize_groups(entry["lqer_a"], entry["lqer_a_min"], entry["lqer_a_step"])
    b = dequantize_groups(entry["lqer_b"], entry["lqer_b_min"], entry["lqer_b_step"])
    return a.T @ b
