"""val_bpb_ttt_base: the unadapted model's score of every chunk TTT scores, from the same window, in a few passes per
batch instead of one forward per chunk.

The unadapted model never changes during TTT (no adapter, no global phase touches it), so the score of a document's
chunk does not depend on when it is computed. A chunk is scored from the last ``seq_len`` tokens of its document up
to the chunk's end (speedrun.ttt.score_first). For every chunk whose window starts at the document's start, that
window is a prefix of the document's first ``seq_len`` tokens, and attention is causal: a position's score does not
depend on the tokens after it. So one window over the document's start scores all those chunks at once (the same
numbers up to the kernels' rounding on another shape). Only a chunk of a longer document whose window starts past
the document's start needs a window of its own, scored when its chunk is: several times fewer padded tokens than a
forward per chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from speedrun.ttt.global_phases import row_width

Window = tuple[int, int, int, list[tuple[int, int, int]]]
"""(document, first input position in the stream, length, [(chunk k, first column, end column) scored from it])."""


def base_windows(docs: list[tuple[int, int]], chunk: int, seq_len: int) -> tuple[list[Window], dict[int, list[Window]]]:
    """The windows that score every chunk of ``docs`` (start, n_targets) as TTT's windows do: (one window over each
    document's start, for the chunks whose window starts there; per chunk index k, the windows of the chunks k whose
    window starts later, one each)."""
    at_start: list[Window] = []
    later: dict[int, list[Window]] = {}
    for d, (start, n) in enumerate(docs):
        first: list[tuple[int, int, int]] = []
        for k in range(math.ceil(n / chunk)):
            hi = min((k + 1) * chunk, n)
            lo = max(0, hi - seq_len)
            if lo == 0:
                first.append((k, k * chunk, hi))
            else:
                later.setdefault(k, []).append((d, start + lo, seq_len, [(k, k * chunk - lo, hi - lo)]))
        if first:
            at_start.append((d, start, first[-1][2], first))
    return at_start, later


class BaseScores:
    """The unadapted model's summed nats of each document's chunk k (``table``, (documents, most chunks) float64 on
    tokens' device, 0 where a document has no chunk k), for one batch. The windows over the documents' starts are
    scored when it is made, which costs about one forward of the batch; a later chunk's own window when the step
    that scores that chunk asks for it (``chunk(k)``), so a TTT cut short by its time budget pays only for what it
    scored. ``nats_of(scorer, x, y, pick)`` runs a forward under the caller's autocast, its nats at ``pick``'s
    columns (None: every column); ``rows_for(n)`` is how many rows a
    pass of n windows runs, the same policy as TTT's steps (all the slots eager, since eager flex and cuDNN plan
    per shape; at least 2 compiled, a power of two graphed), at most ``slots`` windows a pass. ``pinned`` copies the
    passes' row tables from pinned memory, so the host does not wait for the kernels queued before them."""

    def __init__(
        self,
        scorer: Callable,
        nats_of: Callable,
        tokens: torch.Tensor,
        docs: list[tuple[int, int]],
        chunk: int,
        seq_len: int,
        slots: int,
        rows_for: Callable[[int], int],
        pinned: bool = False,
        widths: str = "pow2",
    ):
        self.scorer, self.nats_of, self.tokens = scorer, nats_of, tokens
        self.chunk_size, self.seq_len, self.slots, self.rows_for = chunk, seq_len, slots, rows_for
        self.pinned, self.widths = pinned, widths
        self.most = max(math.ceil(n / chunk) for _, n in docs)
        self.n_docs = len(docs)
        self.flat = torch.zeros(self.n_docs * self.most + 1, dtype=torch.float64, device=tokens.device)
        at_start, self.later = base_windows(docs, chunk, seq_len)
        self._score(at_start)

    @property
    def table(self) -> torch.Tensor:
        return self.flat[:-1].view(self.n_docs, self.most)

    def chunk(self, k: int) -> torch.Tensor:
        """Column k of the table, the later windows of chunk k scored first."""
        self._score(self.later.pop(k, []), one_chunk=True)
        return self.table[:, k]

    def _score(self, windows: list[Window], one_chunk: bool = False) -> None:
        """Add each window's chunks' nats into the table: windows longest first, in passes of one width (TTT's steps'
        widths). A window's columns c0 <= c < c1 belong to its chunks k0, k0 + 1, ... (chunk wide each);
        the others (context, padding) go to the table's last, dropped slot. ``one_chunk``: each window scores one
        chunk (a later window), so the head runs at that chunk's columns only (``nats_of``'s pick), not at the
        context before it."""
        device, dump, last = self.tokens.device, self.n_docs * self.most, self.tokens.numel() - 1
        order = sorted(windows, key=lambda w: -w[2])
        i = 0
        while i < len(order):
            width = row_width(order[i][2], self.seq_len, self.widths)
            group = [w for w in order[i : i + self.slots] if row_width(w[2], self.seq_len, self.widths) == width]
            i += len(group)
            rows = max(len(group), self.rows_for(len(group)))
            # per row: first input position, length, the table slot of its first chunk, its scored columns [c0, c1)
            spec = [[0] * rows, [0] * rows, [dump] * rows, [0] * rows, [0] * rows]
            for r, (d, b, n, chunks) in enumerate(group):
                spec[0][r], spec[1][r], spec[2][r] = b, n, d * self.most + chunks[0][0]
                spec[3][r], spec[4][r] = chunks[0][1], chunks[-1][2]
            host = torch.tensor(spec, dtype=torch.int64)
            begin, length, first_slot, c0, c1 = (host.pin_memory() if self.pinned else host).to(
                device, non_blocking=True
            )
            cols = torch.arange(width, device=device)
            idx = begin[:, None] + cols[None, :]
            valid = cols[None, :] < length[:, None]
            x = torch.where(valid, self.tokens[idx.clamp(max=last - 1)], 0)
            y = torch.where(valid, self.tokens[(idx + 1).clamp(max=last)], 0)
            pick = None
            at = cols[None, :].expand(rows, -1)  # the columns whose nats come back
            if one_chunk:
                at = c0[:, None] + cols[None, : min(width, self.chunk_size)]
                pick = at.clamp(max=width - 1)
            inside = (at >= c0[:, None]) & (at < c1[:, None])
            slot = torch.where(inside, first_slot[:, None] + (at - c0[:, None]) // self.chunk_size, dump)
            with torch.no_grad():
                nats = self.nats_of(self.scorer, x, y, pick).double()
            self.flat.index_add_(0, slot.flatten(), nats.flatten())


__all__ = ["BaseScores", "base_windows"]
