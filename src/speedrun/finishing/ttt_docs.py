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

import torch


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


STEP_COST_TOKENS = 20_000
"""A chunk step's fixed cost (its launches, the optimizer, the host's work) counted in padded tokens of compute.
Fitted to one measurement: the eleventh session's eager TTT on 4 H100s against one (687 documents, 16 a batch)
scaled 2.70x; this cost model predicts 2.66x for that dealing, where counting steps alone predicted 3.62x and
padded tokens alone 1.60x. A model to refine with more measurements."""


def batch_cost(
    docs: list[tuple[int, int]], batch: list[int], chunk: int, seq_len: int, compact: bool, half_octaves: bool = False
) -> float:
    """A batch's TTT time in steps' fixed costs: per chunk step, 1 plus its padded tokens / STEP_COST_TOKENS. A
    step's rows are padded to the width of its longest window (ttt_global.row_width; at most seq_len tokens); ``compact``
    (compiled TTT) runs only the documents still going, at least 2, eager TTT every document of the batch
    (speedrun.finishing.ttt._adapt_batch)."""
    from speedrun.finishing.ttt_global import row_width  # ttt_global is heavier (torch.nn); imported where needed

    lengths = sorted((docs[i][1] for i in batch), reverse=True)
    total = 0.0
    for k in range(-(-lengths[0] // chunk)):
        going = [min((k + 1) * chunk, n) for n in lengths if k * chunk < n]
        rows = max(len(going), min(2, len(lengths))) if compact else len(lengths)
        total += 1.0 + rows * row_width(min(going[0], seq_len), seq_len, half_octaves) / STEP_COST_TOKENS
    return total


def deal_batches(costs: list[float], phase_ends: list[int], world: int, chains: int = 0) -> tuple[list[int], list[int]]:
    """(rank, chain) of each batch of the scoring order. Between two global phases (which every rank waits for) the
    batches are dealt to balance their cost (batch_cost: chunk steps, weighted by their padded tokens), longest
    first onto the least loaded, so one long document's batch does not leave the other ranks idle.

    chains > 0 (warm_start_a): each stretch's batches are first split into that many chains whatever the rank count
    (halves of balanced cost, then halves of those, ...), then whole chains go onto the ranks, so that each chain,
    along which A is carried, runs on one rank in its scoring order: the result does not depend on the rank count,
    and 2, 4 or 8 ranks of 8 chains each get a balanced subtree of the halving. chains = 0: no chain (every batch
    starts fresh), batches dealt onto the ranks directly. Chain numbers restart at each phase (A does)."""
    rank, chain = [0] * len(costs), [0] * len(costs)
    starts = [0] + [b + 1 for b in sorted(phase_ends) if b + 1 < len(costs)]
    for lo, hi in zip(starts, starts[1:] + [len(costs)]):
        stretch = list(range(lo, hi))
        if not chains:
            for b, r in zip(stretch, _longest_first([costs[b] for b in stretch], [1] * world)):
                rank[b] = r
            continue
        into = _halve([costs[b] for b in stretch], chains)
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
