"""Validation loss and bits per byte over a fixed slice of the validation split.

The harness is fixed and kept apart from what experiments change: the same tokens, windows and byte
accounting for every run, so numbers compare across runs (and with parameter-golf's leaderboard).

Two ways to cut the token stream into windows of the model's context T (targets are positions 1..M of the
stream, M = len(val_tokens) - 1; a window starting at a feeds inputs a..a+T-1 and predicts a+1..a+T):

- standard: non-overlapping windows a = 0, T, 2T, ...; each target sees 0..T-1 tokens of context. Where M is not
  a multiple of T (the split's tail, kept with eval.include_tail: speedrun.core.data.load_val_tokens otherwise
  cuts it), one more full-length window ends exactly at M and scores only the r < T targets not yet scored.
- sliding (stride S): windows a = 0, S, 2S, ... The first window scores all its T targets, every later one
  only its last S, so each target after the first window sees at least T - S tokens of context. Where the
  last full stride does not reach M, one more full-length window is placed to end exactly at M and scores
  only the r < S targets not yet scored (parameter-golf's loop re-scores those tail targets instead). Every
  target is scored exactly once; S == T gives the standard windows and the same sums.

Bytes: each scored target's bytes by the tokenizer's rule (speedrun.data.bpb), or, with a byte sidecar (CaseOps data),
the sidecar's at the target's stream position: val_bpb is then of the original text's bytes.

Document isolation (eval.document_isolated) keeps the windows and switches on the model's document mask
(``document_mask``): a token attends only to tokens of its own document (BOS-delimited) inside the window.

On several ranks (``shard``, a speedrun.core.dist.World) the batches of windows are dealt round-robin, each rank puts
every batch's float64 nats and int64 bytes in that batch's slot of a vector (zeros elsewhere), and the vectors are
all-reduced: each slot has one non-zero term, so the sum is exact, and adding the slots in batch order on the host
gives the same sums, bit for bit, as one rank scoring every batch (the batches, and so the kernels' shapes, are
the same).

A time budget (``max_seconds``, eval.max_seconds) is checked after each round of batches (one per rank) on rank 0's
clock, so every rank stops after the same round: what was scored is then the first batches, targets 1..tokens of
the stream, and the result says so (``tokens`` < ``tokens_total``, ``complete`` false). The check reads the host's
clock, and a GPU may still be running the batches queued before it: the cut comes a batch or two late there.
Without a budget nothing is checked and no collective is added.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from speedrun.core.data import ByteLUTs, token_bytes
from speedrun.progress import Progress


@dataclass(frozen=True)
class EvalResult:
    val_loss: float
    """Mean nats per scored token."""
    val_bpb: float
    tokens: int
    """Targets scored: 1..tokens of the stream (fewer than tokens_total when a time budget cut the pass short)."""
    bytes: int
    tokens_total: int = 0
    """Targets the whole pass covers."""

    @property
    def complete(self) -> bool:
        return self.tokens == self.tokens_total


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
    shard: Any = None,
    progress: Progress | None = None,
    max_seconds: float | None = None,
    on_token_scores: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    include_tail: bool = False,
) -> EvalResult:
    """Score non-overlapping windows of seq_len; ``forward(x, y)`` returns per-token nats of shape (B, T).

    Every token after the first is scored exactly once; a tail shorter than seq_len is scored only with
    ``include_tail`` (eval.include_tail: one more window ending at the last token, see the module doc), else the
    targets past the last full window are not read; sums are float64 so long evaluations do not drift.
    shard: split the batches over ranks (see the module doc); None scores them all here. progress: ticked after
    each batch with the tokens of the whole evaluation up to it (on several ranks, the ranks move in step).
    max_seconds: stop after the round of batches that spends it (see the module doc). on_token_scores: called after
    each batch with the stream positions of the targets it scored and their float64 nats (tests of causality).
    """
    n_targets = val_tokens.numel() - 1
    n_windows = n_targets // seq_len
    if n_windows < 1:
        raise ValueError(f"need at least {seq_len + 1} validation tokens, have {val_tokens.numel()}")
    if not include_tail:  # the default scores full windows only, whatever the stream's length
        n_targets = n_windows * seq_len
    tail = n_targets - n_windows * seq_len
    luts = luts.to(device)
    # each batch: its first window, or None for the tail's window (its own batch, after every full one)
    starts: list[int | None] = [*range(0, n_windows, batch_size), *([None] if tail else [])]
    batch_targets = [tail if start is None else min(batch_size, n_windows - start) * seq_len for start in starts]
    sums = _BatchSums(len(starts), device)
    deal = _Deal(starts, shard, max_seconds)
    for i, start in deal:
        if start is None:  # one window ending at the last target; only its last `tail` targets are new
            first, count = n_targets - seq_len + 1, 1
        else:
            first, count = start * seq_len + 1, min(batch_size, n_windows - start)
        span = val_tokens[first - 1 : first + count * seq_len].to(device, non_blocking=True)
        x = span[:-1].view(count, seq_len)
        y = span[1:].view(count, seq_len)
        nats = _scores(forward, x, y, device, autocast_dtype).double()
        positions = torch.arange(first, first + count * seq_len, device=device).view(count, seq_len)
        n_bytes = token_bytes(x, y, luts, positions)
        new = positions > n_targets - tail if start is None else torch.ones_like(positions, dtype=torch.bool)
        if start is None:
            nats, n_bytes = torch.where(new, nats, 0.0), torch.where(new, n_bytes, 0)
        sums.nats[i] = nats.sum()
        sums.bytes[i] = n_bytes.sum()
        if on_token_scores is not None:
            on_token_scores(positions[new], nats[new])
        if progress is not None:
            progress.tick(sum(batch_targets[: i + 1]), n_targets)
    total_nats, total_bytes, _ = sums.totals(shard)
    scored = sum(batch_targets[: deal.scored])  # the first deal.scored batches, on every rank
    sum_tokens = n_targets
    return EvalResult(
        val_loss=total_nats / scored,
        val_bpb=total_nats / math.log(2) / total_bytes,
        tokens=scored,
        bytes=total_bytes,
        tokens_total=sum_tokens,
    )


def _scores(
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    device: str,
    autocast_dtype: torch.dtype | None,
) -> torch.Tensor:
    """Per-token nats of a batch of windows, under autocast when the run computes in lower precision."""
    if autocast_dtype is None:
        return forward(x, y)
    with torch.autocast(device, dtype=autocast_dtype):
        return forward(x, y)


def sliding_windows(n_targets: int, seq_len: int, stride: int) -> list[tuple[int, int]]:
    """(start, score_from) of every window of the sliding eval over targets 1..n_targets.

    A window feeds inputs start..start+T-1 (T = min(seq_len, n_targets)) and scores its targets from offset
    score_from on, i.e. stream positions start+score_from+1 .. start+T. Each position 1..n_targets is scored
    by exactly one window, in increasing order.
    """
    if n_targets < 1:  # the config and the Plan refuse a stride outside [1, seq_len]
        raise ValueError(f"need at least 2 validation tokens, have {n_targets + 1}")
    T = min(seq_len, n_targets)
    windows = [(0, 0)]
    scored_end = T  # targets 1..scored_end are scored
    start = stride
    while start + T <= n_targets:
        windows.append((start, T - stride))
        scored_end = start + T
        start += stride
    if scored_end < n_targets:  # the tail: a full window ending at n_targets, scoring only what is left
        rest = n_targets - scored_end
        windows.append((n_targets - T, T - rest))
    return windows


class _Deal:
    """(index, batch) of the batches this rank scores: every world_size-th, from its rank (all on one rank). With
    ``max_seconds``, after each round of world_size batches rank 0's clock says whether to go on; ``scored`` is
    then the number of batches (of every rank) scored, the same on every rank."""

    def __init__(self, batches: Any, shard: Any, max_seconds: float | None):
        self.batches, self.shard = list(batches), shard
        self.deadline = None if max_seconds is None else time.perf_counter() + max_seconds
        self.scored = 0

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        rank, world = (self.shard.rank, self.shard.world_size) if self.shard is not None else (0, 1)
        n = len(self.batches)
        for first in range(0, n, world):
            if first + rank < n:
                yield first + rank, self.batches[first + rank]
            self.scored = min(n, first + world)
            if self.deadline is not None and self.scored < n:
                late = 1.0 if time.perf_counter() > self.deadline else 0.0
                if self.shard is not None:
                    late = self.shard.agree(late)  # every rank calls this once per round: no rank waits alone
                if late:
                    return


class _BatchSums:
    """Per-batch sums in float64 (nats) and int64 (bytes, tokens), one slot per batch of the whole eval."""

    def __init__(self, n: int, device: str):
        self.nats = torch.zeros(n, dtype=torch.float64, device=device)
        self.bytes = torch.zeros(n, dtype=torch.int64, device=device)
        self.tokens = torch.zeros(n, dtype=torch.int64, device=device)

    def totals(self, shard: Any) -> tuple[float, int, int]:
        if shard is not None:
            for t in (self.nats, self.bytes, self.tokens):
                shard.sum_(t)
        total = 0.0
        for v in self.nats.tolist():  # in batch order, as one rank accumulating batch by batch would
            total += v
        return total, int(self.bytes.sum().item()), int(self.tokens.sum().item())


@torch.no_grad()
def evaluate_sliding(
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    val_tokens: torch.Tensor,
    luts: ByteLUTs,
    *,
    seq_len: int,
    stride: int,
    batch_size: int,
    device: str,
    autocast_dtype: torch.dtype | None,
    shard: Any = None,
    progress: Progress | None = None,
    max_seconds: float | None = None,
    on_token_scores: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> EvalResult:
    """Score every target once with windows of seq_len advancing by stride (see the module doc); ``progress``,
    ``max_seconds`` and ``on_token_scores`` as in ``evaluate``."""
    n_targets = val_tokens.numel() - 1
    windows = sliding_windows(n_targets, seq_len, stride)
    T = min(seq_len, n_targets)
    luts = luts.to(device)
    offsets = torch.arange(T + 1)
    positions = torch.arange(T, device=device)
    firsts = range(0, len(windows), batch_size)
    sums = _BatchSums(len(firsts), device)
    scored_through = _scored_through(windows, T, batch_size) if progress is not None else []
    deal = _Deal(firsts, shard, max_seconds)
    for i, first in deal:
        batch = windows[first : first + batch_size]
        starts = torch.tensor([w[0] for w in batch])
        score_from = torch.tensor([w[1] for w in batch], device=device)
        span = val_tokens[starts[:, None] + offsets[None, :]].to(device, non_blocking=True)
        x, y = span[:, :-1], span[:, 1:]
        nats = _scores(forward, x, y, device, autocast_dtype)
        scored = positions[None, :] >= score_from[:, None]
        targets = starts.to(device)[:, None] + positions[None, :] + 1  # a window starting at a predicts a+1 .. a+T
        sums.nats[i] = torch.where(scored, nats.double(), 0.0).sum()
        sums.bytes[i] = torch.where(scored, token_bytes(x, y, luts, targets), 0).sum()
        sums.tokens[i] = scored.sum()
        if on_token_scores is not None:
            on_token_scores(targets[scored], nats.double()[scored])
        if progress is not None:
            progress.tick(scored_through[i], n_targets)
    total_nats, total_bytes, total_tokens = sums.totals(shard)
    if deal.scored == len(firsts):
        assert total_tokens == n_targets, (total_tokens, n_targets)  # exactly once, by construction
    return EvalResult(
        val_loss=total_nats / total_tokens,
        val_bpb=total_nats / math.log(2) / total_bytes,
        tokens=total_tokens,
        bytes=total_bytes,
        tokens_total=n_targets,
    )


def _scored_through(windows: list[tuple[int, int]], T: int, batch_size: int) -> list[int]:
    """Targets scored by the sliding windows up to and including each batch, from the host's window list (the
    device's count would cost a sync per batch)."""
    out, total = [], 0
    for first in range(0, len(windows), batch_size):
        total += sum(T - score_from for _, score_from in windows[first : first + batch_size])
        out.append(total)
    return out


def run_eval(
    name: str,
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    val_tokens: torch.Tensor,
    luts: ByteLUTs,
    *,
    seq_len: int,
    stride: int | None,
    batch_size: int,
    device: str,
    autocast_dtype: torch.dtype | None,
    shard: Any = None,
    progress: Progress | None = None,
    max_seconds: float | None = None,
    include_tail: bool = False,
) -> EvalResult:
    """The eval group's dispatch: ``standard`` or ``sliding`` (with ``stride``); ``shard`` splits it over ranks;
    ``progress`` prints a throttled progress line (speedrun.progress.Progress); ``max_seconds`` cuts it short after
    the batch that spends it (the result's ``complete`` says whether it did)."""
    kwargs = dict(
        seq_len=seq_len,
        batch_size=batch_size,
        device=device,
        autocast_dtype=autocast_dtype,
        shard=shard,
        progress=progress,
        max_seconds=max_seconds,
    )
    if name == "sliding":  # the config refuses sliding without a stride, and any other name
        return evaluate_sliding(forward, val_tokens, luts, stride=stride or seq_len, **kwargs)
    return evaluate(forward, val_tokens, luts, include_tail=include_tail, **kwargs)


@contextmanager
def document_mask(model: Any, bos_id: int | None) -> Iterator[None]:
    """Switch the GPT's document mask on (attention only within BOS-delimited documents) for the duration.

    The model reads ``bos_id`` on every forward and hands it to its attention backend, whose prepare() builds
    the mask (flex, math; the resolver refuses the others). A compiled model
    guards on the attribute, so it recompiles once for the masked graph.
    """
    if bos_id is None:  # the Plan refuses document isolation on a backend without a mask
        yield
        return
    previous = model.bos_id
    model.bos_id = bos_id
    try:
        yield
    finally:
        model.bos_id = previous
