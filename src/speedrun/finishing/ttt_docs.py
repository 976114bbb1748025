"""Which documents TTT adapts, in which batches and in which order: BOS-delimited documents of the validation stream,
each with its chunk size, batched by length, the batches shuffled with the run's seed.

Chunk size: ``ttt.chunk_size``, or for short documents the schedule ``ttt.short_chunks`` = "LEN:CHUNK,...": a
document with at most LEN scored tokens uses CHUNK, the first LEN (ascending) that fits; longer documents use
chunk_size. This is parameter-golf's TTT_SHORT_SCORE_FIRST_STEPS (PR #2014: "256:8,2000:24" with a default chunk of
48): a chunk *size* per document-length bucket, not a number of chunks; there the bucket is chosen by the longest
document of a batch, here per document (batches never mix chunk sizes).

The seeded random order of the batches makes a run cut short by ttt.max_seconds score an unbiased sample of
documents rather than the shortest or longest; it is also the scoring order the global phases count documents in.
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
