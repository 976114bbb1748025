"""One step of score-first TTT as device work only, and that step replayed from CUDA graphs (ttt.cuda_graphs).

A step (``chunk_step``) takes, per row of the batch, where its window starts in the token stream, how long it is,
from which column its chunk is scored, and whether the adapters learn from it; it gathers the window's inputs and
targets, scores the chunk, and backpropagates the chunk's mean loss per document into the adapters (the unadapted
model's score, val_bpb_ttt_base, comes from speedrun.core.ttt_scorers, outside the steps). It reads nothing back
to the host, so it can be captured in a CUDA graph. The gradients it takes are those of the adapters' slots at its
rows only; replayed, it hands them to the rows' slots optimizer inside the graph (its learning rate a constant of
the capture), or, for an optimizer over every slot, writes them into ``.grad`` for that optimizer to step after.

Why graphs: compiled TTT at the records' settings is launch-bound. A step of 17 block calls forward and backward,
each a compiled region with its guards and autograd bookkeeping, costs the host more than its kernels cost the GPU.
A replay launches them all at once.

How (torch.cuda.graphs, as speedrun.core.compile does for training): one graph per step shape, the key
(rows, width, training); rows are padded up to a power of two (at least 2, at most the adapter slots) and
widths are already few (ttt_docs.row_width, ttt.row_widths), so a run has a few dozen shapes, all captured before
TTT's clock starts (``GraphedChunkSteps.prepare``) from the batches this rank will run. Each shape runs once
eagerly on a side stream (cuBLAS and cuDNN initialise there, as capture requires), then is captured. Every graph
draws from one shared memory pool: a replay's outputs are read (added to the sums, handed to the optimizer)
before the next replay, so a graph may reuse what another one freed. Gradients written to ``.grad`` go to tensors
that exist before capture. Tensors a graph reads must keep their storage: the adapters and the optimizer's state
are reset in place, and the frozen weights keep theirs across global phases (LoRAModel.bare).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch

from speedrun.core.data import ByteLUTs, token_bytes

StepKey = tuple[int, int, bool]
"""(rows, width, training): one graph each."""


@dataclass
class StepOut:
    """What a step leaves on the device (static tensors when replayed: read them before the next replay)."""

    row_nats: torch.Tensor
    """(rows,) float64: each row's summed nats over its scored chunk."""
    counts: torch.Tensor
    """(rows,) int64: tokens scored per row."""
    n_bytes: torch.Tensor
    """() int64: bytes of the scored tokens."""
    updated: tuple[int, ...] | None = None
    """The adapters the optimizer stepped inside the step (InGraphUpdate.apply), by index; None when the step left
    the gradients in .grad for the optimizer to step after."""
    token_nats: torch.Tensor | None = None
    """(rows, G) float64: the nats of each column whose loss came back, 0 where not scored (``token_scores``)."""
    columns: torch.Tensor | None = None
    """(rows or 1, G) int64: the window column of each of token_nats' columns."""
    scored: torch.Tensor | None = None
    """(rows, G) bool: the columns of token_nats that were scored (the chunk)."""


TokenScoresHook = Callable[[torch.Tensor, torch.Tensor], None]
"""Takes (the stream positions of a step's scored targets, their float64 nats): ttt_evaluate's on_token_scores."""


def token_scores(rows: torch.Tensor, out: StepOut) -> tuple[torch.Tensor, torch.Tensor]:
    """(stream positions of the targets a step scored, their nats): the very numbers its sums add, token by token.
    ``rows`` is the step's (4, R) row table; nothing here runs unless asked for (ttt_evaluate's on_token_scores)."""
    assert out.token_nats is not None and out.columns is not None and out.scored is not None
    begin = rows[0].to(out.token_nats.device)
    targets = begin[:, None] + out.columns + 1  # column c of a window starting at b predicts position b + c + 1
    return targets.expand_as(out.scored)[out.scored], out.token_nats[out.scored]


GradSink = Callable[[int, Sequence["torch.Tensor | None"]], "tuple[int, ...] | None"]
"""Takes a step's row count and the gradients of the adapters' views at those rows (None: no gradient reached it);
returns the adapters it stepped (StepOut.updated), or None when it only stored the gradients."""


class InGraphUpdate(Protocol):
    """An optimizer whose step a CUDA graph of the chunk step can hold (speedrun.core.ttt_lora.RowSlotsAdam)."""

    def apply(self, rows: int, grads: Sequence[torch.Tensor | None]) -> tuple[int, ...]: ...

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor apply() changes."""


def chunk_step(
    forward: Callable,
    tokens: torch.Tensor,
    luts: ByteLUTs,
    rows: torch.Tensor,
    width: int,
    training: bool,
    nats_of: Callable,
    store_grads: GradSink | None = None,
    pick_width: int | None = None,
    bind: Callable[[int | None], list[torch.Tensor]] | None = None,
) -> StepOut:
    """One TTT step: score each row's chunk, then (``training``) backpropagate its mean loss per document.

    ``rows`` is (4, R) int64: per row the window's first input position in ``tokens``, its length, the first column
    scored, and 1 if the adapters learn from this chunk (0 after a document's last chunk, or for padding rows).
    ``nats_of(fn, x, y, pick)`` runs a forward under the caller's autocast, its loss taken at ``pick``'s columns
    only: the ``pick_width`` columns from each row's first scored one (the run's largest chunk; None: the window's
    width), so the head pays for the chunk, not for the window of context before it. ``bind(rows)``
    (LoRAModel.bind_rows) binds the adapters' slots of the step's rows as the views the forward uses and returns
    them; ``bind(None)`` unbinds after. The backward: with ``store_grads``, the gradients of those views alone
    (rows-sized) go to it, which steps the optimizer with them or writes them into ``.grad`` (GraphedChunkSteps);
    without, ``backward()`` accumulates into the parameters' ``.grad`` (zeroing them is the caller's)."""
    begin, length, first, learn = rows[0], rows[1], rows[2], rows[3]
    last = tokens.numel() - 1
    cols = torch.arange(width, device=tokens.device)
    idx = begin[:, None] + cols[None, :]
    valid = cols[None, :] < length[:, None]
    x = torch.where(valid, tokens[idx.clamp(max=last - 1)], 0)
    y = torch.where(valid, tokens[(idx + 1).clamp(max=last)], 0)
    pick = None  # every column
    at = cols[None, :]  # the columns whose nats come back
    if pick_width is not None:  # a row's chunk, then what follows it up to pick_width columns
        at = first[:, None] + cols[None, : min(width, pick_width)]
        pick = at.clamp(max=width - 1)
        x_at, y_at = x.gather(1, pick), y.gather(1, pick)
    else:
        x_at, y_at = x, y
    scored = (at >= first[:, None]) & (at < length[:, None])  # the chunk: from `first` to the window's end
    updated = None
    try:
        with torch.set_grad_enabled(training):
            views = bind(rows.size(1)) if bind is not None else []
            nats = nats_of(forward, x, y, pick)
        with torch.no_grad():  # the score: before this chunk's update
            chunk_nats = torch.where(scored, nats.detach().double(), 0.0)
            row_nats = chunk_nats.sum(dim=1)
            # a byte sidecar (CaseOps data) counts by stream position: the target of input column c is begin + c + 1
            positions = (begin[:, None] + at + 1).clamp(max=last) if luts.sidecar is not None else None
            n_bytes = torch.where(scored, token_bytes(x_at, y_at, luts, positions), 0).sum()
            counts = scored.sum(dim=1)
        if training:  # one step on the chunk just scored: it can only change later chunks' scores
            per_doc = (nats * scored).sum(dim=1) / counts.clamp_min(1)
            loss = (per_doc * learn.to(per_doc.dtype)).sum()
            if store_grads is not None:
                updated = store_grads(rows.size(1), torch.autograd.grad(loss, views, allow_unused=True))
            else:
                loss.backward()
    finally:
        if bind is not None:
            bind(None)
    return StepOut(row_nats, counts, n_bytes, updated, chunk_nats, at, scored)


def store_rows_grads(bufs: list[torch.Tensor], rows: int, grads: Sequence[torch.Tensor | None]) -> None:
    """Write a step's gradients at the slots [0, rows) into the .grad tensors ``bufs`` (a graph's: in place, where
    they were at capture); no gradient is a zero, and so is every slot past the rows (an optimizer over every slot
    reads them: the documents already done)."""
    live = [(buf[:rows], g) for buf, g in zip(bufs, grads, strict=True) if g is not None]
    if live:
        torch._foreach_copy_([b for b, _ in live], [g for _, g in live])
    zeros = [buf[:rows] for buf, g in zip(bufs, grads) if g is None]
    zeros += [buf[rows:] for buf in bufs if buf.size(0) > rows]
    if zeros:
        torch._foreach_zero_(zeros)


class GraphedChunkSteps:
    """chunk_step replayed from one CUDA graph per StepKey (see the module doc). ``step(rows, key)`` takes the
    (4, R) int64 row table on the host and returns the step's static outputs."""

    def __init__(
        self,
        run: Callable[[torch.Tensor, StepKey, GradSink | None], StepOut],
        params: list[torch.nn.Parameter],
        device: str,
        update: InGraphUpdate | None = None,
    ):
        self.run, self.params, self.device, self.update = run, params, device, update
        self.graphs: dict[StepKey, tuple[Any, torch.Tensor, StepOut]] = {}
        self.grads: list[torch.Tensor] = []
        """The adapters' .grad tensors the graphs write (held, so their memory stays theirs)."""
        self.late = 0
        """Shapes captured after prepare(), while TTT's clock ran (0 is the aim; each costs one capture)."""
        self.pool: Any = None

    def _store_grads(self, rows: int, grads: Sequence[torch.Tensor | None]) -> None:
        """A step's gradients into the adapters' .grad (store_rows_grads), tensors made once: a graph writes them in
        place, so they must outlive it."""
        if not self.grads:
            for p in self.params:
                p.grad = torch.zeros_like(p)
            self.grads = [cast(torch.Tensor, p.grad) for p in self.params]
        store_rows_grads(self.grads, rows, grads)

    def _sink(self, training: bool) -> GradSink | None:
        """A training step's gradients: stepped by the in-graph update, or stored for the optimizer after."""
        if not training:
            return None
        return self.update.apply if self.update is not None else self._store_grads

    def prepare(self, keys: Iterable[StepKey], dummy_rows: Callable[[StepKey], torch.Tensor]) -> None:
        """Capture every key before the clock starts. ``dummy_rows(key)`` gives a row table of that shape to run
        it with; nothing it computes is kept (the sums are not touched, the gradients are zeroed after, and what an
        in-graph update changed is put back).
        Largest first: a smaller graph then carves its memory out of blocks a larger one freed in the shared pool,
        where smallest first makes each larger shape add blocks of its own (a hundred shapes can then fill an 80 GB
        card)."""
        todo = [k for k in sorted(set(keys), key=lambda k: (-k[0] * k[1], not k[2], k)) if k not in self.graphs]
        kept = self._keep()
        for n, key in enumerate(todo):
            try:
                self._capture(key, dummy_rows(key), undo_warm_up=False)
            except torch.cuda.OutOfMemoryError as e:  # before TTT's clock: say what to change, not just where
                raise torch.cuda.OutOfMemoryError(
                    f"capturing TTT's CUDA graphs ran out of GPU memory at shape {n + 1} of {len(todo)} (rows "
                    f"{key[0]}, width {key[1]}, {len(self.graphs)} captured). Fewer or smaller shapes need less: "
                    "ttt.row_widths=pow2 and ttt.graph_rows=pow2 (fewest shapes), a smaller ttt.batch_size, or "
                    f"ttt.cuda_graphs=false (slower steps). The allocator said: {str(e).splitlines()[0]}"
                ) from e
        self._put_back(kept)
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    def _keep(self) -> list[torch.Tensor] | None:
        """A host copy of what the in-graph update changes (none without one): a capture runs its step twice."""
        if self.update is None:
            return None
        return [t.detach().to("cpu", copy=True) for t in self.update.state_tensors()]

    def _put_back(self, kept: list[torch.Tensor] | None) -> None:
        if self.update is not None and kept is not None:
            with torch.no_grad():
                for t, k in zip(self.update.state_tensors(), kept, strict=True):
                    t.copy_(k)

    def step(self, rows: torch.Tensor, key: StepKey) -> StepOut:
        entry = self.graphs.get(key)
        if entry is None:
            self.late += 1
            entry = self._capture(key, rows)
            return entry[2]  # _capture replayed the new graph once: that replay was this very step
        graph, static_rows, out = entry
        static_rows.copy_(rows, non_blocking=True)
        graph.replay()
        return out

    def _capture(
        self, key: StepKey, rows: torch.Tensor, undo_warm_up: bool = True
    ) -> tuple[Any, torch.Tensor, StepOut]:
        """Run the step once eagerly, capture it, and replay the capture once. With an in-graph update the eager run
        updates too: ``undo_warm_up`` puts back what it changed, so that the replay is the step's one update (prepare
        puts everything back once, after all its captures)."""
        sink = self._sink(key[2])
        static_rows = rows.to(self.device).clone()
        kept = self._keep() if undo_warm_up and key[2] else None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # lazy initialisations off the default stream, as capture requires
            self.run(static_rows, key, sink)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self._put_back(kept)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.run(static_rows, key, sink)
        graph.replay()  # capture records without running: this is the step's own run
        self.graphs[key] = (graph, static_rows, out)
        return self.graphs[key]
