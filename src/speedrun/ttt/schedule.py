"""The order of a TTT pass, fixed before it starts: the documents' batches in scoring order, each batch's chunk size,
the global phases' boundaries, which rank runs each batch and along which chain of A (speedrun.ttt.documents has
how each is chosen). It depends on the settings and the document lengths only, never on a score."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speedrun.ttt.documents import (
    SPLIT_STEP_COST_TOKENS,
    batch_cost,
    chunk_size_for,
    deal_batches,
    document_batches,
    split_documents,
    split_heavy_batches,
)
from speedrun.ttt.global_phases import GlobalSettings, phase_schedule, phase_shapes
from speedrun.ttt.settings import LoRASettings, padding


@dataclass(frozen=True)
class Schedule:
    docs: list[tuple[int, int]]
    """(start, n_targets) of every document of the stream (documents.split_documents)."""
    batches: list[list[int]]
    """Document indices per batch, in scoring order."""
    sizes: list[int]
    """Each batch's chunk size."""
    phases: dict[int, list[int]]
    """{batch: the documents (a count, in scoring order) each phase after it trains on} (phase_schedule)."""
    costs: list[float]
    """Each batch's predicted cost under the run's own settings (documents.batch_cost)."""
    owner: list[int]
    """The rank that runs each batch."""
    chain_of: list[int]
    """Each batch's chain of A (warm_start_a; 0 without)."""
    mode: str
    """How steps run: eager, compact (compiled) or graphs (ttt.cuda_graphs)."""
    widths: str
    half_rows: bool

    @property
    def last_phase(self) -> int:
        """The last batch a global phase follows (-1: none)."""
        return max(self.phases, default=-1)

    def mine(self, rank: int) -> list[int]:
        """The batches ``rank`` runs, in scoring order."""
        return [b for b in range(len(self.batches)) if self.owner[b] == rank]

    def share(self, rank: int) -> int:
        """The targets of the documents ``rank`` scores (its progress line's total)."""
        return sum(self.docs[i][1] for b in self.mine(rank) for i in self.batches[b])

    def scored_documents(self, b: int) -> list[tuple[int, int]]:
        """The documents scored up to batch b included, in scoring order: what a phase after batch b trains on."""
        return [self.docs[i] for done in self.batches[: b + 1] for i in done]

    def phase_shapes(self, settings: GlobalSettings, seq_len: int, rank: int, world: int) -> set[tuple[int, int]]:
        """(rows, width) of every forward this rank's global phases will run (global_phases.phase_shapes)."""
        return {
            shape
            for b, boundaries in self.phases.items()
            for boundary in boundaries
            for shape in phase_shapes(self.scored_documents(b)[:boundary], settings, seq_len, rank, world)
        }


def make_schedule(
    val_tokens: torch.Tensor, s: LoRASettings, steps: list[tuple[int, int]], *, bos_id: int, seq_len: int, world: int
) -> Schedule:
    """The pass's schedule over ``world`` ranks (see the module doc); ``steps`` is ttt.short_chunks, parsed."""
    docs = split_documents(val_tokens, bos_id)
    widths, half_rows = padding(s)
    mode = "graphs" if s.cuda_graphs else "compact" if s.compile is not None else "eager"
    slots = min(s.batch_size, len(docs))

    def cost(
        batch: list[int],
        mode: str = mode,
        base: bool = s.score_base,
        widths: str = widths,
        half_rows: bool = half_rows,
        step: float | None = None,
    ) -> float:
        chunk = chunk_size_for(docs[batch[0]][1], s.chunk_size, steps)
        return batch_cost(docs, batch, chunk, seq_len, mode, widths, slots, base, step, half_rows)

    # one cost model whatever the settings, for what changes the scores (the batches, the chains of A): every way of
    # running TTT splits and chains alike
    frozen = lambda b: cost(b, "graphs", False, "pow2", False, SPLIT_STEP_COST_TOKENS)  # noqa: E731
    batches = document_batches(docs, s.chunk_size, steps, s.batch_size, s.seed)
    if s.max_batch_share is not None:
        batches = split_heavy_batches(batches, frozen, s.max_batch_share)
    phases = phase_schedule([len(b) for b in batches], s.phased)
    costs = [cost(batch) for batch in batches]
    owner, chain_of = deal_batches(
        costs, list(phases), world, s.warm_start_chains if s.warm_start_a else 0, [frozen(b) for b in batches]
    )
    sizes = [chunk_size_for(docs[batch[0]][1], s.chunk_size, steps) for batch in batches]
    return Schedule(docs, batches, sizes, phases, costs, owner, chain_of, mode, widths, half_rows)
