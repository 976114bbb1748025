"""Score-first test-time training (TTT): per-document LoRA adapters trained on the validation stream as it
is scored, never on a token before that token has been scored; optionally, between batches, the model itself
fine-tuned on documents already scored (phased global TTT, speedrun.core.ttt_global).

For each document (BOS-delimited; document d owns the targets after its BOS up to and including the next BOS,
so the documents' targets are exactly positions 1..M of the stream, as in the standard eval):

    adapters <- fresh (B = 0: the model starts as the unadapted model; A the seeded draw, or with
                ttt.warm_start_a as the previous batch left it)
    for each chunk of the document's targets, in order:
        score the chunk with the current adapters   (adds to the val_bpb_ttt sums)
        one optimizer step on that chunk's mean loss (skipped after the last chunk)

A chunk is scored from a window of at most model.seq_len tokens of its own document that ends at the chunk's
last target, so no token attends across BOS and no score can depend on a later token: the adapters that score
chunk k have been trained on chunks 0..k-1 only, and a global phase trains only on documents already scored
(tests/ttt/test_ttt_score_first.py and, token by token, tests/ttt/test_ttt_causality.py change one target at a time
and check every score made before it).

Documents, their chunk sizes (``ttt.chunk_size``, ``ttt.short_chunks``) and the batches' order:
speedrun.core.ttt_docs.

Adapters (speedrun.core.ttt_lora): rank-r LoRA on what ``ttt.targets`` names, scaled by alpha / rank, one slot per
document of a batch; Adam (AdamW) or SGD. Documents of a batch have independent adapters: the loss is a sum of
per-document terms and both optimizers are elementwise, so a document's adapter sees only its own gradients.

Baseline: every chunk TTT scores is also scored by the model passed in, with no adaptation and no global phase,
from the same window (``val_bpb_ttt_base``), so ``val_bpb_ttt_base - val_bpb_ttt`` is what adaptation bought, apart
from what the document-local windows alone change against the plain eval. That model never changes, so a
document's chunks are base-scored together where their windows allow (speedrun.core.ttt_scorers: about one
forward per document, not one per chunk), and each is counted when its chunk is scored: the same tokens.

Budget: ``ttt.max_seconds`` is checked before every chunk step and every global step; when it is spent TTT stops
there and reports what it scored (tokens_scored, fraction): an unbiased sample of documents, the batches running in
a seeded random order.

Ranks (``shard``, a speedrun.distributed.world.World): the shuffled batches are dealt by cost between global
phases (speedrun.core.ttt_docs.deal_batches), each rank adapts and scores its own in the scoring order, and
the float64 sums are all-reduced; seconds is the slowest rank's. A batch's result depends on no other batch (fresh
adapters and optimizer per batch), except through warm_start_a's A, which is carried along chains of batches that
do not depend on the rank count and that the dealing keeps on one rank each, so the sums equal one rank's. Global
phases run on every rank at once, at the same batch boundary, with their gradients averaged, so every rank's model
stays the same (speedrun.core.ttt_global's module doc).

Where the parts live: the settings and the adapters (ttt_lora.py), the documents and the pass's schedule
(ttt_docs.py), the scoring forwards, the unadapted scores and the result (ttt_scorers.py), one step as device work
and its CUDA graphs (ttt_graphs.py), the global phases (ttt_global.py). This module reads top to bottom: the pass
(ttt_evaluate) and its phases, then one batch's score-first loop (adapt_batch), then how a step is run.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from speedrun.core import choice
from speedrun.core.compile import graphs_compiled
from speedrun.core.data import ByteLUTs
from speedrun.core.ttt_docs import PassSchedule, batch_steps, longest_first, make_schedule, rows_for, short_chunks_of
from speedrun.core.ttt_global import finetune, phase_shapes, warm_up_phases
from speedrun.core.ttt_graphs import (
    GradSink,
    GraphedChunkSteps,
    InGraphUpdate,
    StepKey,
    StepOut,
    TokenScoresHook,
    chunk_step,
    token_scores,
)
from speedrun.core.ttt_lora import (
    AdapterOptimizer,
    LoRAModel,
    RowSlotsAdam,
    TTTSettings,
    adapter_optimizer,
    cast_linear_weights,
    targets_of,
)
from speedrun.core.ttt_scorers import (
    BaseScores,
    CompiledScorer,
    ScoredChunk,
    Sums,
    Tally,
    Timings,
    TTTResult,
    autocast_nats,
    make_result,
    make_scorers,
    slowest,
    sum_over_ranks,
)
from speedrun.progress import Progress

if TYPE_CHECKING:  # annotations only: TTT is handed a World, it never makes one
    from speedrun.core.dist import World


def ttt_evaluate(
    model: nn.Module,
    val_tokens: torch.Tensor,
    luts: ByteLUTs,
    settings: TTTSettings,
    *,
    bos_id: int,
    seq_len: int,
    device: str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    log: Callable[[str], None] | None = None,
    shard: World | None = None,
    record_chunks: bool = False,
    on_clock: Callable[[], None] | None = None,
    on_token_scores: TokenScoresHook | None = None,
) -> TTTResult:
    """Score val_tokens with score-first LoRA TTT (see the module doc), learning as ``settings`` say. ``model`` is
    not modified. ``log`` also gets a progress line at most every 30 s (this rank's tokens scored of its share);
    ``shard`` (a World) splits the documents over the ranks. ``on_clock`` is called when TTT's clock starts, after
    the compile warm-up (scripts/ttt_table.py --profile starts its profiler there). ``on_token_scores`` is called
    after every step of this rank, in scoring order, with the stream positions of the targets it scored and their
    float64 nats (graphs.token_scores): per-token scores, bit for bit what the sums add (tests of causality)."""
    rank, world = (shard.rank, shard.world_size) if shard is not None else (0, 1)
    steps = short_chunks_of(settings.short_chunks)
    schedule = make_schedule(val_tokens, settings, steps, bos_id=bos_id, seq_len=seq_len, world=world)
    run = _prepare(model, val_tokens, luts, settings, steps, schedule, seq_len, device, autocast_dtype, shard, log)
    warm_up_seconds = run.compile_seconds + _capture_graphs(run) + _warm_up_phases(run)
    if shard is not None:
        # the ranks' warm-ups differ (by a minute or more); without this, a rank that finished first would count
        # the slowest one's compile in its TTT seconds, waiting for it at the first phase
        shard.barrier()
    graphs0 = graphs_compiled()
    if on_clock is not None:
        on_clock()
    t0 = time.perf_counter()  # TTT's clock (and ttt.max_seconds) starts after every rank's compile warm-up
    deadline = None if settings.max_seconds is None else t0 + settings.max_seconds
    tally = Tally(Sums(device), [] if record_chunks else None)
    _score_batches(run, tally, deadline, on_token_scores)
    cost = sum(c for b, c in enumerate(schedule.costs) if schedule.owner[b] == rank)
    per_rank = sum_over_ranks(tally, shard, rank, world, cost, device)
    graphs = run.stepper.graphs
    timings = Timings(
        time.perf_counter() - t0,
        warm_up_seconds,
        graphs_compiled() - graphs0,
        len(graphs.graphs) if graphs is not None else 0,
        graphs.late if graphs is not None else 0,
    )
    timings = slowest(timings, tally, shard)
    total = val_tokens.numel() - 1
    result = make_result(
        tally, timings, per_rank, tokens_total=total, docs_total=len(schedule.docs), score_base=settings.score_base
    )
    if tally.stopped and log:
        log(
            f"ttt: max_seconds={settings.max_seconds:g} reached after {timings.seconds:.1f} s; scored "
            f"{result.tokens_scored:,} of {total:,} tokens"
        )
    return result


TTT = choice("ttt.name", {"lora": ttt_evaluate, "record": ttt_evaluate})
"""ttt.name -> the pass (ttt=record is lora with the records' settings)."""


@dataclass
class _Pass:
    """What every phase of one TTT pass works with (made by _prepare)."""

    settings: TTTSettings
    schedule: PassSchedule
    lora: LoRAModel
    opt: AdapterOptimizer
    """One for the run, begun anew at every batch."""
    stepper: ChunkStepper
    tokens: torch.Tensor
    """The stream, on the device."""
    seq_len: int
    device: str
    autocast_dtype: torch.dtype | None
    shard: World | None
    rank: int
    world: int
    log: Callable[[str], None] | None
    """Rank 0's (None on the others, and when not asked for): what the warm-ups and phases say."""
    progress: Progress | None
    compile_seconds: float
    """The scorers' compile warm-up (0 eager)."""


def _prepare(
    model: nn.Module,
    val_tokens: torch.Tensor,
    luts: ByteLUTs,
    s: TTTSettings,
    steps: list[tuple[int, int]],
    schedule: PassSchedule,
    seq_len: int,
    device: str,
    autocast_dtype: torch.dtype | None,
    shard: World | None,
    log: Callable[[str], None] | None,
) -> _Pass:
    """The adapted copy of the model, the scorers (compiled and warmed up with settings.compile), the stepper and the
    adapters' optimizer."""
    rank, world = (shard.rank, shard.world_size) if shard is not None else (0, 1)
    progress = Progress("ttt", log) if log is not None else None
    say = log if rank == 0 else None
    scale = 1.0 if s.alpha is None else s.alpha / s.rank
    low = autocast_dtype if s.cast_weights and autocast_dtype in (torch.bfloat16, torch.float16) else None
    slots = min(s.batch_size, len(schedule.docs))
    lora = LoRAModel(model, targets_of(s.targets), s.rank, slots, s.seed, scale, low, s.shared_attn_a)
    base_model = model
    if low is not None and s.score_base:  # the unadapted scorer: a copy, so the model passed in stays as it was
        base_model = copy.deepcopy(model)
        cast_linear_weights(base_model, low)
    tokens = val_tokens.to(device)
    if s.compile is not None and say is not None:  # minutes on a large model: say what is going on
        say("ttt: compiling the adapted and unadapted forwards (dynamic shapes), before TTT's clock starts")
    forward, base_forward = make_scorers(
        lora, base_model, s, seq_len, steps, device, autocast_dtype, int(tokens.max()) + 1
    )
    if isinstance(forward, CompiledScorer) and say is not None:
        say(f"ttt: compile warm-up done in {forward.warm_up_seconds:.1f} s")
    stepper = ChunkStepper(
        forward,
        base_forward if s.score_base else None,
        tokens,
        luts.to(device),
        device,
        autocast_dtype,
        mode=schedule.mode,
        slots=lora.slots,
        widths=schedule.widths,
        half_rows=schedule.half_rows,
        pick_width=max([s.chunk_size, *(c for _, c in steps)]),
        bind=lora.bind_rows,
    )
    opt = adapter_optimizer(lora.parameters(), s)
    return _Pass(
        s, schedule, lora, opt, stepper, tokens, seq_len, device, autocast_dtype, shard, rank, world, say, progress,
        forward.warm_up_seconds,
    )  # fmt: skip


def _capture_graphs(run: _Pass) -> float:
    """With ttt.cuda_graphs, every step shape this rank will run captured before the clock starts; its seconds."""
    if not run.settings.cuda_graphs:
        return 0.0
    t0 = time.perf_counter()
    sch, stepper = run.schedule, run.stepper
    # the rows' slots optimizer steps inside the graphs, on the step's own gradients (optim)
    update = cast(InGraphUpdate, run.opt) if isinstance(run.opt, RowSlotsAdam) else None
    stepper.graphs = GraphedChunkSteps(stepper.run, run.lora.parameters(), run.device, update)
    mine = sch.mine(run.rank)
    stepper.capture([[sch.docs[i] for i in sch.batches[b]] for b in mine], [sch.sizes[b] for b in mine], run.seq_len)
    seconds = time.perf_counter() - t0
    if run.log is not None:
        run.log(f"ttt: {len(stepper.graphs.graphs)} step shapes captured as CUDA graphs in {seconds:.1f} s")
    return seconds


def _warm_up_phases(run: _Pass) -> float:
    """Compiled, the global phases' shapes too (they run eagerly): their first call at a shape (cuDNN's attention
    plans) is paid here, before the clock, as the steps' compile and capture are (compiling the phases as well
    saved nothing more and took a minute). Its seconds."""
    s = run.settings
    if s.compile is None or not run.schedule.phases:
        return 0.0
    t0 = time.perf_counter()
    sch = run.schedule
    shapes = {  # (rows, width) of every forward this rank's global phases will run
        shape
        for b, boundaries in sch.phases.items()
        for boundary in boundaries
        for shape in phase_shapes(sch.scored_documents(b)[:boundary], s.phased, run.seq_len, run.rank, run.world)
    }
    vocab = int(run.tokens.max()) + 1
    with run.lora.bare() as bare:
        warm_up_phases(bare, shapes, vocab=vocab, device=run.device, autocast_dtype=run.autocast_dtype)
    seconds = time.perf_counter() - t0
    if run.log is not None:
        run.log(f"ttt: the global phases' {len(shapes)} shapes warmed up in {seconds:.1f} s")
    return seconds


def _score_batches(run: _Pass, tally: Tally, deadline: float | None, on_token_scores: TokenScoresHook | None) -> None:
    """This rank's batches in the scoring order, the global phases at their batch boundaries (every rank together).
    Once the budget is spent a rank scores no more, but still meets the others at each phase boundary left."""
    sch = run.schedule
    chains = ChainsOfA(run.lora, run.settings.warm_start_a)
    share = sch.share(run.rank)
    for b, batch in enumerate(sch.batches):
        if tally.stopped and b > sch.last_phase:  # no phase boundary left at which the other ranks wait for this one
            break
        if sch.owner[b] == run.rank and not tally.stopped:
            t_batch = time.perf_counter()
            chains.enter(sch.chain_of[b])
            tally.stopped = adapt_batch(
                run.lora,
                run.opt,
                [sch.docs[i] for i in batch],
                batch,
                sch.sizes[b],
                tally.sums,
                run.stepper,
                settings=run.settings,
                seq_len=run.seq_len,
                deadline=deadline,
                chunk_log=tally.chunks,
                progress=run.progress,
                share=share,
                batch_index=b,
                on_token_scores=on_token_scores,
            )
            chains.leave(sch.chain_of[b])
            sync(run.device)  # the batch's kernels are done: its time is this rank's own
            tally.busy += time.perf_counter() - t_batch
            if not tally.stopped:
                tally.docs_done += len(batch)
        if b in sch.phases:
            if run.shard is not None:  # every rank meets here: the phase needs them all, or none goes on
                tally.stopped = bool(run.shard.max(1.0 if tally.stopped else 0.0))
            if tally.stopped:
                break
            _global_phases(run, tally, b, deadline)
            chains.restart()
            if tally.stopped:
                break


def _global_phases(run: _Pass, tally: Tally, b: int, deadline: float | None) -> None:
    """The global phases that follow batch b, each a fine-tune of the model on the documents scored so far (every
    rank at once); then fresh adapters for the fine-tuned model."""
    order = run.schedule.scored_documents(b)
    for boundary in run.schedule.phases[b]:
        if run.log is not None:
            run.log(
                f"ttt phase {tally.glob.phases + 1}/{run.settings.phased.phases}: fine-tuning on the first "
                f"{boundary:,} documents scored"
            )
        with run.lora.bare() as bare:
            stats = finetune(
                bare,
                run.tokens,
                order[:boundary],
                run.settings.phased,
                seq_len=run.seq_len,
                device=run.device,
                autocast_dtype=run.autocast_dtype,
                shard=run.shard,
                deadline=deadline,
            )
        tally.glob.add(stats)
        if stats.stopped:
            tally.stopped = True
            break
    run.lora.reset(keep_a=False)  # warm_start_a: A drawn afresh for the fine-tuned model, as the records


# ---------------------------------------------------------------------------------------------------------
# one batch of documents, score first


def adapt_batch(
    lora: LoRAModel,
    opt: AdapterOptimizer,
    docs: list[tuple[int, int]],
    doc_ids: list[int],
    chunk: int,
    sums: Sums,
    stepper: ChunkStepper,
    *,
    settings: TTTSettings,
    seq_len: int,
    deadline: float | None,
    chunk_log: list[ScoredChunk] | None,
    progress: Progress | None = None,
    share: int = 0,
    batch_index: int = 0,
    on_token_scores: TokenScoresHook | None = None,
) -> bool:
    """Score-first TTT of one batch of documents (all with chunk size ``chunk``). True if the deadline hit.

    The documents take the adapter slots longest first, so at every step the documents not yet done are the first
    rows. Eager, a step runs one row per document of the batch at one padded width (documents that are done are all
    padding: unscored, untrained), so the shapes stay few: the batch size (smaller only for a last, short batch)
    times a handful of widths. Compiled (dynamic shapes: any row count of at least 2 runs on the warm-up's graphs),
    a step runs only the rows still going, at least 2: a batch's long tail, one long document and many done, no
    longer costs a full batch of padding per step. With CUDA graphs, that row count padded to a power of two. The
    documents that are done would get zero gradients either way; the optimizer (speedrun.core.ttt_lora) steps
    the rows' slots only where that leaves the adapters as a step of every slot would (Adam with beta1 = 0). The
    unadapted scores of the batch's chunks (val_bpb_ttt_base) come from speedrun.core.ttt_scorers, each counted
    when its chunk is scored. The time budget is checked before every step but the first: a batch begun scores at
    least its chunks 0."""
    if deadline is not None and time.perf_counter() > deadline:
        return True
    lora.reset(keep_a=settings.warm_start_a)
    opt.begin()
    try:
        order = longest_first(docs, chunk)
        docs, doc_ids = [docs[i] for i in order], [doc_ids[i] for i in order]
        base = stepper.base_scores(docs, chunk, seq_len)
        for k, table, width, training in batch_steps(
            docs, chunk, seq_len, stepper.mode, stepper.slots, stepper.widths, stepper.half_rows
        ):
            if k > 0 and deadline is not None and time.perf_counter() > deadline:  # a batch begun scores its chunk 0
                return True
            if training and stepper.graphs is None:
                opt.zero_grad()  # a graphed step writes its gradients (or steps) itself
            out = stepper.step(table, (len(table[0]), width, training))
            if on_token_scores is not None:  # before the update below, and before a graph's next replay
                on_token_scores(*token_scores(torch.tensor(table, dtype=torch.int64), out))
            sums.nats += out.row_nats.sum()
            if base is not None:  # the chunks scored now: the documents still going, the first rows
                sums.base_nats += base.chunk(k)[: sum(1 for n in table[1] if n)].sum()
            sums.bytes += out.n_bytes
            sums.tokens += sum(max(0, n - f) for n, f in zip(table[1], table[2]))  # counted on the host: no sync
            if progress is not None:  # after each chunk: one long document's batch can take minutes
                progress.tick(sums.tokens, share)
            if chunk_log is not None:
                for i, (d_nats, d_count) in enumerate(zip(out.row_nats.tolist(), out.counts.tolist())):
                    if d_count:
                        chunk_log.append(ScoredChunk(batch_index, k, doc_ids[i], d_nats, d_count))
            if training and out.updated is not None:  # the step took its update itself (in its CUDA graph)
                opt.stepped(len(table[0]), out.updated)
            elif training:  # the step on the chunk just scored: it can only change later chunks' scores
                opt.step(len(table[0]))
    finally:
        opt.finish()  # the adapters as every step left them (warm_start_a carries A on)
    return False


class ChainsOfA:
    """warm_start_a's chains (speedrun.core.ttt_docs.deal_batches): a batch starts from the A that the previous
    batch of its chain left, or from the seeded draw for a chain's first batch and again after a global phase. The
    rank keeps a copy of every adapter's A per chain it runs."""

    def __init__(self, lora: LoRAModel, on: bool):
        self.lora, self.on = lora, on
        self.saved: dict[int, list[torch.Tensor]] = {}

    def enter(self, chain: int) -> None:
        if not self.on:
            return
        state = self.saved.get(chain)
        if state is None:
            self.lora.reset(keep_a=False)
        else:
            self.lora.load_a(state)

    def leave(self, chain: int) -> None:
        if self.on:
            self.saved[chain] = self.lora.a_state()

    def restart(self) -> None:
        self.saved.clear()


# ---------------------------------------------------------------------------------------------------------
# how a step runs: directly, or replayed from CUDA graphs


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


@dataclass
class ChunkStepper:
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
