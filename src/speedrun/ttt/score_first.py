"""Score-first test-time training (TTT): per-document LoRA adapters trained on the validation stream as it
is scored, never on a token before that token has been scored; optionally, between batches, the model itself
fine-tuned on documents already scored (phased global TTT, speedrun.ttt.global_phases).

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
speedrun.ttt.documents.

Adapters (speedrun.ttt.lora): rank-r LoRA on what ``ttt.targets`` names, scaled by alpha / rank, one slot per
document of a batch; Adam (AdamW) or SGD. Documents of a batch have independent adapters: the loss is a sum of
per-document terms and both optimizers are elementwise, so a document's adapter sees only its own gradients.

Baseline: every chunk TTT scores is also scored by the model passed in, with no adaptation and no global phase,
from the same window (``val_bpb_ttt_base``), so ``val_bpb_ttt_base - val_bpb_ttt`` is what adaptation bought, apart
from what the document-local windows alone change against the plain eval. That model never changes, so a
document's chunks are base-scored together where their windows allow (speedrun.ttt.base_scores: about one
forward per document, not one per chunk), and each is counted when its chunk is scored: the same tokens.

Budget: ``ttt.max_seconds`` is checked before every chunk step and every global step; when it is spent TTT stops
there and reports what it scored (tokens_scored, fraction): an unbiased sample of documents, the batches running in
a seeded random order.

Ranks (``shard``, a speedrun.distributed.world.World): the shuffled batches are dealt by cost between global
phases (speedrun.ttt.documents.deal_batches), each rank adapts and scores its own in the scoring order, and
the float64 sums are all-reduced; seconds is the slowest rank's. A batch's result depends on no other batch (fresh
adapters and optimizer per batch), except through warm_start_a's A, which is carried along chains of batches that
do not depend on the rank count and that the dealing keeps on one rank each, so the sums equal one rank's. Global
phases run on every rank at once, at the same batch boundary, with their gradients averaged, so every rank's model
stays the same (global_phases's module doc).

Where the parts live: the settings (settings.py), the pass's schedule (schedule.py), the scoring forwards and their
compile warm-up (scorers.py), a batch's steps (steps.py) and one batch's score-first loop (adapt.py), the result
(result.py); this module runs a pass through them, phase by phase.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from speedrun.config.specs import parse_short_chunks, parse_targets
from speedrun.data.bpb import ByteLUTs
from speedrun.kernels.compile import graphs_compiled
from speedrun.progress import Progress
from speedrun.ttt.adapt import ChainsOfA, adapt_batch
from speedrun.ttt.documents import chunk_size_for, split_documents
from speedrun.ttt.global_phases import GlobalSettings, finetune
from speedrun.ttt.global_phases import warm_up as warm_up_phases
from speedrun.ttt.graphs import GraphedChunkSteps, InGraphUpdate, TokenScoresHook
from speedrun.ttt.lora import LoRAModel, cast_linear_weights
from speedrun.ttt.optim import AdapterOptimizer, RowSlotsAdam, adapter_optimizer
from speedrun.ttt.result import (
    ScoredChunk,
    Sums,
    Tally,
    Timings,
    TTTResult,
    make_result,
    slowest,
    sum_over_ranks,
)
from speedrun.ttt.schedule import Schedule, make_schedule
from speedrun.ttt.scorers import CompiledScorer, make_scorers
from speedrun.ttt.settings import LoRASettings, check_settings
from speedrun.ttt.steps import Stepper, sync

if TYPE_CHECKING:  # annotations only: TTT is handed a World, it never makes one
    from speedrun.distributed.world import World


def ttt_evaluate(
    model: nn.Module,
    val_tokens: torch.Tensor,
    luts: ByteLUTs,
    settings: LoRASettings,
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
    steps = check_settings(settings, seq_len, world)
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


@dataclass
class _Pass:
    """What every phase of one TTT pass works with (made by _prepare)."""

    settings: LoRASettings
    schedule: Schedule
    lora: LoRAModel
    opt: AdapterOptimizer
    """One for the run, begun anew at every batch."""
    stepper: Stepper
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
    s: LoRASettings,
    steps: list[tuple[int, int]],
    schedule: Schedule,
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
    lora = LoRAModel(model, parse_targets(s.targets), s.rank, slots, s.seed, scale, low, s.shared_attn_a)
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
    stepper = Stepper(
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
    shapes = run.schedule.phase_shapes(s.phased, run.seq_len, run.rank, run.world)
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


__all__ = [
    "GlobalSettings",
    "LoRASettings",
    "ScoredChunk",
    "TTTResult",
    "chunk_size_for",
    "parse_short_chunks",
    "parse_targets",
    "split_documents",
    "ttt_evaluate",
]
