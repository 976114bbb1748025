"""val_bpb_ttt_base: the unadapted model's score of every chunk TTT scores, from the same window, in a few passes per
batch instead of one forward per chunk.

The unadapted model never changes during TTT (no adapter, no global phase touches it), so the score of a document's
chunk does not depend on when it is computed. A chunk is scored from the last ``seq_len`` tokens of its document up
to the chunk's end (speedrun.finishing.ttt). For every chunk whose window starts at the document's start, that
window is a prefix of the document's first ``seq_len`` tokens, and attention is causal: a position's score does not
depend on the tokens after it. So one window over the document's start scores all those chunks at once (the same
numbers up to the kernels' rounding on another shape). Only a chunk of a longer document whose window starts past
the document's start needs a window of its own. On the embedded corpus cut at 1,000 characters every document fits,
and the base score costs one forward per document instead of one per chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from speedrun.finishing.ttt_global import row_width

Window = tuple[int, int, int, list[tuple[int, int, int]]]
"""(document, first input position in the stream, length, [(chunk k, first column, end column) scored from it])."""


def base_windows(docs: list[tuple[int, int]], chunk: int, seq_len: int) -> list[Window]:
    """The windows that score every chunk of ``docs`` (start, n_targets) as TTT's windows do: one over each
    document's start for the chunks whose window starts there, one per chunk whose window starts later."""
    windows: list[Window] = []
    for d, (start, n) in enumerate(docs):
        at_start: list[tuple[int, int, int]] = []
        for k in range(math.ceil(n / chunk)):
            hi = min((k + 1) * chunk, n)
            lo = max(0, hi - seq_len)
            if lo == 0:
                at_start.append((k, k * chunk, hi))
            else:
                windows.append((d, start + lo, seq_len, [(k, k * chunk - lo, hi - lo)]))
        if at_start:
            windows.append((d, start, at_start[-1][2], at_start))
    return windows


def base_chunk_nats(
    scorer: Callable,
    nats_of: Callable,
    tokens: torch.Tensor,
    docs: list[tuple[int, int]],
    chunk: int,
    seq_len: int,
    max_tokens: int,
) -> torch.Tensor:
    """(len(docs), most chunks) float64 on tokens' device: the summed nats of each document's chunk k as ``scorer``
    scores it from TTT's window (0 where a document has no chunk k). ``nats_of(scorer, x, y)`` runs a forward under
    the caller's autocast. Windows go longest first, in passes of one width (a power of two, as TTT's steps), of at
    most ``max_tokens`` padded tokens and at least 2 rows (a compiled scorer specializes a dimension of size 1)."""
    device = tokens.device
    most = max(math.ceil(n / chunk) for _, n in docs)
    dump = len(docs) * most  # the slot for columns no chunk scores: context, padding
    table = torch.zeros(dump + 1, dtype=torch.float64, device=device)
    last = tokens.numel() - 1
    order = sorted(base_windows(docs, chunk, seq_len), key=lambda w: -w[2])
    i = 0
    while i < len(order):
        width = row_width(order[i][2], seq_len)
        group = [w for w in order[i : i + max(1, max_tokens // width)] if row_width(w[2], seq_len) == width]
        i += len(group)
        rows = max(2, len(group))
        slot = torch.full((rows, width), dump, dtype=torch.int64)
        begin, length = [0] * rows, [0] * rows
        for r, (d, b, n, chunks) in enumerate(group):
            begin[r], length[r] = b, n
            for k, c0, c1 in chunks:
                slot[r, c0:c1] = d * most + k
        cols = torch.arange(width, device=device)
        begin_t, length_t = torch.tensor([begin, length]).to(device)
        idx = begin_t[:, None] + cols[None, :]
        valid = cols[None, :] < length_t[:, None]
        x = torch.where(valid, tokens[idx.clamp(max=last - 1)], 0)
        y = torch.where(valid, tokens[(idx + 1).clamp(max=last)], 0)
        with torch.no_grad():
            nats = nats_of(scorer, x, y).double()
        table.index_add_(0, slot.to(device).flatten(), nats.flatten())
    return table[:dump].view(len(docs), most)


__all__ = ["base_chunk_nats", "base_windows"]
