"""What score-first TTT reports: TTTResult and its scored chunks; the sums, counts and times a rank adds up as it
scores, and how the ranks' are put together (float64 sums all-reduced, the slowest rank's times)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from speedrun.ttt.global_phases import FinetuneStats

if TYPE_CHECKING:  # annotations only: TTT is handed a World, it never makes one
    from speedrun.distributed.world import World


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
