"""The forwards that score TTT's windows: the model's per-token nats, its head run at a chunk's columns only,
eager or through torch.compile (warmed up on random tokens before TTT's clock starts).

val_bpb_ttt_base: the unadapted model's score of every chunk TTT scores, from the same window, in a few passes per
batch instead of one forward per chunk.

The unadapted model never changes during TTT (no adapter, no global phase touches it), so the score of a document's
chunk does not depend on when it is computed. A chunk is scored from the last ``seq_len`` tokens of its document up
to the chunk's end (speedrun.core.ttt_score). For every chunk whose window starts at the document's start, that
window is a prefix of the document's first ``seq_len`` tokens, and attention is causal: a position's score does not
depend on the tokens after it. So one window over the document's start scores all those chunks at once (the same
numbers up to the kernels' rounding on another shape). Only a chunk of a longer document whose window starts past
the document's start needs a window of its own, scored when its chunk is: several times fewer padded tokens than a
forward per chunk.

What score-first TTT reports: TTTResult and its scored chunks; the sums, counts and times a rank adds up as it
scores, and how the ranks' are put together (float64 sums all-reduced, the slowest rank's times).
"""

from __future__ import annotations

import functools
import math
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn
from torch.fx.experimental import _config as fx_config

from speedrun.core.ttt_docs import Window, base_windows, row_width
from speedrun.core.ttt_global import FinetuneStats
from speedrun.core.ttt_lora import LoRAModel, TTTSettings

if TYPE_CHECKING:  # annotations only: TTT is handed a World, it never makes one
    from speedrun.core.dist import World


class PickedHead:
    """A model's head run at some columns of each row only: the final hidden states and the targets at ``pick``
    ((rows, G) column indices) are gathered first, so a step whose window is 2,048 tokens wide but scores a chunk
    of 48 pays the final norm, the logits, the softcap and the loss (forward and backward) for 48 columns, not
    2,048. Every other column's loss is never read, and its gradient is zero anyway."""

    def __init__(self, head: Callable, pick: torch.Tensor):
        self.head, self.pick = head, pick

    def __call__(self, x: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        x = x.gather(1, self.pick[..., None].expand(-1, -1, x.size(-1)))
        return self.head(x, targets.gather(1, self.pick), reduction)


class Scorer:
    """A model's per-token nats for TTT: ``scorer(x, y)`` -> (rows, width), or with ``pick`` (rows, G) column
    indices the (rows, G) nats of those columns. Through the model's regions (the protocol's blocks, head and
    compiled_regions: speedrun.plan.model_choice) the head runs at the picked columns only (PickedHead), or, for a
    model whose forward takes ``pick`` (supports_pick), the model is asked for those columns (the built-in GPT
    then runs its last layer call there only too); without regions or pick the whole forward runs and the columns
    are taken after. This one runs the module's own blocks and head (eager); CompiledScorer runs compiled copies."""

    def __init__(self, module: nn.Module):
        self.module = module
        model: Any = module
        self.regions: tuple[tuple, Callable] | None = (
            (tuple(model.blocks), model.head) if hasattr(module, "compiled_regions") else None
        )
        self.whole: Callable = module
        """The forward that runs when there are no regions."""
        self.picks = bool(getattr(module, "supports_pick", False))
        """The model's forward takes ``pick`` (the built-in GPT then runs its last layer at those columns only)."""
        self.warm_up_seconds = 0.0

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, reduction: str = "none", pick: torch.Tensor | None = None
    ) -> torch.Tensor:
        model: Any = self.module
        if pick is not None and self.picks:  # the model skips what the picked columns do not need
            if self.regions is None:
                return self.whole(x, y, reduction=reduction, pick=pick)
            with model.compiled_regions(*self.regions):
                return model(x, y, reduction=reduction, pick=pick)
        if self.regions is None:
            nats = self.whole(x, y, reduction=reduction)
            return nats if pick is None else nats.gather(1, pick)
        blocks, head = self.regions
        with model.compiled_regions(blocks, head if pick is None else PickedHead(head, pick)):
            return model(x, y, reduction=reduction)


class CompiledScorer(Scorer):
    """A module's forward through torch.compile (dynamic shapes), and how long its warm-up took. ``scope`` blocks
    compiles each block and the head apart (as kernel.compile_scope=blocks does for training): the blocks share
    their code, so one small graph serves them all, where the whole model with its repeated layers, adapters and
    both loop passes is one very large graph to trace and lower. ``scope`` model (or a registry model without
    regions) compiles the whole forward, whose head then runs at every column unless the model takes ``pick``."""

    def __init__(self, module: nn.Module, backend: str, scope: str = "blocks"):
        super().__init__(module)

        def compiled(part: Callable) -> Callable:
            return functools.partial(own_entry(backend), part)

        if scope == "blocks" and self.regions is not None:
            model: Any = module
            # one entry for every block (the blocks share one graph), another for the head
            block_entry = own_entry(backend)
            blocks = tuple(functools.partial(block_entry, block) for block in model.blocks)
            self.regions = (blocks, compiled(model.head))
        else:
            self.regions = None
            self.whole = compiled(module)

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, reduction: str = "none", pick: torch.Tensor | None = None
    ) -> torch.Tensor:
        # One block code serves several variants (adapted or not, with and without grad, with or without a parallel
        # lane): more than dynamo's default 8 graphs per code object, past which it would run the rest eagerly.
        # No duck shaping: a window as wide as another dimension of the step (64 tokens = pgolf_record's head size)
        # would share that dimension's symbol, be specialized with it, and make every other width compile every
        # variant again (24 graphs of the smoke pgolf_record's block instead of 12; a test counts them).
        with (
            torch._dynamo.config.patch(recompile_limit=BLOCK_GRAPHS_LIMIT),
            fx_config.patch(use_duck_shape=False),  # type: ignore[attr-defined]  # installed by torch at import
        ):
            return super().__call__(x, y, reduction, pick)


BLOCK_GRAPHS_LIMIT = 64
"""Graphs dynamo may build for one code object (a scorer's block entry) while TTT runs compiled."""


def _enter(part: Callable, *args: Any, **kwargs: Any) -> Any:
    return part(*args, **kwargs)


def own_entry(backend: str) -> Callable:
    """``entry(part, *args, **kwargs) = part(*args, **kwargs)`` compiled (dynamic shapes), on a code object of its
    own. Dynamo keeps graphs per code object: had both scorers compiled their modules directly, the adapted
    blocks' graphs and the unadapted ones' would sit on Block.forward together, and a recompile of one checks the
    other's guards against its frame. The adapted graphs' guards name the adapters' bound tensors, which an
    unadapted block lacks, and torch (2.11 to 2.13 at least) raises KeyError building that recompile's reason
    (experiment=pgolf_pr2014 with ttt.compile failed so at its first unadapted call). The module is an argument,
    not a closure's cell, so every block of one model still shares one graph."""
    code = _enter.__code__.replace()  # an equal code object, not the same one: its own graph cache
    entry = types.FunctionType(code, _enter.__globals__, "ttt_scorer_entry")
    return torch.compile(entry, dynamic=True, backend=backend)


def make_scorers(
    lora: LoRAModel,
    model: nn.Module,
    s: TTTSettings,
    seq_len: int,
    steps: list[tuple[int, int]],
    device: str,
    autocast_dtype: torch.dtype | None,
    vocab: int,
) -> tuple[Scorer, Scorer]:
    """The adapted and the unadapted scorers: the modules themselves, or (settings.compile) compiled and warmed up
    on random tokens (never validation data) at every chunk size and the full window, with and without gradients,
    as the steps and the base passes call them (the head at a chunk's columns, or at every column), so the graphs
    exist before TTT's clock starts. The warm-up takes no optimizer step: the adapters stay as they were (their
    gradients are dropped)."""
    if s.compile is None:
        return Scorer(lora.model), Scorer(model)
    t0 = time.perf_counter()
    forward, base = (
        CompiledScorer(lora.model, s.compile, s.compile_scope),
        CompiledScorer(model, s.compile, s.compile_scope),
    )
    rows = lora.slots  # a full batch; a last, smaller one is another size of the same dynamic graph
    gen = torch.Generator().manual_seed(0)
    chunks = [s.chunk_size, *(c for _, c in steps)]
    for width in sorted({row_width(c, seq_len, s.row_widths) for c in chunks} | {seq_len}):
        x, y = (torch.randint(0, vocab, (rows, width), generator=gen).to(device) for _ in range(2))
        # contiguous, as a step's picks are: an expanded one (stride 0) would be another graph to dynamo
        pick = torch.arange(min(max(chunks), width), device=device).repeat(rows, 1)
        # the adapters' slots bound as the steps bind them (chunk_step): another way would be another graph
        lora.bind_rows(rows)
        autocast_nats(forward, x, y, device, autocast_dtype, pick).float().mean().backward()
        with torch.no_grad():
            lora.bind_rows(rows)
            autocast_nats(forward, x, y, device, autocast_dtype, pick)
            lora.bind_rows(None)
            if s.score_base:  # windows over documents' starts score every column; a later window one chunk
                autocast_nats(base, x, y, device, autocast_dtype)
                autocast_nats(base, x, y, device, autocast_dtype, pick)
                if min(chunks) == 1:  # a chunk of one column: a size-1 dimension is a graph of its own
                    autocast_nats(base, x, y, device, autocast_dtype, pick[:, :1].contiguous())
    for p in lora.parameters():
        p.grad = None
    forward.warm_up_seconds = time.perf_counter() - t0
    return forward, base


def autocast_nats(
    model: Callable,
    x: torch.Tensor,
    y: torch.Tensor,
    device: str,
    autocast_dtype: torch.dtype | None,
    pick: torch.Tensor | None = None,
) -> torch.Tensor:
    """A scorer's (Scorer) nats under the autocast: (rows, width), or at ``pick``'s columns (rows, G)."""
    if autocast_dtype is None:
        return model(x, y, reduction="none", pick=pick)
    with torch.autocast(device, dtype=autocast_dtype):
        return model(x, y, reduction="none", pick=pick)


# ---------------------------------------------------------------------------------------------------------
# val_bpb_ttt_base: the unadapted model's scores


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


# ---------------------------------------------------------------------------------------------------------
# what a pass reports, summed over the ranks


class ScoredChunk(NamedTuple):
    """One document's chunk as it was scored (TTTResult.chunks, for tests)."""

    batch: int
    """Position of the document's batch in the scoring order: (batch, chunk) orders the scoring, and the chunks
    of one (batch, chunk) were scored in one forward."""
    chunk: int
    doc: int
    nats: float
    tokens: int


@dataclass
class TTTResult:
    val_loss: float | None
    """Mean nats per scored token (None if nothing was scored)."""
    val_bpb: float | None
    base_val_loss: float | None
    """The same chunks and windows scored by the model with no adaptation (None if not asked for)."""
    base_val_bpb: float | None
    tokens_scored: int
    tokens_total: int
    bytes: int
    docs_done: int
    docs_total: int
    seconds: float
    complete: bool
    """False when ttt.max_seconds stopped it before every token was scored."""
    chunks: list[ScoredChunk] = field(default_factory=list)
    """Every scored chunk, in scoring order, when asked for (tests)."""
    phases_done: int = 0
    """Global phases that ran (ttt.phased)."""
    global_steps: int = 0
    global_tokens: int = 0
    global_seconds: float = 0.0
    """Time in the global fine-tunes (the slowest rank's), part of ``seconds``."""
    compile_seconds: float = 0.0
    """The compile warm-up before the clock started (settings.compile; 0 when eager), not part of ``seconds``."""
    recompiles: int = 0
    """Graphs torch.compile built after the warm-up, during TTT itself (0 is the aim)."""
    cuda_graphs: int = 0
    """Step shapes captured as CUDA graphs (settings.cuda_graphs; the most of any rank)."""
    cuda_graphs_late: int = 0
    """Of those, the ones captured while TTT's clock ran (0 is the aim)."""
    rank_seconds: list[float] = field(default_factory=list)
    """Per rank, the seconds it spent adapting its own batches (global phases and waits apart): how evenly the
    dealing spread the work."""
    rank_cost: list[float] = field(default_factory=list)
    """Per rank, the cost the dealing predicted for its batches (documents.batch_cost): with rank_seconds, what a
    better cost model is fitted to."""

    @property
    def fraction(self) -> float:
        return self.tokens_scored / self.tokens_total if self.tokens_total else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens scored per second of TTT (global phases included)."""
        return self.tokens_scored / self.seconds if self.seconds > 0 else None


class Sums:
    """This rank's scores so far, kept on the device (float64 nats, int64 bytes): read once, at the end."""

    def __init__(self, device: str):
        self.nats = torch.zeros((), dtype=torch.float64, device=device)
        self.base_nats = torch.zeros((), dtype=torch.float64, device=device)
        self.bytes = torch.zeros((), dtype=torch.int64, device=device)
        self.tokens = 0

    def totals(self) -> tuple[float, int, int]:
        return float(self.nats.item()), int(self.bytes.item()), self.tokens


@dataclass
class GlobalTotals:
    """What the global phases that ran added up to (TTTResult.phases_done, global_steps, ...)."""

    phases: int = 0
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, stats: FinetuneStats) -> None:
        self.phases += 1
        self.steps += stats.steps
        self.tokens += stats.tokens
        self.seconds += stats.seconds


@dataclass
class Tally:
    """What this rank's batches and the global phases leave for the result."""

    sums: Sums
    chunks: list[ScoredChunk] | None
    """Every scored chunk, in scoring order, when asked for (record_chunks); None: not recorded."""
    docs_done: int = 0
    stopped: bool = False
    """ttt.max_seconds ran out."""
    busy: float = 0.0
    """This rank's seconds inside its own batches."""
    glob: GlobalTotals = field(default_factory=GlobalTotals)


@dataclass(frozen=True)
class Timings:
    """A rank's clock and compile counts at the end (``slowest`` makes them the slowest rank's)."""

    seconds: float
    compile_seconds: float
    recompiles: int
    cuda_graphs: int
    cuda_graphs_late: int


def sum_over_ranks(tally: Tally, shard: World | None, rank: int, world: int, cost: float, device: str) -> torch.Tensor:
    """Every rank's sums, counts and stop added into ``tally`` (all-reduced); returns (2, world) float64: per rank,
    its busy seconds and its batches' predicted cost."""
    per_rank = torch.zeros(2, world, dtype=torch.float64, device=device)
    per_rank[0, rank] = tally.busy
    per_rank[1, rank] = cost
    if shard is not None:
        sums = tally.sums
        shard.sum_(per_rank)
        counts = torch.tensor([sums.tokens, tally.docs_done], dtype=torch.int64, device=device)
        shard.sum_(sums.nats), shard.sum_(sums.bytes), shard.sum_(sums.base_nats), shard.sum_(counts)
        sums.tokens, tally.docs_done = (int(v) for v in counts.tolist())
        tally.stopped = bool(shard.max(1.0 if tally.stopped else 0.0))
    return per_rank


def slowest(t: Timings, tally: Tally, shard: World | None) -> Timings:
    """The slowest rank's, as every count of time here (the global phases' seconds in ``tally`` too)."""
    if shard is None:
        return t
    tally.glob.seconds = float(shard.max(tally.glob.seconds) or 0.0)
    return Timings(
        float(shard.max(t.seconds) or 0.0),
        float(shard.max(t.compile_seconds) or 0.0),
        int(shard.max(t.recompiles) or 0),
        int(shard.max(t.cuda_graphs) or 0),
        int(shard.max(t.cuda_graphs_late) or 0),
    )


def make_result(
    tally: Tally, t: Timings, per_rank: torch.Tensor, *, tokens_total: int, docs_total: int, score_base: bool
) -> TTTResult:
    """The result of the summed ``tally`` (sum_over_ranks) and the slowest rank's timings."""
    nats, n_bytes, n_tokens = tally.sums.totals()
    base_nats = float(tally.sums.base_nats.item()) if score_base else None
    glob = tally.glob
    return TTTResult(
        val_loss=nats / n_tokens if n_tokens else None,
        val_bpb=nats / math.log(2) / n_bytes if n_bytes else None,
        base_val_loss=base_nats / n_tokens if base_nats is not None and n_tokens else None,
        base_val_bpb=base_nats / math.log(2) / n_bytes if base_nats is not None and n_bytes else None,
        tokens_scored=n_tokens,
        tokens_total=tokens_total,
        bytes=n_bytes,
        docs_done=tally.docs_done,
        docs_total=docs_total,
        seconds=t.seconds,
        complete=n_tokens == tokens_total,
        chunks=tally.chunks or [],
        phases_done=glob.phases,
        global_steps=glob.steps,
        global_tokens=glob.tokens,
        global_seconds=glob.seconds,
        compile_seconds=t.compile_seconds,
        recompiles=t.recompiles,
        cuda_graphs=t.cuda_graphs,
        cuda_graphs_late=t.cuda_graphs_late,
        rank_seconds=[round(x, 3) for x in per_rank[0].tolist()],
        rank_cost=[round(x, 1) for x in per_rank[1].tolist()],
    )
