"""Phased global TTT: between batches of score-first LoRA TTT (speedrun.core.ttt_score), the model's own weights are
fine-tuned with SGD on documents that are already scored, as parameter-golf's 2026-04 records do (their
PHASED_TTT_* and GLOBAL_TTT_* settings).

When (``phase_schedule``): the first ``prefix_docs`` documents in the order TTT scores them are cut into
``phases`` equal groups; phase p runs right after the batch that scores the last document of group p, and trains
on every document scored up to that boundary (groups 0..p: cumulative, as the records). Every document it trains
on is a whole document whose every token has been scored, so no token's score can depend on an update that used
it or a later token. A phase that would end with the last batch is dropped: nothing is left to score after it.

How (``finetune``): the documents, in scoring order, are grouped into chunks of about ``chunk_tokens`` tokens
(whole documents); chunk c of n trains at lr x (1 + cos(pi c / n)) / 2, a cosine to 0 over the phase. A chunk's
rows are its documents, each cut into rows of at most seq_len tokens (a row never crosses a document boundary, so
this needs no document mask from the attention backend), sorted by length so that a step's rows pad little, and
taken ``batch_seqs`` rows per SGD step (momentum, gradient clipping to ``grad_clip``). The loss of a step is the
mean over its real tokens. SGD's momentum starts at zero in every phase.

Ranks: each step's rows are dealt round-robin over the ranks; each rank's loss is its share of the step's summed
nats over the step's token count (x world_size, which the gradient average divides out), so the averaged gradient
is the one-rank gradient, every rank applies the same update, and the models stay identical. The time budget is
checked before every step on rank 0's clock, so all ranks stop at the same step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from speedrun.core.ttt_docs import row_width
from speedrun.core.ttt_lora import GlobalSettings

if TYPE_CHECKING:  # annotations only: TTT is handed a World, it never makes one
    from speedrun.core.dist import World


@dataclass
class FinetuneStats:
    steps: int = 0
    tokens: int = 0
    """Tokens trained on (each epoch counted)."""
    seconds: float = 0.0
    stopped: bool = False
    """The time budget ran out during the fine-tune."""


def document_rows(docs: list[tuple[int, int]], seq_len: int) -> list[tuple[int, int]]:
    """(start, length) per row: each document (start, n_targets) cut into rows of at most seq_len inputs; a row
    feeds tokens start..start+length-1 and predicts start+1..start+length."""
    return [(start + lo, min(seq_len, n - lo)) for start, n in docs for lo in range(0, n, seq_len)]


def chunks_of(docs: list[tuple[int, int]], chunk_tokens: int) -> list[list[tuple[int, int]]]:
    """Consecutive whole documents, each group closed once it holds at least chunk_tokens targets."""
    chunks: list[list[tuple[int, int]]] = [[]]
    size = 0
    for doc in docs:
        chunks[-1].append(doc)
        size += doc[1]
        if size >= chunk_tokens:
            chunks.append([])
            size = 0
    return [c for c in chunks if c]


@dataclass(frozen=True)
class PhaseStep:
    """One SGD step of a phase, as this rank runs it."""

    chunk: int
    """Its chunk's index in the phase (the learning rate's cosine runs over the chunks)."""
    chunks: int
    forwards: list[list[tuple[int, int]]]
    """This rank's rows (start, n_targets), per forward (within settings.micro_rows x seq_len padded tokens each:
    ``_forwards``; their gradients add up)."""
    tokens: int
    """The step's targets over every rank: its loss is their mean."""


def phase_steps(
    docs: list[tuple[int, int]], settings: GlobalSettings, seq_len: int, rank: int = 0, world: int = 1
) -> Iterator[PhaseStep]:
    """The steps ``finetune`` takes on ``docs`` (the module doc's chunks, rows and ranks), in order. What a step
    computes depends on the weights; which rows it runs, and so its shapes (``phase_shapes``), does not."""
    chunks = chunks_of(docs, settings.chunk_tokens)
    for c, chunk in enumerate(chunks):
        rows = sorted(document_rows(chunk, seq_len), key=lambda r: -r[1])  # stable: ties keep scoring order
        for _ in range(settings.epochs):
            for first in range(0, len(rows), settings.batch_seqs):
                step_rows = rows[first : first + settings.batch_seqs]
                budget = None if settings.micro_rows is None else settings.micro_rows * seq_len
                forwards = _forwards(step_rows[rank::world], seq_len, budget)
                yield PhaseStep(c, len(chunks), forwards, sum(n for _, n in step_rows))


def _forwards(rows: list[tuple[int, int]], seq_len: int, budget: int | None) -> list[list[tuple[int, int]]]:
    """A rank's rows of a step (longest first) cut into forwards, each holding rows while their padded tokens (rows
    x the width of its first, longest row) stay within ``budget`` (None: all rows in one forward). Counting tokens
    rather than rows lets short documents go many to a forward, as activations allow: every forward is a whole
    eager pass over the model (launches and all), whatever its rows. On the rate script's phases (64 documents,
    a budget of 16 rows of 2048) 3 forwards instead of 9, the same padded tokens."""
    forwards: list[list[tuple[int, int]]] = []
    for row in rows:
        if forwards and (budget is None or (len(forwards[-1]) + 1) * _width(forwards[-1], seq_len) <= budget):
            forwards[-1].append(row)
        else:
            forwards.append([row])
    return forwards


def phase_shapes(
    docs: list[tuple[int, int]], settings: GlobalSettings, seq_len: int, rank: int = 0, world: int = 1
) -> set[tuple[int, int]]:
    """(rows, width) of every forward ``finetune`` runs on ``docs`` on this rank."""
    return {
        (len(rows), _width(rows, seq_len))
        for step in phase_steps(docs, settings, seq_len, rank, world)
        for rows in step.forwards
    }


def warm_up_phases(
    model: nn.Module,
    shapes: set[tuple[int, int]],
    *,
    vocab: int,
    device: str,
    autocast_dtype: torch.dtype | None,
) -> None:
    """A forward and backward of ``model`` at each (rows, width) of ``shapes``, on random tokens (never validation
    data), as ``finetune`` runs them, without a step: the gradients are dropped and the weights stay as they were.
    Why: the first call at a shape pays for its plans (cuDNN's attention graphs, cuBLAS's heuristics) and every
    phase's rows are a new shape; TTT runs this before its clock (speedrun.core.ttt_score), as it captures its steps."""
    gen = torch.Generator().manual_seed(0)
    for rows, width in sorted(shapes, reverse=True):
        x, y = (torch.randint(0, vocab, (rows, width), generator=gen).to(device) for _ in range(2))
        nats = _nats(model, x, y, device, autocast_dtype)
        torch.where(torch.ones_like(x, dtype=torch.bool), nats, 0.0).sum().backward()
    for p in model.parameters():
        p.grad = None


def finetune(
    model: nn.Module,
    tokens: torch.Tensor,
    docs: list[tuple[int, int]],
    settings: GlobalSettings,
    *,
    seq_len: int,
    device: str,
    autocast_dtype: torch.dtype | None,
    shard: World | None = None,
    deadline: float | None = None,
) -> FinetuneStats:
    """Fine-tune every trainable parameter of ``model`` in place on ``docs`` (start, n_targets) of the 1-D stream
    ``tokens`` (on ``device``), as the module doc says. ``shard``: a World whose ranks all call this together."""
    t0 = time.perf_counter()
    stats = FinetuneStats()
    rank, world = (shard.rank, shard.world_size) if shard is not None else (0, 1)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum)
    last = tokens.numel() - 1

    def out_of_time() -> bool:
        if deadline is None:
            return False
        late = 1.0 if time.perf_counter() > deadline else 0.0
        return bool(shard.agree(late) if shard is not None else late)

    for step in phase_steps(docs, settings, seq_len, rank, world):
        for group in opt.param_groups:
            group["lr"] = settings.lr * 0.5 * (1.0 + math.cos(math.pi * step.chunk / step.chunks))
        if out_of_time():
            stats.stopped = True
            stats.seconds = time.perf_counter() - t0
            return stats
        opt.zero_grad(set_to_none=True)
        for rows in step.forwards:
            x, y, valid = _gather(tokens, rows, seq_len, last, device)
            nats = _nats(model, x, y, device, autocast_dtype)
            # x world: the gradient average over the ranks divides it out again
            (torch.where(valid, nats, 0.0).sum() * (world / step.tokens)).backward()
        if shard is not None:
            shard.sync_grads(params)
        if settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        opt.step()
        stats.steps += 1
        stats.tokens += step.tokens
    opt.zero_grad(set_to_none=True)
    stats.seconds = time.perf_counter() - t0
    return stats


def _gather(
    tokens: torch.Tensor, rows: list[tuple[int, int]], seq_len: int, last: int, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, targets and the mask of real positions of ``rows``, padded at the end to one width."""
    width = _width(rows, seq_len)
    cols = torch.arange(width, device=device)
    idx = torch.tensor([s for s, _ in rows], device=device)[:, None] + cols[None, :]
    valid = cols[None, :] < torch.tensor([n for _, n in rows], device=device)[:, None]
    x = torch.where(valid, tokens[idx.clamp(max=last - 1)], 0)
    y = torch.where(valid, tokens[(idx + 1).clamp(max=last)], 0)
    return x, y, valid


def _width(rows: list[tuple[int, int]], seq_len: int) -> int:
    """The width a forward's rows are padded to: a power of two (row_width), so the phases run few shapes."""
    return row_width(max(n for _, n in rows), seq_len)


def _nats(
    model: Callable[..., torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    device: str,
    autocast_dtype: torch.dtype | None,
) -> torch.Tensor:
    """Per-token nats (B, T) of ``model``, under autocast when the run uses it."""
    if autocast_dtype is None:
        return model(x, y, reduction="none")
    with torch.autocast(device, dtype=autocast_dtype):
        return model(x, y, reduction="none")
