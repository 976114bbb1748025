"""The training step and loop: train() steps until a budget (seconds, steps, tokens or FLOPs) is spent; warm_up()
before it; Stepper is one optimizer step; TrainSettings is all of the run they read.

Budgets, whichever ends first: each budget gives a fraction of itself used; the run's progress is the largest of
them, so the LR warm-up and warm-down and the progressive context stages follow whichever budget governs the run,
and the budget whose fraction reaches 1 ends it (recorded as ``budget_end``: time, steps, tokens or flops). Tokens
and FLOPs mean the same amount of training on any card; FLOPs follow the MFU convention (ModelShape.flops_per_token
at the seq_len of the stage each token was trained in). A time limit also ends the run a step early when the next
step, at the mean pace so far, would end past it; the clock is read without a device sync, so work still queued on
the GPU at the end can add a little. The clock counts train seconds only: periodic validation and checkpoint writes
pause it, and a resumed run starts it at the elapsed train seconds of its checkpoint.

Warm-up steps (compilation, autotuning) run before the clock starts and are undone afterwards (model and
optimizer state restored), so train_seconds measures training alone and the warm-up does not leak updates.

Dense training metrics without host syncs: every step's loss is copied into a slot of a small device buffer (an
asynchronous device-side copy, so no step waits for the host); the buffer is read with a single transfer when it is
full (logger.flush_every_steps), at a progress line, before a periodic validation or checkpoint, and at the end.
That read is also where a non-finite loss is noticed, so a divergence stops the run at most flush_every_steps steps
late. The copy into a preallocated slot, rather than keeping each step's loss tensor, is deliberate: a step
replayed from a CUDA graph returns the same output tensor every time, overwritten by the next replay. Each train
record is ``{"step", "tokens", "train_loss", "lr_mult", "elapsed_s"}`` for every step (logger.dense=true) or for
the last step of each flush; the record of a step that printed a progress line also has ``tokens_per_s`` and
``progress``. ``elapsed_s`` is train seconds as the host saw them when it queued the step.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from speedrun.core.compile import GraphedMicroStep, graphs_compiled, keeps_grads
from speedrun.core.dist import SINGLE
from speedrun.core.model import ModelShape
from speedrun.core.optim import (
    EMASettings,
    OptimSettings,
    Schedule,
    WeightEMA,
    lr_multiplier,
    muon_momentum,
    set_lr_multiplier,
    set_muon_momentum,
)
from speedrun.progress import Report


@dataclass(frozen=True)
class Stage:
    """One context length of the training schedule."""

    seq_len: int
    until: float
    """Train at this length until this fraction of the budget (time or steps, per TrainSettings.stage_progress)."""
    micro_batch: int
    """Sequences per micro-batch at this length (micro-batch tokens stay constant across stages)."""


@dataclass(frozen=True)
class BudgetSettings:
    """The run's budgets, whichever ends first; None is "no limit" for each."""

    seconds: float | None
    """Train seconds, GPTQ's Hessians after the loop included."""
    steps: int | None
    tokens: int | None
    flops: float | None
    hessian_reserve: float | None = 0.0
    """Seconds of ``seconds`` kept for GPTQ's Hessians (None: measured in warm-up)."""

    def loop_seconds(self, reserve: float) -> float | None:
        """The training loop's own time limit, given the reserve that applies (hessian_reserve, or the measured)."""
        return None if self.seconds is None else self.seconds - reserve


@dataclass(frozen=True)
class StepKernel:
    """How the step runs: torch.compile's mode (a graphing mode keeps gradients allocated) and CUDA graphs."""

    compile_mode: str = "default"
    cuda_graphs: bool = False


@dataclass(frozen=True)
class LogSettings:
    log_every_seconds: float = 10.0
    """Seconds between progress lines."""
    flush_every_steps: int = 100
    """Steps between copies of the buffered losses to the host."""
    dense: bool = True
    """A train record for every step (else one per flush)."""


@dataclass(frozen=True)
class TrainSettings:
    """All the step and the loop read. The fields are named as the Plan's (speedrun.plan.types.Plan), so the shell
    builds it with speedrun.plan.settings.settings(TrainSettings, plan) and a Plan also reads as one."""

    device: str
    autocast: str | None
    """bf16 or fp16 autocast, None: fp32."""
    grad_scaler: bool
    grad_accum: int
    tokens_per_step: int
    warmup_steps: int
    compile: bool
    stages: tuple[Stage, ...]
    stage_progress: str
    """time or step: what Stage.until measures."""
    budget: BudgetSettings
    model: ModelShape
    attn_options: tuple[tuple[str, Any], ...] = ()
    """The attention backend's options (a window shortens the FLOPs a token costs)."""
    schedule: Schedule = Schedule()
    optim: OptimSettings = OptimSettings()
    ema: EMASettings = EMASettings()
    kernel: StepKernel = StepKernel()
    logger: LogSettings = LogSettings()
    target_metric: str | None = None
    """A periodic evaluation's metric that ends training when it reaches its target (None: the budgets alone)."""


def autocast_dtype(autocast: str | None) -> torch.dtype | None:
    """The torch dtype of an autocast name (None: no autocast, fp32). fp8 runs autocast to bf16 around their fp8
    linears, and evaluate in bf16."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(autocast or "")


def flops_per_token(s: TrainSettings, seq_len: int, looped: bool = False) -> int:
    """FLOPs per token of the model trained at ``seq_len`` (``looped``: with model.loop on), its attention window
    applied: what budget.flops counts step by step and what MFU divides, so the two never disagree."""
    window = dict(s.attn_options).get("window")
    return s.model.flops_per_token(min(seq_len, window) if window else seq_len, looped=looped)


BUDGET_KINDS = ("time", "steps", "tokens", "flops")


class Budget:
    """The budgets of a Plan and the progress they make together."""

    def __init__(
        self,
        train_seconds: float | None,
        max_steps: int | None = None,
        tokens: int | None = None,
        flops: float | None = None,
    ):
        self.limits = {
            "time": train_seconds if train_seconds is not None and math.isfinite(train_seconds) else None,
            "steps": max_steps,
            "tokens": tokens,
            "flops": flops,
        }

    @classmethod
    def of(cls, budget: BudgetSettings, hessian_reserve: float) -> Budget:
        """The training loop's budgets: the settings', with ``hessian_reserve`` seconds of the time limit left for
        GPTQ's Hessians after the loop (the plan's fixed reserve, or the one warm-up measured)."""
        return cls(budget.loop_seconds(hessian_reserve), budget.steps, budget.tokens, budget.flops)

    def fractions(self, seconds: float, steps: int, tokens: int, flops: float) -> dict[str, float]:
        """The used fraction of each budget that is set."""
        used = {"time": seconds, "steps": steps, "tokens": tokens, "flops": flops}
        return {k: used[k] / limit for k, limit in self.limits.items() if limit}

    def progress(self, seconds: float, steps: int, tokens: int, flops: float) -> float:
        """The fraction of the run done: the largest fraction of any budget (0 when no budget is set)."""
        return max(self.fractions(seconds, steps, tokens, flops).values(), default=0.0)

    def next_step_passes_time(self, seconds: float, step_seconds: float) -> bool:
        """Whether a step of ``step_seconds`` started now would end past the time limit: the loop stops before it,
        so train_seconds stays within budget.train_seconds (a contest's limit) instead of passing it by a step."""
        limit = self.limits["time"]
        return limit is not None and step_seconds > 0 and seconds + step_seconds > limit

    def ended_by(self, seconds: float, steps: int, tokens: int, flops: float) -> str | None:
        """The budget that ends the run at this point (the first spent one, in BUDGET_KINDS order when several
        are spent at once), or None while none is spent."""
        spent = [k for k, f in self.fractions(seconds, steps, tokens, flops).items() if f >= 1.0]
        return min(spent, key=BUDGET_KINDS.index) if spent else None

    def stage_fraction(self, own: str, seconds: float, steps: int, tokens: int, flops: float) -> float:
        """Where the progressive stages stand: the schedule's own measure (``time`` of train_seconds, ``step`` of
        max_steps), never behind the run's progress, so whichever budget ends the run also drives the stages."""
        fr = self.fractions(seconds, steps, tokens, flops)
        mine = fr.get("time" if own == "time" else "steps", 0.0)
        return max(mine, self.progress(seconds, steps, tokens, flops))


class StepPace:
    """The mean seconds of this process's training steps so far (from its second step on: the first may still
    meet a new shape), on the loop's agreed clock: what Budget.next_step_passes_time is asked with."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.steps = 0

    def add(self, seconds: float) -> None:
        """A step ended at ``seconds`` of train time."""
        if self.first is None:
            self.first = seconds
        else:
            self.steps += 1
        self.last = seconds

    def mean(self) -> float:
        if self.first is None or self.steps == 0:
            return 0.0
        return (self.last - self.first) / self.steps


class Clock:
    """Train seconds: wall time that can be paused (validation, checkpoints) and started at an offset (resume)."""

    def __init__(self, start_seconds: float = 0.0):
        self._t0 = time.perf_counter() - start_seconds
        self.paused_seconds = 0.0
        """Wall seconds spent paused (what periodic validation and checkpoints took)."""

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - t
            self._t0 += spent
            self.paused_seconds += spent


class LossBuffer:
    def __init__(self, device: str, capacity: int):
        self.capacity = capacity
        self._values = torch.zeros(capacity, dtype=torch.float32, device=device)
        self._meta: list[tuple[int, int, float, float]] = []  # step, tokens, lr_mult, elapsed_s

    @property
    def full(self) -> bool:
        return len(self._meta) >= self.capacity

    def __len__(self) -> int:
        return len(self._meta)

    def add(self, loss: torch.Tensor, step: int, tokens: int, lr_mult: float, elapsed: float) -> None:
        """Queue one step's loss (a device tensor); nothing waits for the device."""
        self._values[len(self._meta)].copy_(loss.detach(), non_blocking=True)
        self._meta.append((step, tokens, lr_mult, elapsed))

    def flush(self) -> list[dict[str, Any]]:
        """The buffered steps as train records, oldest first (one device-to-host transfer), and the buffer emptied."""
        if not self._meta:
            return []
        values = self._values[: len(self._meta)].tolist()
        records = [
            {
                "step": step,
                "tokens": tokens,
                "train_loss": value,
                "lr_mult": round(lr, 6),
                "elapsed_s": round(elapsed, 3),
            }
            for (step, tokens, lr, elapsed), value in zip(self._meta, values)
        ]
        self._meta.clear()
        return records


DIVERGENCE_MARGIN = 1.0
"""Nats the end-of-training loss may sit above its first loss or ln(vocab) before the run counts as diverged. A
fresh model starts near uniform (its first loss is about ln(vocab)) and a few steps on small batches move the loss
by half a nat either way (2 steps of 256 tokens, tests/run/test_run_outcomes.py: 6.93 -> 7.50), so a short run must not
be judged to the hundredth; a run that went wrong ends whole nats above (3 steps of pgolf_baseline on CPU: 6.9 ->
15.0)."""
EARLY_MARGIN = 4.0
"""The margin for a run judged before it has SMOOTH_STEPS steps after its first: the first few steps of a small
model at a full learning rate bounce by a nat or more (a 2 s CPU sweep job of the tiny preset: 6.92 -> 8.20 at step
2), while a blow-up is many nats (pgolf_baseline for 10 s on a CPU: 6.9 -> 15.0 in 3 steps)."""
SMOOTH_STEPS = 10
"""The end of training is judged on the mean of the last this many steps' losses (the first step excluded), and
on the last step's alone: both must be above, so neither one noisy last batch nor a spike just before it decides."""


@dataclass(frozen=True)
class Divergence:
    step: int
    """The first non-finite step, or for a run that ended badly its last step (where the verdict was taken)."""
    reason: str
    """One line, for the run's error."""


def non_finite(losses: Sequence[float], start_step: int = 1) -> Divergence | None:
    """The first step whose loss is not finite (``losses`` are consecutive steps from ``start_step``), or None."""
    bad = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
    if bad is None:
        return None
    return Divergence(start_step + bad, f"non-finite training loss ({losses[bad]}) at step {start_step + bad}")


def divergence(
    losses: Sequence[float],
    vocab_size: int,
    *,
    start_step: int = 1,
    first: tuple[int, float] | None = None,
) -> Divergence | None:
    """The divergence verdict on a run's training losses; None for a run that did not diverge.

    ``losses`` are consecutive steps' losses, oldest first, the first at ``start_step``, ending at the run's last
    step: the whole run, or (the training loop) its last SMOOTH_STEPS. ``first`` is (step, loss) of the run's first
    logged loss when ``losses`` does not begin with it.

    Diverged: a loss is not finite; or, at the end of a run of two steps or more, both the mean of the last
    SMOOTH_STEPS losses after the first step and the last loss are more than DIVERGENCE_MARGIN (EARLY_MARGIN in a
    run shorter than SMOOTH_STEPS steps after its first) above the first logged loss, or above ln(vocab_size)
    (uniform guessing). Only the end counts: a loss that rises for a while and
    comes back down is training.
    """
    found = non_finite(losses, start_step)
    if found is not None or not losses:
        return found
    first_step, first_loss = first if first is not None else (start_step, losses[0])
    end_step = start_step + len(losses) - 1
    after = [x for i, x in enumerate(losses) if start_step + i > first_step]
    if not after:  # one step: the end is the start, nothing trained yet to judge
        return None
    window = after[-SMOOTH_STEPS:]
    smoothed, last = sum(window) / len(window), window[-1]
    end = min(smoothed, last)
    uniform = math.log(vocab_size)
    margin = DIVERGENCE_MARGIN if len(after) >= SMOOTH_STEPS else EARLY_MARGIN
    rose, above_uniform = end > first_loss + margin, end > uniform + margin
    if not (rose or above_uniform):
        return None
    head = f"training loss rose from {first_loss:.4f} at step {first_step} to" if rose else "training loss ended at"
    if len(window) > 1:
        reason = f"{head} {smoothed:.4f} (mean of steps {end_step - len(window) + 1}-{end_step}, last {last:.4f})"
    else:
        reason = f"{head} {last:.4f} at step {end_step}"
    if above_uniform:
        reason += f", above ln({vocab_size}) = {uniform:.4f} (uniform guessing)"
    return Divergence(end_step, reason)


def progress_line(record: dict[str, Any], frac: float, train_seconds: float, log: Callable[[str], None]) -> None:
    """Add tokens_per_s and progress to the record of the step being reported, and print the progress line."""
    tok_s = record["tokens"] / train_seconds if train_seconds > 0 else 0.0
    eta = train_seconds / frac - train_seconds if 0 < frac < 1 else 0.0
    record.update(elapsed_s=round(train_seconds, 3), tokens_per_s=round(tok_s, 1), progress=round(min(frac, 1.0), 4))
    log(
        f"step {record['step']:>6}  loss {record['train_loss']:.4f}  lr x{record['lr_mult']:.2f}  {tok_s:,.0f} tok/s  "
        f"elapsed {train_seconds:.0f}s  eta {eta:.0f}s"
    )


Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class TrainState:
    """Progress so far; the runner reads it to record a run that was interrupted or failed mid-way."""

    steps: int = 0
    tokens: int = 0
    train_seconds: float = 0.0
    compile_seconds: float = 0.0
    last_loss: float | None = None
    diverged: bool = False
    """Training went wrong (speedrun.core.train.divergence): a non-finite loss (the loop stops at the flush that sees
    it), or at the end a loss above its first one or above uniform guessing. The runner records status diverged
    and does not evaluate."""
    diverged_step: int | None = None
    """The first non-finite step, or the last step for a run that ended badly."""
    divergence: str | None = None
    """Why the run diverged, one line (the run's error)."""
    first_loss: float | None = None
    """The run's first logged training loss (what its end is compared with) and its step."""
    first_loss_step: int | None = None
    recent_losses: list[float] = field(default_factory=list)
    """The training losses of the last metrics.SMOOTH_STEPS steps up to ``steps``, oldest first (plain floats, so a
    checkpoint keeps them and a resumed run judges its end on the same losses)."""
    stages: list[dict[str, Any]] = field(default_factory=list)
    """Each context stage that ran: seq_len, start_step, start_seconds."""
    recompiles: int | None = None
    """Graphs dynamo compiled during timed training (0 when warm-up covered every shape); None until it ends."""
    flops: float = 0.0
    """Model FLOPs trained so far (MFU convention, each step at its stage's seq_len): what budget.flops counts."""
    stage_index: int = -1
    """Index into TrainSettings.stages of the stage running (-1 before the first step)."""
    stage_start_step: int = 0
    position: int = 0
    """Token position of the training stream after the last step (what a checkpoint resumes from)."""
    budget_end: str | None = None
    """The budget that ended training: time, steps, tokens or flops, or target (budget.target_*: a periodic
    evaluation reached it); None: stopped otherwise."""
    target_steps: int | None = None
    """Steps, tokens and train seconds (evaluations excluded) at the periodic evaluation that first reached
    budget.target_* (None: not reached, or no target)."""
    target_tokens: int | None = None
    target_seconds: float | None = None
    val_seconds_periodic: float = 0.0
    """Wall seconds of periodic validation (kept out of train_seconds)."""
    checkpoint_seconds: float = 0.0
    """Wall seconds spent writing checkpoints (kept out of train_seconds)."""
    hessian_reserve_seconds: float = 0.0
    """Seconds of the time budget left after the loop for GPTQ's Hessians (the settings's, or measured in warm-up);
    a checkpoint keeps it, so a resumed run stops its loop where the original would have."""


class Stepper:
    """One optimizer step: grad accumulation over micro-batches, autocast, GradScaler, clipping. On several ranks
    (``world``, speedrun.distributed.world) each runs its own micro-batches; gradients and the loss are averaged over them.

    ``ema`` (settings.ema on): the weights' moving average (speedrun.core.optim.WeightEMA), started from the weights the
    Stepper is made with (those warm-up restores); train() updates it after each timed step, never warm-up's."""

    def __init__(
        self, model: torch.nn.Module, forward: Callable, optimizers: list, settings: TrainSettings, world: Any = None
    ):
        self.model, self.forward, self.optimizers, self.settings = model, forward, optimizers, settings
        decay = settings.ema.decay
        self.ema = WeightEMA(model, decay) if decay else None  # None or 0.0: off
        self.world = world or SINGLE
        dtype = autocast_dtype(settings.autocast)
        # a captured graph must not keep autocast's cache of cast weights (torch.cuda.graph's docs)
        cache = not settings.kernel.cuda_graphs
        self.autocast = (
            (lambda: torch.autocast(settings.device, dtype=dtype, cache_enabled=cache))
            if dtype
            else contextlib.nullcontext
        )
        self.scaler = torch.amp.GradScaler("cuda") if settings.grad_scaler else None
        # CUDA graphs accumulate into .grad tensors that must outlive each step (zeroed in place, never freed)
        self.keep_grads = keeps_grads(settings.compile, settings.kernel.compile_mode, settings.kernel.cuda_graphs)
        self.micro: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._micro_step
        if settings.kernel.cuda_graphs:
            self.micro = GraphedMicroStep(self._micro_step, settings.device)

    def _micro_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and (scaled) backward of one micro-batch on the device; returns its share of the step's loss."""
        with self.autocast():
            loss = self.forward(x, y)
        scaled = loss / self.settings.grad_accum
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        return scaled.detach()

    def __call__(self, batches: Iterator[Batch]) -> torch.Tensor:
        """Run one step; returns the mean micro-batch loss as a device tensor (no host sync)."""
        total = None
        graphed = self.settings.kernel.cuda_graphs
        for _ in range(self.settings.grad_accum):
            x, y = next(batches)
            if not graphed:  # the graphed step copies host batches into its static buffers itself
                x = x.to(self.settings.device, non_blocking=True)
                y = y.to(self.settings.device, non_blocking=True)
            part = self.micro(x, y)
            # clone: a replayed graph's loss is overwritten by the next replay
            total = part.clone() if total is None else total + part
        self.world.sync_grads(list(self.model.parameters()))
        if self.scaler is not None:
            for opt in self.optimizers:
                self.scaler.unscale_(opt)
        if self.settings.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.optim.grad_clip)
        for opt in self.optimizers:
            if self.scaler is not None:
                self.scaler.step(opt)
            else:
                opt.step()
        if self.scaler is not None:
            self.scaler.update()
        self.model.zero_grad(set_to_none=not self.keep_grads)
        assert total is not None
        return self.world.mean(total)


def sync_device(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _diverged(state: TrainState, found: Divergence) -> None:
    state.diverged, state.diverged_step, state.divergence = True, found.step, found.reason


MakeBatches = Callable[..., Iterator[Batch]]
"""make_batches(seq_len, micro_batch, position) -> a stream of micro-batches (speedrun.core.pipeline.DataBundle.train_batches)."""


def _set_loop(model: Any, on: bool) -> None:
    model.set_loop(on)  # GPT.set_loop: model.loop on or off (a no-op for a model without one)


def trained_shapes(settings: TrainSettings) -> list[tuple[int, bool]]:
    """The (context stage index, layer loop on) pairs training will run, in order. The stage and the loop follow
    one fraction of the budget (_Loop.step), so a stage that ends before model.loop.enable_at never runs looped and
    one that starts after it never unlooped: warm-up compiles the pairs that occur, not every stage in both states."""
    stages, loop = settings.stages, settings.model.loop
    cuts = sorted({0.0, 1.0, *(min(1.0, st.until) for st in stages), *([loop.enable_at] if loop.on else [])})
    fracs = [*cuts, *((a + b) / 2 for a, b in zip(cuts, cuts[1:]))]  # each piece of the budget, and its ends
    stage_at = [next((i for i, st in enumerate(stages) if f < st.until), len(stages) - 1) for f in fracs]
    return sorted({(i, bool(_loop_due(settings, f))) for i, f in zip(stage_at, fracs)})


def _loop_due(settings: TrainSettings, stage_frac: float) -> bool | None:
    """Whether model.loop should be on at this point of the budget (None: the model has no loop). The fraction is
    the context stages' (Budget.stage_fraction), so the loop follows whichever budget governs the run."""
    loop = settings.model.loop
    return stage_frac >= loop.enable_at if loop.on else None


def _switch_loop(stepper: Stepper, state: TrainState, on: bool, seconds: float, log: Callable[[str], None]) -> int:
    """Switch the model's loop (a Python attribute the compiled graphs specialise on: both were compiled in
    warm-up, so no recompile), record a stage entry with ``loop: true`` from this step (speedrun.run.mfu charges
    its tokens the looped FLOPs) unless the current entry already has it (a resumed run); -> the step's FLOPs."""
    settings = stepper.settings
    _set_loop(stepper.model, on)
    seq_len = settings.stages[state.stage_index].seq_len
    if on and state.stages and not state.stages[-1].get("loop"):
        state.stages.append(
            {"seq_len": seq_len, "start_step": state.steps, "start_seconds": round(seconds, 3), "loop": True}
        )
        loop = settings.model.loop
        log(
            f"layer loop on from step {state.steps}: layers {loop.start}-{loop.end} x {1 + loop.num}, "
            f"{settings.model.layer_passes(True)} layer calls per forward"
        )
    return settings.tokens_per_step * flops_per_token(settings, seq_len, looped=on)


def warm_up(
    stepper: Stepper,
    make_batches: MakeBatches,
    state: TrainState,
    log: Callable[[str], None],
    time_steps: bool = False,
) -> dict[tuple[int, bool], float]:
    """Compile and autotune with TrainSettings.warmup_steps real steps at every context length of the settings, in
    each layer-loop state training will run at that length (trained_shapes), then restore the initial model and
    optimizer state, so training starts from the same weights whatever the warm-up did. ``time_steps``: one more
    step of each, timed (compiled by then), returned as {(stage index, loop on): seconds}, what
    speedrun.run.run_steps projects a time budget's steps from."""
    steps = stepper.settings.warmup_steps
    timed: dict[tuple[int, bool], float] = {}
    if steps <= 0:
        return timed
    saved_model = copy.deepcopy(stepper.model.state_dict())
    saved_opts = [copy.deepcopy(opt.state_dict()) for opt in stepper.optimizers]
    saved_scaler = copy.deepcopy(stepper.scaler.state_dict()) if stepper.scaler else None
    stages = stepper.settings.stages
    shapes = trained_shapes(stepper.settings)
    looping = stepper.settings.model.loop.on
    if looping:
        named = ", ".join(f"{stages[i].seq_len} loop {'on' if on else 'off'}" for i, on in shapes)
        log(f"warm-up: {steps} step(s) x {len(shapes)} (context length, layer loop) pair(s) training runs ({named}) "
            "to compile and autotune (not timed)")  # fmt: skip
    else:
        log(f"warm-up: {steps} step(s) x {len(stages)} context length(s) to compile and autotune (not timed)")
    t0 = time.perf_counter()
    streams: dict[int, Any] = {}
    for index, looped in shapes:
        if index not in streams:
            streams[index] = make_batches(stages[index].seq_len, stages[index].micro_batch)
        batches = streams[index]
        if looping:
            _set_loop(stepper.model, looped)
        for _ in range(steps):
            stepper(batches)
        if time_steps:
            sync_device(stepper.settings.device)
            t = time.perf_counter()
            stepper(batches)
            sync_device(stepper.settings.device)
            timed[(index, looped)] = time.perf_counter() - t
    if looping:
        _set_loop(stepper.model, False)  # train() switches it when the budget says
    sync_device(stepper.settings.device)
    state.compile_seconds = time.perf_counter() - t0
    stepper.model.load_state_dict(saved_model)
    for opt, saved in zip(stepper.optimizers, saved_opts):
        opt.load_state_dict(saved)
    if stepper.scaler and saved_scaler:
        stepper.scaler.load_state_dict(saved_scaler)
    log(f"warm-up done in {state.compile_seconds:.1f}s")
    return timed


def train(
    stepper: Stepper,
    make_batches: MakeBatches,
    *,
    state: TrainState,
    log: Callable[[str], None],
    on_metrics: Callable[[dict[str, Any]], None],
    between_steps: Any = None,
) -> TrainState:
    """Train until a budget is spent (speedrun.core.train: time, steps, tokens or FLOPs, whichever first) or the loss
    goes non-finite; a run whose loss ends above where it started or above uniform guessing is diverged too
    (state.diverged, speedrun.core.train.divergence). ``state`` may come from a checkpoint: the loop continues where
    it stopped.

    Context stages switch when their fraction of the budget (time or steps, never later than whichever budget
    ends the run) is used up; the new stream continues at the token where the previous one stopped, and the LR
    re-warms over schedule.rewarmup_steps. Losses stay on the device until a flush. ``between_steps``
    (Hooks.between_steps: speedrun.run.periodic.LoopExtras) runs periodic validation and checkpoints between steps
    with the clock paused, and turns a stop signal into a checkpoint at the end of the step.

    With settings.ema on, the weights' average is updated after every step, and a run that did not diverge returns
    with the average in the model (as the record's train_model does), so evaluation and export use it.
    """
    extras = between_steps
    loop = _Loop(stepper, make_batches, state, log, on_metrics, extras)
    if extras is not None:
        extras.start()
    with extras.deferring() if extras is not None else contextlib.nullcontext():
        while loop.step():
            pass
    loop.end()
    return state


class _Loop:
    """train()'s state between steps: the budget and its clock, the stream of the current context stage, the losses
    not yet flushed. On several ranks every decision (stop, LR, context stage, when to flush and log, periodic
    validation and checkpoints) is taken on rank 0's clock, broadcast after each step, so all ranks run the same
    steps and stop together (one small collective per step, which also carries a stop signal that reached any rank;
    nothing on one process)."""

    def __init__(
        self,
        stepper: Stepper,
        make_batches: MakeBatches,
        state: TrainState,
        log: Callable[[str], None],
        on_metrics: Callable[[dict[str, Any]], None],
        extras: Any,
    ):
        self.stepper, self.make_batches, self.state, self.log = stepper, make_batches, state, log
        self.on_metrics, self.extras = on_metrics, extras
        self.settings = settings = stepper.settings
        self.budget, self.clock = Budget.of(settings.budget, state.hessian_reserve_seconds), Clock(state.train_seconds)
        self.pace = StepPace()
        self.losses = LossBuffer(settings.device, settings.logger.flush_every_steps)
        self.batches: Any = None
        self.step_flops = 0.0
        self.graphs_before = graphs_compiled()
        self.agree = stepper.world.agree
        self.seconds = self.agree(self.clock.elapsed())
        self.next_log = self.seconds + min(settings.logger.log_every_seconds, 2.0)  # on the agreed clock

    def used(self, seconds: float) -> tuple[float, int, int, float]:
        return seconds, self.state.steps, self.state.tokens, self.state.flops

    def ended(self) -> bool:
        """Whether training ends before another step, saying why in state.budget_end."""
        state, budget, used = self.state, self.budget, self.used(self.seconds)
        if state.target_steps is not None:  # resumed from the checkpoint of a run that had reached its target
            state.budget_end = "target"
        elif budget.progress(*used) >= 1.0:
            state.budget_end = budget.ended_by(*used)
        elif budget.next_step_passes_time(self.seconds, self.pace.mean()):
            state.budget_end = "time"
        else:
            return False
        return True

    def step(self) -> bool:
        """One optimizer step at the stage, loop state, LR and momentum the budget says; False when training ends."""
        if self.ended():
            return False
        settings, state, stepper = self.settings, self.state, self.stepper
        stage_frac = self.budget.stage_fraction(settings.stage_progress, *self.used(self.seconds))
        looped = _loop_due(settings, stage_frac)  # model.loop: None without one
        self._follow_stage(stage_frac, looped)
        if looped is not None and looped != stepper.model.loop_active:
            self.step_flops = _switch_loop(stepper, state, looped, self.seconds, self.log)
        lr = lr_multiplier(self.budget.progress(*self.used(self.seconds)), settings.schedule)
        if state.stage_index > 0 and settings.schedule.rewarmup_steps > 0:
            lr *= min(1.0, (state.steps - state.stage_start_step + 1) / settings.schedule.rewarmup_steps)
        set_lr_multiplier(stepper.optimizers, lr)
        set_muon_momentum(stepper.optimizers, muon_momentum(state.steps, settings.optim))
        loss = stepper(self.batches)
        if stepper.ema is not None:
            stepper.ema.update()
        state.steps += 1
        state.tokens += settings.tokens_per_step
        state.flops += self.step_flops
        state.position = self.batches.state_dict()["position"]
        # with extras, the same collective also carries every rank's stop request and checkpoint clock
        elapsed = self.clock.elapsed()
        self.seconds = self.extras.agree(elapsed) if self.extras is not None else self.agree(elapsed)
        self.losses.add(loss, state.steps, state.tokens, lr, self.seconds)
        self.pace.add(self.seconds)
        return self._between_steps()

    def _follow_stage(self, stage_frac: float, looped: bool | None) -> None:
        """Open the stream of the context stage the budget has reached (the first, or the next one), continuing
        at the token where the previous stream stopped."""
        settings, state = self.settings, self.state
        wanted = next((i for i, st in enumerate(settings.stages) if stage_frac < st.until), len(settings.stages) - 1)
        if wanted <= state.stage_index and self.batches is not None:
            return
        position = self.batches.state_dict()["position"] if self.batches is not None else state.position
        if wanted > state.stage_index:
            stage = settings.stages[wanted]
            state.stage_index, state.stage_start_step = wanted, state.steps
            state.stages.append(
                {"seq_len": stage.seq_len, "start_step": state.steps, "start_seconds": round(self.seconds, 3)}
                | ({} if looped is None else {"loop": looped})
            )
            if len(settings.stages) > 1:
                self.log(
                    f"context stage {wanted + 1}/{len(settings.stages)}: seq_len {stage.seq_len} x "
                    f"{stage.micro_batch} from step {state.steps}"
                )
        stage = settings.stages[state.stage_index]
        self.batches = self.make_batches(stage.seq_len, stage.micro_batch, position)
        self.step_flops = settings.tokens_per_step * flops_per_token(settings, stage.seq_len, looped=bool(looped))

    def _between_steps(self) -> bool:
        """Flush and log when due, then periodic validation and checkpoints with the clock paused; False when
        training ends here (a non-finite loss, or a reached target)."""
        extras, state, seconds = self.extras, self.state, self.seconds
        line = seconds >= self.next_log
        boundary = extras is not None and extras.due(state, seconds)
        if line or boundary or self.losses.full:
            if not self.flush(line):
                return False
            if line:
                self.next_log = self.agree(self.clock.elapsed()) + self.settings.logger.log_every_seconds
        if boundary:
            with self.clock.paused():
                extras.run(state)  # raises KeyboardInterrupt after its checkpoint when a stop was requested
            # a reached target ends training here, on every rank alike: the periodic evaluation is sharded and
            # all-reduced, so every rank holds the same numbers and verdict; rank 0's is broadcast all the same
            # (one scalar), so no float could ever make the ranks part
            if self.settings.target_metric is not None and self.agree(float(state.target_steps is not None)):
                state.budget_end = "target"
                return False
            if state.budget_end == "pruned":  # an Optuna trial its study pruned (one process: nothing to agree)
                return False
        return True

    def flush(self, line: bool) -> bool:
        """Copy the buffered losses out (one sync) into metrics.jsonl; False when one of them is not finite."""
        state = self.state
        sync_device(self.settings.device)
        state.train_seconds = self.clock.elapsed()
        records = self.losses.flush()
        if not records:
            return True
        values = [r["train_loss"] for r in records]
        found = non_finite(values, records[0]["step"])
        if found is not None:
            keep = found.step - records[0]["step"] + 1
            records, values = records[:keep], values[:keep]
            _diverged(state, found)
        if state.first_loss is None:
            state.first_loss, state.first_loss_step = values[0], records[0]["step"]
        state.recent_losses = (state.recent_losses + values)[-SMOOTH_STEPS:]
        state.last_loss = records[-1]["train_loss"]
        if line and not state.diverged:
            progress = self.budget.progress(*self.used(state.train_seconds))
            progress_line(records[-1], progress, state.train_seconds, self.log)
        for record in records if self.settings.logger.dense else records[-1:]:
            self.on_metrics(record)
        return not state.diverged

    def end(self) -> None:
        """After the last step: the clock read after a device sync, the last flush, the verdict on divergence,
        the extras' final checkpoint, and the EMA's weights into the model."""
        settings, state, stepper = self.settings, self.state, self.stepper
        sync_device(settings.device)
        state.train_seconds = self.clock.elapsed()
        state.recompiles = graphs_compiled() - self.graphs_before
        if settings.model.loop.on:  # evaluation, export and TTT run the model as training left it (a resumed run too)
            _set_loop(stepper.model, bool(state.stages) and bool(state.stages[-1].get("loop")))
        if not state.diverged:
            self.flush(line=True)
        if not state.diverged and state.recent_losses:
            assert state.first_loss is not None and state.first_loss_step is not None
            found = divergence(
                state.recent_losses,
                settings.model.vocab_size,
                start_step=state.steps - len(state.recent_losses) + 1,
                first=(state.first_loss_step, state.first_loss),
            )
            if found is not None:
                _diverged(state, found)
        if self.extras is not None and not state.diverged:
            with self.clock.paused():
                self.extras.finish(state)
        if stepper.ema is not None and not state.diverged:
            _average_into_model(stepper, state, self.log)


def _average_into_model(stepper: Stepper, state: TrainState, log: Callable[[str], None]) -> None:
    """From here on the model holds the average: the final eval, the artifact and TTT use it (periodic validation
    and the checkpoints had the live weights, and the checkpoints the EMA beside them). An average that keeps much
    of the initial weights over the run's steps is warned about before training (speedrun.run.run_steps)."""
    ema = stepper.ema
    assert ema is not None
    ema.copy_to()
    log(f"ema: the model now holds the weights' moving average (decay {ema.decay:g}) for evaluation")


@dataclass
class Hooks:
    """What the shell runs around training; each None by default, and an exported driver sets none. Control, not
    progress: progress goes through the log and metrics callbacks."""

    after_warmup: Callable[[dict[tuple[int, bool], float], TrainState], TrainSettings | None] | None = None
    """After warm-up, given its timed steps ({(stage index, loop on): seconds}, when fit's time_steps asked for
    them) and the state: the settings to train with instead (steps resolved from the budget: the EMA decay, the
    momentum warm-up), or None to keep them."""
    before_clock: Callable[[TrainState], None] | None = None
    """Right before the train clock starts: a resumed run's restore, the bench's start gate."""
    between_steps: Any = None
    """Work between steps with the clock paused (speedrun.run.periodic.LoopExtras: periodic validation,
    checkpoints, stop signals)."""


def fit(
    stepper: Stepper,
    make_batches: MakeBatches,
    *,
    state: TrainState,
    report: Report,
    hooks: Hooks | None = None,
    time_steps: bool = False,
) -> TrainState:
    """Warm up (untimed, undone), let the shell change the settings (hooks.after_warmup) and act before the clock
    starts (hooks.before_clock), then train to the budget. Settings that turn the EMA on (a horizon resolved into a
    decay) start the average from the weights warm-up restored. Progress goes to ``report``: ("line", {"text"}) for
    each log line, ("metrics", record) for each step's metrics record (speedrun.progress.Report)."""
    hooks = hooks or Hooks()

    def log(text: str) -> None:
        report("line", {"text": text})

    def on_metrics(record: dict[str, Any]) -> None:
        report("metrics", record)

    step_times = warm_up(stepper, make_batches, state, log, time_steps=time_steps)
    settings = hooks.after_warmup(step_times, state) if hooks.after_warmup else None
    if settings is not None:
        stepper.settings = settings
        if settings.ema.decay and stepper.ema is None:  # a horizon too short for an average resolves to 0.0: off
            stepper.ema = WeightEMA(stepper.model, settings.ema.decay)
    if hooks.before_clock:
        hooks.before_clock(state)
    return train(stepper, make_batches, state=state, log=log, on_metrics=on_metrics, between_steps=hooks.between_steps)
