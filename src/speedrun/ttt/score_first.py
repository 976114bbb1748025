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
(tests/ttt/test_ttt_score_first.py changes one token at a time and checks every score made before it).

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
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import torch
from torch import nn
from torch.fx.experimental import _config as fx_config

from speedrun.config.specs import parse_short_chunks, parse_targets
from speedrun.data.bpb import ByteLUTs
from speedrun.kernels.compile import graphs_compiled
from speedrun.progress import Progress
from speedrun.ttt.base_scores import BaseScores
from speedrun.ttt.documents import (
    SPLIT_STEP_COST_TOKENS,
    batch_cost,
    chunk_size_for,
    deal_batches,
    document_batches,
    split_documents,
    split_heavy_batches,
)
from speedrun.ttt.global_phases import GlobalSettings, finetune, phase_schedule, phase_shapes, row_width
from speedrun.ttt.global_phases import warm_up as warm_up_phases
from speedrun.ttt.graphs import (
    GradSink,
    GraphedChunkSteps,
    InGraphUpdate,
    StepKey,
    StepOut,
    chunk_step,
    pad_rows,
)
from speedrun.ttt.lora import LoRAModel, cast_linear_weights
from speedrun.ttt.optim import AdapterOptimizer, RowSlotsAdam, adapter_optimizer


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


@dataclass(frozen=True)
class LoRASettings:
    """How the adapters learn: what ``ttt.*`` resolves to (speedrun.config.finishing.TTTConfig has each knob's
    meaning)."""

    rank: int
    lr: float
    chunk_size: int
    short_chunks: str = ""
    """Short documents' chunk schedule, "LEN:CHUNK,..." (config.specs.parse_short_chunks); "" = off."""
    targets: str = "all"
    batch_size: int = 1
    """Documents adapted side by side, each with its own adapters."""
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.0
    max_seconds: float | None = None
    """Stop after the chunk that passes this many seconds (the rest unscored, recorded as the fraction scored)."""
    seed: int = 0
    score_base: bool = True
    """Also score each chunk with the unadapted model (base_val_loss, base_val_bpb)."""
    alpha: float | None = None
    """LoRA scaling alpha / rank; None: 1."""
    optimizer: str = "adam"
    """adam (AdamW with beta1, beta2, eps, weight_decay) or sgd (momentum, weight_decay)."""
    eps: float = 1e-8
    momentum: float | None = None
    warm_start_a: bool = False
    """Keep A from one batch to the next of its chain (B still starts at 0); A goes back to its draw after a
    global phase."""
    warm_start_chains: int = 8
    """With warm_start_a: the batches between two global phases are dealt into this many chains, whatever the rank
    count, each on one rank (documents.deal_batches); a batch continues the A of its chain's previous batch. At least
    the rank count."""
    phased: GlobalSettings = GlobalSettings()
    """Phased global TTT (speedrun.ttt.global_phases); off by default."""
    cast_weights: bool = True
    """Under a bf16/fp16 autocast, keep the frozen linears of the adapted copy (and of the unadapted one that scores
    val_bpb_ttt_base) in that dtype, cast once (speedrun.ttt.lora.cast_linear_weights): the same numbers,
    without a cast of every weight at every forward. False: the casts at every call (tests compare the two)."""
    compile: str | None = None
    """torch.compile backend of the adapted and unadapted forwards (inductor; tests use aot_eager), dynamic
    shapes, warmed up before the clock starts; None: eager."""
    compile_scope: str = "blocks"
    """blocks: each block and the head compiled on their own (one small graph that every block reuses, through
    the model's compiled_regions); model: the whole forward as one graph."""
    cuda_graphs: bool = False
    """Replay each step from a CUDA graph, one per step shape, all captured before the clock starts
    (speedrun.ttt.graphs); CUDA only."""
    max_batch_share: float | None = None  # None here: unit tests batch exactly as asked; the config's default is 1/8
    """Halve a batch (by documents) while its cost is more than this share of all batches' (documents.
    split_heavy_batches): a batch of long documents that one rank would work on while the others wait. None: never."""
    row_widths: str = "pow2"
    """The widths a step's rows are padded to (global_phases.row_width): pow2 (64, 128, 256, ...), half_octave
    (64, 96, 128, 192, ...: less padding, twice the shapes to compile and capture) or a number N (multiples of N)."""
    graph_rows: str = "pow2"
    """The row counts a graphed step is padded to (graphs.pad_rows): pow2 or half_octave (3, 6, 12, 24, ...)."""
    shared_attn_a: bool = False
    """One A product for the adapters that read the attention's input (q, k, v, attn_bypass), through the
    attention's adapter hook (speedrun.ttt.lora.InputAdapters): the same arithmetic, x read once."""


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
    shard: Any | None = None,
    record_chunks: bool = False,
    on_clock: Callable[[], None] | None = None,
) -> TTTResult:
    """Score val_tokens with score-first LoRA TTT (see the module doc), learning as ``settings`` say. ``model`` is
    not modified. ``log`` also gets a progress line at most every 30 s (this rank's tokens scored of its share);
    ``shard`` (a World) splits the documents over the ranks. ``on_clock`` is called when TTT's clock starts, after
    the compile warm-up (scripts/ttt_table.py --profile starts its profiler there)."""
    s = settings
    steps = parse_short_chunks(s.short_chunks)
    for size in [s.chunk_size] + [c for _, c in steps]:
        if not 1 <= size <= seq_len:
            raise ValueError(f"TTT chunk sizes must be in [1, seq_len={seq_len}], got {size}")
    if s.batch_size < 1:
        raise ValueError(f"ttt.batch_size must be >= 1, got {s.batch_size}")
    rank, world = (shard.rank, shard.world_size) if shard is not None else (0, 1)
    if s.warm_start_a and not 1 <= world <= s.warm_start_chains:
        raise ValueError(f"ttt.warm_start_chains={s.warm_start_chains} chains cannot keep {world} ranks busy")
    docs = split_documents(val_tokens, bos_id)
    widths, half_rows = _padding(s)
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
    last_phase = max(phases, default=-1)
    sizes = [chunk_size_for(docs[batch[0]][1], s.chunk_size, steps) for batch in batches]
    costs = [cost(batch) for batch in batches]
    owner, chain_of = deal_batches(
        costs, list(phases), world, s.warm_start_chains if s.warm_start_a else 0, [frozen(b) for b in batches]
    )
    share = sum(docs[i][1] for b, batch in enumerate(batches) if owner[b] == rank for i in batch)
    progress = Progress("ttt", log) if log is not None else None

    scale = 1.0 if s.alpha is None else s.alpha / s.rank
    low = autocast_dtype if s.cast_weights and autocast_dtype in (torch.bfloat16, torch.float16) else None
    lora = LoRAModel(
        model, parse_targets(s.targets), s.rank, min(s.batch_size, len(docs)), s.seed, scale, low, s.shared_attn_a
    )
    base_model = model
    if low is not None and s.score_base:  # the unadapted scorer: a copy, so the model passed in stays as it was
        base_model = copy.deepcopy(model)
        cast_linear_weights(base_model, low)
    luts = luts.to(device)
    tokens = val_tokens.to(device)
    if s.compile is not None and log is not None and rank == 0:  # minutes on a large model: say what is going on
        log("ttt: compiling the adapted and unadapted forwards (dynamic shapes), before TTT's clock starts")
    forward, base_forward = _forwards(
        lora, base_model, s, seq_len, steps, device, autocast_dtype, int(tokens.max()) + 1
    )
    if isinstance(forward, _Compiled) and log is not None and rank == 0:
        log(f"ttt: compile warm-up done in {forward.warm_up_seconds:.1f} s")
    warm_up_seconds = forward.warm_up_seconds if isinstance(forward, _Compiled) else 0.0
    stepper = _Stepper(
        forward,
        base_forward if s.score_base else None,
        tokens,
        luts,
        device,
        autocast_dtype,
        mode=mode,
        slots=lora.slots,
        widths=widths,
        half_rows=half_rows,
        pick_width=max([s.chunk_size, *(c for _, c in steps)]),
        bind=lora.bind_rows,
    )
    opt = adapter_optimizer(lora.parameters(), s)  # one for the run, begun anew at every batch
    if s.cuda_graphs:
        t_capture = time.perf_counter()
        # the rows' slots optimizer steps inside the graphs, on the step's own gradients (optim)
        update = cast(InGraphUpdate, opt) if isinstance(opt, RowSlotsAdam) else None
        stepper.graphs = GraphedChunkSteps(stepper.run, lora.parameters(), device, update)
        mine = [b for b in range(len(batches)) if owner[b] == rank]
        stepper.capture([[docs[i] for i in batches[b]] for b in mine], [sizes[b] for b in mine], seq_len)
        warm_up_seconds += time.perf_counter() - t_capture
        if log is not None and rank == 0:
            log(
                f"ttt: {len(stepper.graphs.graphs)} step shapes captured as CUDA graphs in "
                f"{time.perf_counter() - t_capture:.1f} s"
            )
    if s.compile is not None and phases:
        # the global phases' shapes too (they run eagerly): their first call at a shape (cuDNN's attention plans)
        # is paid here, before the clock, as the steps' compile and capture are (compiling the phases as well
        # saved nothing more and took a minute)
        t_phases = time.perf_counter()
        shapes = _phase_shapes(docs, batches, phases, s.phased, seq_len, rank, world)
        with lora.bare() as bare:
            warm_up_phases(bare, shapes, vocab=int(tokens.max()) + 1, device=device, autocast_dtype=autocast_dtype)
        warm_up_seconds += time.perf_counter() - t_phases
        if log is not None and rank == 0:
            log(f"ttt: the global phases' {len(shapes)} shapes warmed up in {time.perf_counter() - t_phases:.1f} s")
    if shard is not None:
        # the ranks' warm-ups differ (by a minute or more); without this, a rank that finished first would count
        # the slowest one's compile in its TTT seconds, waiting for it at the first phase
        shard.barrier()
    graphs0 = graphs_compiled()
    if on_clock is not None:
        on_clock()
    t0 = time.perf_counter()  # TTT's clock (and ttt.max_seconds) starts after every rank's compile warm-up
    deadline = None if s.max_seconds is None else t0 + s.max_seconds
    sums = _Sums(device)
    scored: list[ScoredChunk] | None = [] if record_chunks else None
    docs_done, stopped = 0, False
    busy = 0.0  # this rank's seconds inside its own batches
    glob = _GlobalTotals()
    chains = _ChainsOfA(lora, s.warm_start_a)
    for b, batch in enumerate(batches):
        if stopped and b > last_phase:  # no phase boundary left at which the other ranks wait for this one
            break
        if owner[b] == rank and not stopped:
            t_batch = time.perf_counter()
            chains.enter(chain_of[b])
            stopped = _adapt_batch(
                lora,
                opt,
                [docs[i] for i in batch],
                batch,
                sizes[b],
                sums,
                stepper,
                settings=s,
                seq_len=seq_len,
                deadline=deadline,
                chunk_log=scored,
                progress=progress,
                share=share,
                batch_index=b,
            )
            chains.leave(chain_of[b])
            _sync(device)  # the batch's kernels are done: its time is this rank's own
            busy += time.perf_counter() - t_batch
            if not stopped:
                docs_done += len(batch)
        if b in phases:
            if shard is not None:  # every rank meets here: the phase needs them all, or none goes on
                stopped = bool(shard.max(1.0 if stopped else 0.0))
            if stopped:
                break
            order = _scored(docs, batches, b)
            for boundary in phases[b]:
                if log is not None and rank == 0:
                    log(
                        f"ttt phase {glob.phases + 1}/{s.phased.phases}: fine-tuning on the first {boundary:,} documents scored"
                    )
                with lora.bare() as bare:
                    stats = finetune(
                        bare,
                        tokens,
                        order[:boundary],
                        s.phased,
                        seq_len=seq_len,
                        device=device,
                        autocast_dtype=autocast_dtype,
                        shard=shard,
                        deadline=deadline,
                    )
                glob.add(stats)
                if stats.stopped:
                    stopped = True
                    break
            lora.reset(keep_a=False)  # warm_start_a: A drawn afresh for the fine-tuned model, as the records
            chains.restart()
            if stopped:
                break
    per_rank = torch.zeros(2, world, dtype=torch.float64, device=device)
    per_rank[0, rank] = busy
    per_rank[1, rank] = sum(c for b, c in enumerate(costs) if owner[b] == rank)
    if shard is not None:
        shard.sum_(per_rank)
        counts = torch.tensor([sums.tokens, docs_done], dtype=torch.int64, device=device)
        shard.sum_(sums.nats), shard.sum_(sums.bytes), shard.sum_(sums.base_nats), shard.sum_(counts)
        sums.tokens, docs_done = (int(v) for v in counts.tolist())
        stopped = bool(shard.max(1.0 if stopped else 0.0))
    seconds = time.perf_counter() - t0
    compile_seconds = warm_up_seconds
    recompiles = graphs_compiled() - graphs0
    captured = len(stepper.graphs.graphs) if stepper.graphs is not None else 0
    late = stepper.graphs.late if stepper.graphs is not None else 0
    if shard is not None:  # the slowest rank's, as every count of time here
        seconds, glob.seconds = float(shard.max(seconds) or 0.0), float(shard.max(glob.seconds) or 0.0)
        compile_seconds, recompiles = float(shard.max(compile_seconds) or 0.0), int(shard.max(recompiles) or 0)
        captured, late = int(shard.max(captured) or 0), int(shard.max(late) or 0)
    nats, n_bytes, n_tokens = sums.totals()
    base_nats = float(sums.base_nats.item()) if s.score_base else None
    total = val_tokens.numel() - 1
    if stopped and log:
        log(
            f"ttt: max_seconds={s.max_seconds:g} reached after {seconds:.1f} s; scored {n_tokens:,} of {total:,} tokens"
        )
    return TTTResult(
        val_loss=nats / n_tokens if n_tokens else None,
        val_bpb=nats / math.log(2) / n_bytes if n_bytes else None,
        base_val_loss=base_nats / n_tokens if base_nats is not None and n_tokens else None,
        base_val_bpb=base_nats / math.log(2) / n_bytes if base_nats is not None and n_bytes else None,
        tokens_scored=n_tokens,
        tokens_total=total,
        bytes=n_bytes,
        docs_done=docs_done,
        docs_total=len(docs),
        seconds=seconds,
        complete=n_tokens == total,
        chunks=scored or [],
        phases_done=glob.phases,
        global_steps=glob.steps,
        global_tokens=glob.tokens,
        global_seconds=glob.seconds,
        compile_seconds=compile_seconds,
        recompiles=recompiles,
        cuda_graphs=captured,
        cuda_graphs_late=late,
        rank_seconds=[round(x, 3) for x in per_rank[0].tolist()],
        rank_cost=[round(x, 1) for x in per_rank[1].tolist()],
    )


class _PickedHead:
    """A model's head run at some columns of each row only: the final hidden states and the targets at ``pick``
    ((rows, G) column indices) are gathered first, so a step whose window is 2,048 tokens wide but scores a chunk
    of 48 pays the final norm, the logits, the softcap and the loss (forward and backward) for 48 columns, not
    2,048. Every other column's loss is never read, and its gradient is zero anyway."""

    def __init__(self, head: Callable, pick: torch.Tensor):
        self.head, self.pick = head, pick

    def __call__(self, x: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        x = x.gather(1, self.pick[..., None].expand(-1, -1, x.size(-1)))
        return self.head(x, targets.gather(1, self.pick), reduction)


class _Scorer:
    """A model's per-token nats for TTT: ``scorer(x, y)`` -> (rows, width), or with ``pick`` (rows, G) column
    indices the (rows, G) nats of those columns. Through the model's regions (the protocol's blocks, head and
    compiled_regions: speedrun.model.protocol) the head runs at the picked columns only (_PickedHead), or, for a
    model whose forward takes ``pick`` (supports_pick), the model is asked for those columns (the built-in GPT
    then runs its last layer call there only too); without regions or pick the whole forward runs and the columns
    are taken after. This one runs the module's own blocks and head (eager); _Compiled runs compiled copies."""

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
        with model.compiled_regions(blocks, head if pick is None else _PickedHead(head, pick)):
            return model(x, y, reduction=reduction)


class _Compiled(_Scorer):
    """A module's forward through torch.compile (dynamic shapes), and how long its warm-up took. ``scope`` blocks
    compiles each block and the head apart (as kernel.compile_scope=blocks does for training): the blocks share
    their code, so one small graph serves them all, where the whole model with its repeated layers, adapters and
    both loop passes is one very large graph to trace and lower. ``scope`` model (or a registry model without
    regions) compiles the whole forward, whose head then runs at every column unless the model takes ``pick``."""

    def __init__(self, module: nn.Module, backend: str, scope: str = "blocks"):
        super().__init__(module)
        if scope == "blocks" and self.regions is not None:
            model: Any = module
            blocks = tuple(torch.compile(block, dynamic=True, backend=backend) for block in model.blocks)
            self.regions = (blocks, torch.compile(model.head, dynamic=True, backend=backend))
        else:
            self.regions = None
            self.whole = torch.compile(module, dynamic=True, backend=backend)

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
"""Graphs dynamo may build for one code object (the block's forward) while TTT runs compiled."""


def _forwards(
    lora: LoRAModel,
    model: nn.Module,
    s: LoRASettings,
    seq_len: int,
    steps: list[tuple[int, int]],
    device: str,
    autocast_dtype: torch.dtype | None,
    vocab: int,
) -> tuple[_Scorer, _Scorer]:
    """The adapted and the unadapted scorers: the modules themselves, or (settings.compile) compiled and warmed up
    on random tokens (never validation data) at every chunk size and the full window, with and without gradients,
    as the steps and the base passes call them (the head at a chunk's columns, or at every column), so the graphs
    exist before TTT's clock starts. The warm-up takes no optimizer step: the adapters stay as they were (their
    gradients are dropped)."""
    if s.compile is None:
        return _Scorer(lora.model), _Scorer(model)
    t0 = time.perf_counter()
    forward, base = _Compiled(lora.model, s.compile, s.compile_scope), _Compiled(model, s.compile, s.compile_scope)
    rows = lora.slots  # a full batch; a last, smaller one is another size of the same dynamic graph
    gen = torch.Generator().manual_seed(0)
    chunks = [s.chunk_size, *(c for _, c in steps)]
    for width in sorted({row_width(c, seq_len, _padding(s)[0]) for c in chunks} | {seq_len}):
        x, y = (torch.randint(0, vocab, (rows, width), generator=gen).to(device) for _ in range(2))
        # contiguous, as a step's picks are: an expanded one (stride 0) would be another graph to dynamo
        pick = torch.arange(min(max(chunks), width), device=device).repeat(rows, 1)
        # the adapters' slots bound as the steps bind them (chunk_step): another way would be another graph
        lora.bind_rows(rows)
        _nats(forward, x, y, device, autocast_dtype, pick).float().mean().backward()
        with torch.no_grad():
            lora.bind_rows(rows)
            _nats(forward, x, y, device, autocast_dtype, pick)
            lora.bind_rows(None)
            if s.score_base:  # windows over documents' starts score every column; a later window one chunk
                _nats(base, x, y, device, autocast_dtype)
                _nats(base, x, y, device, autocast_dtype, pick)
                if min(chunks) == 1:  # a chunk of one column: a size-1 dimension is a graph of its own
                    _nats(base, x, y, device, autocast_dtype, pick[:, :1].contiguous())
    for p in lora.parameters():
        p.grad = None
    forward.warm_up_seconds = time.perf_counter() - t0
    return forward, base


class _ChainsOfA:
    """warm_start_a's chains (speedrun.ttt.documents.deal_batches): a batch starts from the A that the previous
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


class _Sums:
    def __init__(self, device: str):
        self.nats = torch.zeros((), dtype=torch.float64, device=device)
        self.base_nats = torch.zeros((), dtype=torch.float64, device=device)
        self.bytes = torch.zeros((), dtype=torch.int64, device=device)
        self.tokens = 0

    def totals(self) -> tuple[float, int, int]:
        return float(self.nats.item()), int(self.bytes.item()), self.tokens


@dataclass
class _GlobalTotals:
    phases: int = 0
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, stats: Any) -> None:
        self.phases += 1
        self.steps += stats.steps
        self.tokens += stats.tokens
        self.seconds += stats.seconds


def _scored(docs: list[tuple[int, int]], batches: list[list[int]], b: int) -> list[tuple[int, int]]:
    """The documents scored up to batch b included, in scoring order: what a phase after batch b trains on."""
    return [docs[i] for done in batches[: b + 1] for i in done]


def _phase_shapes(
    docs: list[tuple[int, int]],
    batches: list[list[int]],
    phases: dict[int, list[int]],
    settings: GlobalSettings,
    seq_len: int,
    rank: int,
    world: int,
) -> set[tuple[int, int]]:
    """(rows, width) of every forward this rank's global phases will run (global_phases.phase_shapes)."""
    return {
        shape
        for b, boundaries in phases.items()
        for boundary in boundaries
        for shape in phase_shapes(_scored(docs, batches, b)[:boundary], settings, seq_len, rank, world)
    }


def _nats(
    model: Callable,
    x: torch.Tensor,
    y: torch.Tensor,
    device: str,
    autocast_dtype: torch.dtype | None,
    pick: torch.Tensor | None = None,
) -> torch.Tensor:
    """A scorer's (_Scorer) nats under the autocast: (rows, width), or at ``pick``'s columns (rows, G)."""
    if autocast_dtype is None:
        return model(x, y, reduction="none", pick=pick)
    with torch.autocast(device, dtype=autocast_dtype):
        return model(x, y, reduction="none", pick=pick)


def _to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """A small host tensor on the device without a host sync: copied from pageable memory, the host would wait for
    every kernel queued before it; from pinned memory the copy queues behind them, and the host goes on launching
    (eager TTT is launch-bound: the GPU sat idle 40% of a profiled run)."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _pinned(t: torch.Tensor, device: str) -> torch.Tensor:
    """A host tensor in pinned memory (on a CUDA run), so that copying it to the device does not wait for the
    kernels queued before it (_to_device)."""
    return t.pin_memory() if torch.device(device).type == "cuda" else t


def _rows_for(going: int, n_docs: int, mode: str, slots: int, half_rows: bool = False) -> int:
    """Rows a step runs: eager, one per document of the batch (eager flex compiles per shape); compiled, the
    documents still going, at least 2 (dynamic shapes: a size-1 dimension would be specialized into graphs of its
    own); graphed, that padded to a power of two, or with ``half_rows`` a half octave (graphs.pad_rows: a few
    shapes to capture)."""
    if mode == "graphs":
        return pad_rows(going, slots, half_rows)
    return max(going, min(2, slots)) if mode == "compact" else n_docs


def _padding(s: LoRASettings) -> tuple[str, bool]:
    """(ttt.row_widths, whether ttt.graph_rows pads graphed steps' rows to half octaves), checked."""
    if not (s.row_widths in ("pow2", "half_octave") or (s.row_widths.isdigit() and int(s.row_widths) >= 16)):
        raise ValueError(f"ttt.row_widths must be pow2, half_octave or a multiple like 128, got {s.row_widths!r}")
    if s.graph_rows not in ("pow2", "half_octave"):
        raise ValueError(f"ttt.graph_rows must be pow2 or half_octave, got {s.graph_rows!r}")
    return s.row_widths, s.graph_rows == "half_octave"


def _steps(
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
        rows = _rows_for(going, len(docs), mode, slots, half_rows)
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


def _longest_first(docs: list[tuple[int, int]], chunk: int) -> list[int]:
    return sorted(range(len(docs)), key=lambda i: -math.ceil(docs[i][1] / chunk))  # stable: ties keep order


@dataclass
class _Stepper:
    """How _adapt_batch runs a step (graphs.chunk_step): directly, or replayed from CUDA graphs."""

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
        return _nats(fn, x, y, self.device, self.autocast_dtype, pick)

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
                _rows_for(n, self.slots, self.mode, self.slots, self.half_rows) if self.mode != "eager" else self.slots
            ),
            pinned=torch.device(self.device).type == "cuda",
            widths=self.widths,
        )

    def step(self, table: list[list[int]], key: StepKey) -> StepOut:
        rows = torch.tensor(table, dtype=torch.int64)
        if self.graphs is not None:
            return self.graphs.step(_pinned(rows, self.device), key)
        return self.run(_to_device(rows, self.device), key)

    def capture(self, batches: list[list[tuple[int, int]]], chunk_sizes: list[int], seq_len: int) -> None:
        """Capture, before the clock starts, every step shape that these batches (this rank's) will run."""
        assert self.graphs is not None
        keys = set()
        for docs, chunk in zip(batches, chunk_sizes):
            ordered = [docs[i] for i in _longest_first(docs, chunk)]
            for _, table, width, training in _steps(
                ordered, chunk, seq_len, self.mode, self.slots, self.widths, self.half_rows
            ):
                keys.add((len(table[0]), width, training))
        self.graphs.prepare(
            keys, lambda key: torch.tensor([[0] * key[0], [key[1]] * key[0], [0] * key[0], [1] * key[0]])
        )


def _adapt_batch(
    lora: LoRAModel,
    opt: AdapterOptimizer,
    docs: list[tuple[int, int]],
    doc_ids: list[int],
    chunk: int,
    sums: _Sums,
    stepper: _Stepper,
    *,
    settings: LoRASettings,
    seq_len: int,
    deadline: float | None,
    chunk_log: list[ScoredChunk] | None,
    progress: Progress | None = None,
    share: int = 0,
    batch_index: int = 0,
) -> bool:
    """Score-first TTT of one batch of documents (all with chunk size ``chunk``). True if the deadline hit.

    The documents take the adapter slots longest first, so at every step the documents not yet done are the first
    rows. Eager, a step runs one row per document of the batch at one padded width (documents that are done are all
    padding: unscored, untrained), so the shapes stay few: the batch size (smaller only for a last, short batch)
    times a handful of widths. Compiled (dynamic shapes: any row count of at least 2 runs on the warm-up's graphs),
    a step runs only the rows still going, at least 2: a batch's long tail, one long document and many done, no
    longer costs a full batch of padding per step. With CUDA graphs, that row count padded to a power of two. The
    documents that are done would get zero gradients either way; the optimizer (speedrun.ttt.optim) steps
    the rows' slots only where that leaves the adapters as a step of every slot would (Adam with beta1 = 0). The
    unadapted scores of the batch's chunks (val_bpb_ttt_base) come from speedrun.ttt.base_scores, each counted
    when its chunk is scored. The time budget is checked before every step but the first: a batch begun scores at
    least its chunks 0."""
    if deadline is not None and time.perf_counter() > deadline:
        return True
    lora.reset(keep_a=settings.warm_start_a)
    opt.begin()
    try:
        order = _longest_first(docs, chunk)
        docs, doc_ids = [docs[i] for i in order], [doc_ids[i] for i in order]
        base = stepper.base_scores(docs, chunk, seq_len)
        for k, table, width, training in _steps(
            docs, chunk, seq_len, stepper.mode, stepper.slots, stepper.widths, stepper.half_rows
        ):
            if k > 0 and deadline is not None and time.perf_counter() > deadline:  # a batch begun scores its chunk 0
                return True
            if training and stepper.graphs is None:
                opt.zero_grad()  # a graphed step writes its gradients (or steps) itself
            out = stepper.step(table, (len(table[0]), width, training))
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
