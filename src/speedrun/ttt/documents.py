"""Which documents TTT adapts, in which batches and in which order: BOS-delimited documents of the validation stream,
each with its chunk size, batched by length, the batches shuffled with the run's seed.

Chunk size: ``ttt.chunk_size``, or for short documents the schedule ``ttt.short_chunks`` = "LEN:CHUNK,...": a
document with at most LEN scored tokens uses CHUNK, the first LEN (ascending) that fits; longer documents use
chunk_size. This is parameter-golf's TTT_SHORT_SCORE_FIRST_STEPS (PR #2014: "256:8,2000:24" with a default chunk of
48): a chunk *size* per document-length bucket, not a number of chunks; there the bucket is chosen by the longest
document of a batch, here per document (batches never mix chunk sizes).

The seeded random order of the batches makes a run cut short by ttt.max_seconds score an unbiased sample of
documents rather than the shortest or longest; it is also the scoring order the global phases count documents in.

On several ranks, deal_batches gives each rank its batches (and, with warm_start_a, each batch its chain); a rank
runs its own in the scoring order.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from speedrun.ttt.base_scores import base_windows
from speedrun.ttt.global_phases import row_width
from speedrun.ttt.graphs import pad_rows


def chunk_size_for(n_targets: int, chunk_size: int, short_chunks: list[tuple[int, int]]) -> int:
    """The chunk size of a document with n_targets scored tokens."""
    for length, chunk in short_chunks:
        if n_targets <= length:
            return chunk
    return chunk_size


def split_documents(tokens: torch.Tensor, bos_id: int) -> list[tuple[int, int]]:
    """(start, n_targets) per document of a 1-D stream: a document starts at a BOS (or at 0 for a leading
    fragment) and owns the targets start+1 .. next BOS (inclusive; the stream's end for the last one)."""
    n = tokens.numel()
    starts = (tokens == bos_id).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0] + starts
    ends = starts[1:] + [n - 1]
    docs = [(s, e - s) for s, e in zip(starts, ends) if e > s]
    assert sum(d[1] for d in docs) == n - 1
    return docs


def document_batches(
    docs: list[tuple[int, int]], chunk_size: int, steps: list[tuple[int, int]], batch_size: int, seed: int
) -> list[list[int]]:
    """Document indices per batch, in the order they are scored: documents of similar length side by side (one
    chunk size per batch), the batches in a seeded random order."""
    order = sorted(range(len(docs)), key=lambda i: docs[i][1])
    batches: list[list[int]] = []
    for i in order:
        c = chunk_size_for(docs[i][1], chunk_size, steps)
        if (
            batches
            and len(batches[-1]) < batch_size
            and chunk_size_for(docs[batches[-1][0]][1], chunk_size, steps) == c
        ):
            batches[-1].append(i)
        else:
            batches.append([i])
    random.Random(seed).shuffle(batches)
    return batches


STEP_COST_TOKENS = {"eager": 20_000, "compact": 36_000, "graphs": 6_600}
"""A chunk step's fixed cost (its launches, the optimizer, the host's work) in padded tokens of compute, per way of
running the steps (steps.rows_for). eager: fitted to eager TTT on H100s; graphs and compact: fitted on an H200
(documents of FineWeb's lengths, 64 a batch), where a graphed step takes about 9.0 ms plus 1.37 s per million
padded tokens and a compiled step without graphs about 50 ms. Refit from a run's ttt_rank_seconds against
ttt_rank_cost."""

SPLIT_STEP_COST_TOKENS = 6_600
"""The graphed step's fixed cost that ttt.max_batch_share's split and the chains of warm_start_a (deal_batches'
chain_costs) count with, frozen: refitting STEP_COST_TOKENS changes how batches are dealt onto ranks, never which
batches exist or which share a chain (and so never a score)."""

BASE_TOKEN_COST = 0.39
"""A padded token of the unadapted model's base passes (base_scores, a forward only) against one of a step (forward
and backward): 0.527 against 1.368 s per million on the H200 fit above."""


def batch_cost(
    docs: list[tuple[int, int]],
    batch: list[int],
    chunk: int,
    seq_len: int,
    mode: str,
    widths: str = "pow2",
    slots: int | None = None,
    score_base: bool = False,
    step_tokens: float | None = None,
    half_rows: bool = False,
) -> float:
    """A batch's TTT time in steps' fixed costs: per chunk step, 1 plus its padded tokens / STEP_COST_TOKENS[mode].
    A step's rows are padded to the width of its longest window (global_phases.row_width; at most seq_len tokens).
    ``mode`` says which rows a step runs (speedrun.ttt.steps.rows_for): eager every document of the batch,
    compact (compiled) the documents still going, at least 2, graphs that padded to a power of two within ``slots``
    (default: the batch). ``score_base`` adds the base passes' padded tokens (base_scores), at BASE_TOKEN_COST.
    ``step_tokens`` replaces the mode's STEP_COST_TOKENS; ``widths`` and ``half_rows`` are ttt.row_widths and
    ttt.graph_rows=half_octave."""
    if mode not in STEP_COST_TOKENS:
        raise ValueError(f"mode must be one of {', '.join(STEP_COST_TOKENS)}, got {mode!r}")
    slots = slots or len(batch)
    lengths = sorted((docs[i][1] for i in batch), reverse=True)
    padded = 0.0
    steps = -(-lengths[0] // chunk)
    for k in range(steps):
        going = [min((k + 1) * chunk, n) for n in lengths if k * chunk < n]
        rows = {"eager": len(lengths), "compact": max(len(going), min(2, slots))}.get(mode)
        rows = pad_rows(len(going), slots, half_rows) if rows is None else rows
        padded += rows * row_width(min(going[0], seq_len), seq_len, widths)
    if score_base:  # the windows' widths, each pass's rows as its steps' (every slot eager)
        at_start, later = base_windows([docs[i] for i in batch], chunk, seq_len)
        for windows in [at_start, *later.values()]:
            sizes = sorted((row_width(w[2], seq_len, widths) for w in windows), reverse=True)
            for w in set(sizes):
                n = sizes.count(w)
                full, rest = divmod(n, slots)
                per_pass = (
                    {"eager": slots, "compact": max(rest, 2)}.get(mode, pad_rows(rest, slots, half_rows)) if rest else 0
                )
                padded += BASE_TOKEN_COST * w * (full * slots + per_pass)
    return steps + padded / (step_tokens or STEP_COST_TOKENS[mode])


def split_heavy_batches(batches: list[list[int]], cost: Callable[[list[int]], float], share: float) -> list[list[int]]:
    """The batches, in order, each halved (its first documents, then the rest) while its cost is more than ``share``
    of all of them together and it holds more than one document. On a small validation set one batch of its longest
    documents can be a third of TTT's work, which no number of ranks can share. The split
    depends on the costs alone, not on the rank count, so 1 and 8 ranks score the same batches."""
    limit = share * sum(cost(b) for b in batches)
    out: list[list[int]] = []
    todo = list(batches)
    while todo:
        b = todo.pop(0)
        if len(b) > 1 and cost(b) > limit:
            todo[:0] = [b[: len(b) // 2], b[len(b) // 2 :]]
        else:
            out.append(b)
    return out


def deal_batches(
    costs: list[float], phase_ends: list[int], world: int, chains: int = 0, chain_costs: list[float] | None = None
) -> tuple[list[int], list[int]]:
    """(rank, chain) of each batch of the scoring order. Between two global phases (which every rank waits for) the
    batches are dealt to balance their cost (batch_cost: chunk steps, weighted by their padded tokens), longest
    first onto the least loaded, so one long document's batch does not leave the other ranks idle.

    chains > 0 (warm_start_a): each stretch's batches are first split into that many chains whatever the rank count
    (halves of balanced cost, then halves of those, ...), then whole chains go onto the ranks, so that each chain,
    along which A is carried, runs on one rank in its scoring order: the result does not depend on the rank count,
    and 2, 4 or 8 ranks of 8 chains each get a balanced subtree of the halving. chains = 0: no chain (every batch
    starts fresh), batches dealt onto the ranks directly. Chain numbers restart at each phase (A does).

    ``chain_costs`` (default: ``costs``) are the costs the chains are cut by. Which batches share a chain changes
    the scores, so TTT cuts them by one frozen cost model whatever the settings (mode, widths, base score): with
    each run's own costs, scoring the base or padding the rows otherwise would move val_bpb_ttt. ``costs`` still
    place the chains onto the ranks, which changes no score."""
    cut_by = costs if chain_costs is None else chain_costs
    rank, chain = [0] * len(costs), [0] * len(costs)
    starts = [0] + [b + 1 for b in sorted(phase_ends) if b + 1 < len(costs)]
    for lo, hi in zip(starts, starts[1:] + [len(costs)]):
        stretch = list(range(lo, hi))
        if not chains:
            for b, r in zip(stretch, _longest_first([costs[b] for b in stretch], [1] * world)):
                rank[b] = r
            continue
        into = _halve([cut_by[b] for b in stretch], chains)
        loads = [sum(costs[b] for b, c in zip(stretch, into) if c == k) for k in range(chains)]
        # whole chains onto ranks: the halving's subtrees (contiguous chains) or longest first, whichever is flatter
        blocks = [k * world // chains for k in range(chains)]
        greedy = _longest_first(loads, [1] * world)
        onto = min(
            (blocks, greedy), key=lambda m: max(sum(x for x, r in zip(loads, m) if r == j) for j in range(world))
        )
        for b, c in zip(stretch, into):
            chain[b], rank[b] = c, onto[c]
    return rank, chain


def _halve(costs: list[float], parts: int) -> list[int]:
    """Each item's part (0..parts-1): two groups of balanced cost, sized for parts // 2 and the rest, each halved
    again. Deterministic."""
    if parts == 1:
        return [0] * len(costs)
    left = parts // 2
    side = _longest_first(costs, [left, parts - left])
    out = [0] * len(costs)
    for s, offset in ((0, 0), (1, left)):
        members = [i for i, x in enumerate(side) if x == s]
        for i, p in zip(members, _halve([costs[i] for i in members], left if s == 0 else parts - left)):
            out[i] = offset + p
    return out


def _longest_first(costs: list[float], capacity: list[int]) -> list[int]:
    """Each item's bin: items by decreasing cost (ties: earlier first), each onto the bin least loaded for its
    capacity (ties: the lowest). Deterministic."""
    loads, where = [0.0] * len(capacity), [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        j = min(range(len(capacity)), key=lambda j: (loads[j] / capacity[j], j))
        where[i], loads[j] = j, loads[j] + costs[i]
    return where
