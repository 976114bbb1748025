"""Validation loss and bits per byte over a fixed slice of the validation split.

The harness is fixed and kept apart from what experiments change: the same tokens, windows and byte
accounting for every run, so numbers compare across runs (and with parameter-golf's leaderboard).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .data.bpb import ByteLUTs, token_bytes


@dataclass(frozen=True)
class EvalResult:
    val_loss: float
    """Mean nats per token."""
    val_bpb: float
    tokens: int
    bytes: int


@torch.no_grad()
def evaluate(
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    val_tokens: torch.Tensor,
    luts: ByteLUTs,
    *,
    seq_len: int,
    batch_size: int,
    device: str,
    autocast_dtype: torch.dtype | None,
) -> EvalResult:
    """Score non-overlapping windows of seq_len; ``forward(x, y)`` returns per-token nats of shape (B, T).

    Every token after the first is scored exactly once; sums are float64 so long evaluations do not drift.
    """
    n_windows = (val_tokens.numel() - 1) // seq_len
    if n_windows < 1:
        raise ValueError(f"need at least {seq_len + 1} validation tokens, have {val_tokens.numel()}")
    luts = luts.to(device)
    sum_nats = torch.zeros((), dtype=torch.float64, device=device)
    sum_bytes = torch.zeros((), dtype=torch.int64, device=device)
    sum_tokens = 0
    for start in range(0, n_windows, batch_size):
        count = min(batch_size, n_windows - start)
        span = val_tokens[start * seq_len: (start + count) * seq_len + 1].to(device, non_blocking=True)
        x = span[:-1].view(count, seq_len)
        y = span[1:].view(count, seq_len)
        if autocast_dtype is not None:
            with torch.autocast(device, dtype=autocast_dtype):
                nats = forward(x, y)
        else:
            nats = forward(x, y)
        sum_nats += nats.double().sum()
        sum_bytes += token_bytes(x, y, luts).sum()
        sum_tokens += y.numel()
    total_nats, total_bytes = float(sum_nats.item()), int(sum_bytes.item())
    return EvalResult(
        val_loss=total_nats / sum_tokens,
        val_bpb=total_nats / math.log(2) / total_bytes,
        tokens=sum_tokens,
        bytes=total_bytes,
    )
