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

The order of a TTT pass, fixed before it starts: the documents' batches in scoring order, each batch's chunk size,
the global phases' boundaries, which rank runs each batch and along which chain of A (speedrun.core.ttt_docs has
how each is chosen). It depends on the settings and the document lengths only, never on a score.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from speedrun.core.ttt_lora import GlobalSettings, TTTSettings


def short_chunks_of(spec: str) -> list[tuple[int, int]]:
    """ttt.short_chunks "256:8,2000:24" -> [(256, 8), (2000, 24)]: (max scored tokens of a document, chunk size),
    ascending; "" -> [] (speedrun.config.specs checks a command line's)."""
    return sorted((int(a), int(b)) for a, b in (item.split(":") for item in spec.replace(" ", "").split(",") if item))


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


def row_width(n: int, seq_len: int, widths: str = "pow2") -> int:
    """Pad a batch of rows of at most n tokens to one of a few widths (at most seq_len), so kernels that compile or
    plan per shape (flex, cuDNN) do so a few times, not once per batch (ttt.row_widths): ``pow2``, a power of two
    of at least 64; ``half_octave``, those and the widths halfway up each octave (96, 192, 384, ...: 3/4 of the
    next power of two), twice the shapes for less padding; a number N (e.g. "128"), a multiple of N."""
    if widths.isdigit():
        step = int(widths)
        return min(seq_len, max(step, -(-n // step) * step))
    width = max(64, 1 << max(0, n - 1).bit_length())
    if widths == "half_octave" and width > 64 and n <= width * 3 // 4:
        width = width * 3 // 4
    return min(seq_len, width)


def pad_rows(going: int, slots: int, half_octaves: bool = False) -> int:
    """Rows a graphed step runs for ``going`` documents still going: the next power of two, at least 2 (a size-1
    dimension would specialize a compiled graph of its own), at most ``slots``. ``half_octaves`` (ttt.graph_rows)
    adds 3/4 of each power of two (3, 6, 12, 24, 48, ...): less padding for more shapes to capture."""
    rows = max(2, 1 << max(0, going - 1).bit_length())
    if half_octaves and rows > 2 and going <= rows * 3 // 4:
        rows = rows * 3 // 4
    return min(slots, rows)


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
    A step's rows are padded to the width of its longest window (row_width; at most seq_len tokens).
    ``mode`` says which rows a step runs (speedrun.core.ttt_docs.rows_for): eager every document of the batch,
    compact (compiled) the documents still going, at least 2, graphs that padded to a power of two within ``slots``
    (default: the batch). ``score_base`` adds the base passes' padded tokens (base_scores), at BASE_TOKEN_COST.
    ``step_tokens`` replaces the mode's STEP_COST_TOKENS; ``widths`` and ``half_rows`` are ttt.row_widths and
    ttt.graph_rows=half_octave."""
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


def phase_schedule(batch_docs: list[int], settings: GlobalSettings) -> dict[int, list[int]]:
    """{batch index: [documents the phases ending with that batch train on]}, from the number of documents of each
    batch in scoring order (see the module doc). Several phases may end with one batch when it is larger than a
    phase's group; they then run one after the other."""
    if settings.phases == 0 or not batch_docs:
        return {}
    cumulative = list(itertools.accumulate(batch_docs))
    prefix = min(settings.prefix_docs, cumulative[-1])
    out: dict[int, list[int]] = {}
    for p in range(settings.phases):
        boundary = prefix * (p + 1) // settings.phases
        ends = bisect.bisect_left(cumulative, boundary)  # the batch that scores document number `boundary`
        if boundary > 0 and ends < len(batch_docs) - 1:
            out.setdefault(ends, []).append(boundary)
    return out


@dataclass(frozen=True)
class PassSchedule:
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


def make_schedule(
    val_tokens: torch.Tensor, s: TTTSettings, steps: list[tuple[int, int]], *, bos_id: int, seq_len: int, world: int
) -> PassSchedule:
    """The pass's schedule over ``world`` ranks (see the module doc); ``steps`` is ttt.short_chunks, parsed."""
    docs = split_documents(val_tokens, bos_id)
    widths, half_rows = s.row_widths, s.graph_rows == "half_octave"
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
    return PassSchedule(docs, batches, sizes, phases, costs, owner, chain_of, mode, widths, half_rows)
