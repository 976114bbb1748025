"""A batch's steps in score-first TTT: which rows each step runs, the windows of each row, and how a step is run
(directly, or replayed from CUDA graphs), with the host-to-device copies that keep the host from waiting."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from speedrun.data.bpb import ByteLUTs
from speedrun.ttt.base_scores import BaseScores
from speedrun.ttt.global_phases import row_width
from speedrun.ttt.graphs import GradSink, GraphedChunkSteps, StepKey, StepOut, chunk_step, pad_rows
from speedrun.ttt.scorers import autocast_nats


def to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """A small host tensor on the device without a host sync: copied from pageable memory, the host would wait for
    every kernel queued before it; from pinned memory the copy queues behind them, and the host goes on launching
    (eager TTT is launch-bound: the GPU sat idle 40% of a profiled run)."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def pinned(t: torch.Tensor, device: str) -> torch.Tensor:
    """A host tensor in pinned memory (on a CUDA run), so that copying it to the device does not wait for the
    kernels queued before it (to_device)."""
    return t.pin_memory() if torch.device(device).type == "cuda" else t


def rows_for(going: int, n_docs: int, mode: str, slots: int, half_rows: bool = False) -> int:
    """Rows a step runs: eager, one per document of the batch (eager flex compiles per shape); compiled, the
    documents still going, at least 2 (dynamic shapes: a size-1 dimension would be specialized into graphs of its
    own); graphed, that padded to a power of two, or with ``half_rows`` a half octave (graphs.pad_rows: a few
    shapes to capture)."""
    if mode == "graphs":
        return pad_rows(going, slots, half_rows)
    return max(going, min(2, slots)) if mode == "compact" else n_docs


def batch_steps(
    docs: list[tuple[int, int]],
    chunk: int,
    seq_len: int,
    mode: str,
    slots: int,
    widths: str = "pow2",
    half_rows: bool = False,
) -> Iterator[tuple[int, list[list[int]], int, bool]]:
    """A batch's steps, its documents sorted longest first (so the documents still going are the first rows):
    (k, the (4, rows) row table of chunk_step, width, training) for every chunk index k."""
    n_chunks = [math.ceil(n / chunk) for _, n in docs]
    for k in range(max(n_chunks)):
        going = sum(k < nc for nc in n_chunks)  # the first `going` rows: n_chunks is non-increasing
        rows = rows_for(going, len(docs), mode, slots, half_rows)
        # per row: inputs [lo, hi) of its document (relative to the document start), scored from offset `first`;
        # rows past the documents still going (or past the batch, when padded) are all padding
        table = [[0] * rows for _ in range(4)]
        for i, ((start, n), nc) in enumerate(zip(docs[:rows], n_chunks)):
            if k < nc:
                hi = min((k + 1) * chunk, n)
                lo = max(0, hi - seq_len)
                table[0][i], table[1][i], table[2][i] = start + lo, hi - lo, k * chunk - lo
                table[3][i] = 1 if k < nc - 1 else 0  # no update after a document's last chunk
        yield k, table, row_width(max(table[1]), seq_len, widths), any(table[3])


def longest_first(docs: list[tuple[int, int]], chunk: int) -> list[int]:
    return sorted(range(len(docs)), key=lambda i: -math.ceil(docs[i][1] / chunk))  # stable: ties keep order


@dataclass
class Stepper:
    """How adapt_batch runs a step (graphs.chunk_step): directly, or replayed from CUDA graphs."""

    forward: Callable
    base: Callable | None
    """The unadapted scorer of val_bpb_ttt_base (None: not asked for), run outside the steps (base_scores)."""
    tokens: torch.Tensor
    luts: ByteLUTs
    device: str
    autocast_dtype: torch.dtype | None
    mode: str
    """eager (every row), compact (compiled: the rows still going) or graphs (ttt.cuda_graphs)."""
    slots: int
    widths: str = "pow2"
    """ttt.row_widths: the widths the steps and the base passes are padded to."""
    half_rows: bool = False
    """ttt.graph_rows=half_octave: graphed steps' and base passes' rows padded to half octaves too."""
    pick_width: int | None = None
    """The columns of a window whose loss a step computes (chunk_step): the run's largest chunk size."""
    bind: Callable[[int | None], list[torch.Tensor]] | None = None
    """Binds the adapters' slots of a step's rows (LoRAModel.bind_rows)."""
    graphs: GraphedChunkSteps | None = None

    def nats_of(self, fn: Callable, x: torch.Tensor, y: torch.Tensor, pick: torch.Tensor | None = None) -> torch.Tensor:
        return autocast_nats(fn, x, y, self.device, self.autocast_dtype, pick)

    def run(self, rows: torch.Tensor, key: StepKey, store_grads: GradSink | None = None) -> StepOut:
        _, width, training = key
        return chunk_step(
            self.forward,
            self.tokens,
            self.luts,
            rows,
            width,
            training,
            self.nats_of,
            store_grads,
            self.pick_width,
            self.bind,
        )

    def base_scores(self, docs: list[tuple[int, int]], chunk: int, seq_len: int) -> BaseScores | None:
        """The unadapted model's nats of each document's chunks (base_scores), or None without a base scorer."""
        if self.base is None:
            return None
        return BaseScores(
            self.base,
            self.nats_of,
            self.tokens,
            docs,
            chunk,
            seq_len,
            self.slots,
            lambda n: (
                rows_for(n, self.slots, self.mode, self.slots, self.half_rows) if self.mode != "eager" else self.slots
            ),
            pinned=torch.device(self.device).type == "cuda",
            widths=self.widths,
        )

    def step(self, table: list[list[int]], key: StepKey) -> StepOut:
        rows = torch.tensor(table, dtype=torch.int64)
        if self.graphs is not None:
            return self.graphs.step(pinned(rows, self.device), key)
        return self.run(to_device(rows, self.device), key)

    def capture(self, batches: list[list[tuple[int, int]]], chunk_sizes: list[int], seq_len: int) -> None:
        """Capture, before the clock starts, every step shape that these batches (this rank's) will run."""
        assert self.graphs is not None
        keys = set()
        for docs, chunk in zip(batches, chunk_sizes):
            ordered = [docs[i] for i in longest_first(docs, chunk)]
            for _, table, width, training in batch_steps(
                ordered, chunk, seq_len, self.mode, self.slots, self.widths, self.half_rows
            ):
                keys.add((len(table[0]), width, training))
        self.graphs.prepare(
            keys, lambda key: torch.tensor([[0] * key[0], [key[1]] * key[0], [0] * key[0], [1] * key[0]])
        )
