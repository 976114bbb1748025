"""The training loop: a plain function over a budget of wall-clock seconds or steps, whichever ends first.

Warm-up steps (compilation, autotuning) run before the clock starts and are undone afterwards (model and
optimizer state restored), so train_seconds measures training alone and the warm-up does not leak updates.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from speedrun.config import OptimConfig, ScheduleConfig
from speedrun.kernels.compile import graphs_compiled
from speedrun.model.optim import WeightEMA, set_lr_multiplier, set_muon_momentum
from speedrun.plan import Plan
from speedrun.plan.dtypes import autocast_dtype
from speedrun.training.budget import Budget, Clock, StepPace
from speedrun.training.dense_metrics import SMOOTH_STEPS, Divergence, LossBuffer, divergence, non_finite, progress_line
from speedrun.training.mfu import plan_flops_per_token

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
    """Training went wrong (speedrun.training.dense_metrics.divergence): a non-finite loss (the loop stops at the flush that sees
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
    """Index into Plan.stages of the stage running (-1 before the first step)."""
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
    """Seconds of the time budget left after the loop for GPTQ's Hessians (the plan's, or measured in warm-up);
    a checkpoint keeps it, so a resumed run stops its loop where the original would have."""


EMA_INIT_SHARE_WARN = 0.05
"""Above this share of the initial weights in the EMA at the end of training, the run says so (a short run)."""


def lr_multiplier(progress: float, schedule: ScheduleConfig) -> float:
    """Linear warm-up over the first warmup_frac of the budget, linear warm-down to 0 over the last warmdown_frac,
    held at schedule.min_lr once it gets there (the record's ``max((1 - frac) / warmdown_frac, min_lr)``)."""
    if schedule.warmup_frac > 0 and progress < schedule.warmup_frac:
        return max(progress / schedule.warmup_frac, 1e-3)
    if schedule.warmdown_frac > 0 and progress > 1 - schedule.warmdown_frac:
        return max((1 - progress) / schedule.warmdown_frac, schedule.min_lr)
    return 1.0


def muon_momentum(step: int, optim: OptimConfig) -> float:
    if optim.muon_momentum_warmup_steps <= 0:
        return optim.muon_momentum
    frac = min(step / optim.muon_momentum_warmup_steps, 1.0)
    return optim.muon_momentum_warmup_start + frac * (optim.muon_momentum - optim.muon_momentum_warmup_start)


class Stepper:
    """One optimizer step: grad accumulation over micro-batches, autocast, GradScaler, clipping. On several ranks
    (``world``, speedrun.distributed.world) each runs its own micro-batches; gradients and the loss are averaged over them.

    ``ema`` (plan.ema on): the weights' moving average (speedrun.model.optim.WeightEMA), started from the weights the
    Stepper is made with (those warm-up restores); train() updates it after each timed step, never warm-up's."""

    def __init__(self, model: torch.nn.Module, forward: Callable, optimizers: list, plan: Plan, world: Any = None):
        self.model, self.forward, self.optimizers, self.plan = model, forward, optimizers, plan
        decay = plan.ema.decay
        self.ema = WeightEMA(model, decay) if plan.ema.on and decay is not None else None
        from speedrun.distributed.world import SINGLE

        self.world = world or SINGLE
        dtype = autocast_dtype(plan)
        # a captured graph must not keep autocast's cache of cast weights (torch.cuda.graph's docs)
        cache = not plan.kernel.cuda_graphs
        self.autocast = (
            (lambda: torch.autocast(plan.device, dtype=dtype, cache_enabled=cache)) if dtype else _null_context
        )
        self.scaler = torch.amp.GradScaler("cuda") if plan.grad_scaler else None
        from speedrun.kernels.compile import keeps_grads

        # CUDA graphs accumulate into .grad tensors that must outlive each step (zeroed in place, never freed)
        self.keep_grads = keeps_grads(plan)
        self.micro: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._micro_step
        if plan.kernel.cuda_graphs:
            from speedrun.kernels.graphs import GraphedMicroStep

            self.micro = GraphedMicroStep(self._micro_step, plan.device)

    def _micro_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and (scaled) backward of one micro-batch on the device; returns its share of the step's loss."""
        with self.autocast():
            loss = self.forward(x, y)
        scaled = loss / self.plan.grad_accum
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        return scaled.detach()

    def __call__(self, batches: Iterator[Batch]) -> torch.Tensor:
        """Run one step; returns the mean micro-batch loss as a device tensor (no host sync)."""
        total = None
        graphed = self.plan.kernel.cuda_graphs
        for _ in range(self.plan.grad_accum):
            x, y = next(batches)
            if not graphed:  # the graphed step copies host batches into its static buffers itself
                x = x.to(self.plan.device, non_blocking=True)
                y = y.to(self.plan.device, non_blocking=True)
            part = self.micro(x, y)
            # clone: a replayed graph's loss is overwritten by the next replay
            total = part.clone() if total is None else total + part
        self.world.sync_grads(list(self.model.parameters()))
        if self.scaler is not None:
            for opt in self.optimizers:
                self.scaler.unscale_(opt)
        if self.plan.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.plan.optim.grad_clip)
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


def _diverged(state: TrainState, found: Divergence) -> None:
    state.diverged, state.diverged_step, state.divergence = True, found.step, found.reason


def _null_context():
    import contextlib

    return contextlib.nullcontext()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


MakeBatches = Callable[..., Iterator[Batch]]
"""make_batches(seq_len, micro_batch, position) -> a stream of micro-batches (build.DataBundle.train_batches)."""


def _set_loop(model: Any, on: bool) -> None:
    model.set_loop(on)  # GPT.set_loop: model.loop on or off (a no-op for a model without one)


def loop_states(plan: Plan) -> list[bool]:
    """The model.loop states training will run (warm-up compiles each): off, then on from loop.enable_at; on only
    when it is on from the first step; [False] for a model without a loop."""
    loop = plan.model.loop
    if not loop.on:
        return [False]
    return [True] if loop.enable_at <= 0 else [False, True]


def _loop_due(plan: Plan, stage_frac: float) -> bool | None:
    """Whether model.loop should be on at this point of the budget (None: the model has no loop). The fraction is
    the context stages' (Budget.stage_fraction), so the loop follows whichever budget governs the run."""
    loop = plan.model.loop
    return stage_frac >= loop.enable_at if loop.on else None


def _switch_loop(stepper: Stepper, state: TrainState, on: bool, seconds: float, log: Callable[[str], None]) -> int:
    """Switch the model's loop (a Python attribute the compiled graphs specialise on: both were compiled in
    warm-up, so no recompile), record a stage entry with ``loop: true`` from this step (speedrun.training.mfu charges
    its tokens the looped FLOPs) unless the current entry already has it (a resumed run); -> the step's FLOPs."""
    plan = stepper.plan
    _set_loop(stepper.model, on)
    seq_len = plan.stages[state.stage_index].seq_len
    if on and state.stages and not state.stages[-1].get("loop"):
        state.stages.append(
            {"seq_len": seq_len, "start_step": state.steps, "start_seconds": round(seconds, 3), "loop": True}
        )
        loop = plan.model.loop
        log(
            f"layer loop on from step {state.steps}: layers {loop.start}-{loop.end} x {1 + loop.num}, "
            f"{plan.model.layer_passes(True)} layer calls per forward"
        )
    return plan.tokens_per_step * plan_flops_per_token(plan, seq_len, looped=on)


def warm_up(stepper: Stepper, make_batches: MakeBatches, state: TrainState, log: Callable[[str], None]) -> None:
    """Compile and autotune with Plan.warmup_steps real steps at every context length of the plan (with model.loop,
    in each loop state training will run: off and on), then restore the initial model and optimizer state, so
    training starts from the same weights whatever the warm-up did."""
    steps = stepper.plan.warmup_steps
    if steps <= 0:
        return
    saved_model = copy.deepcopy(stepper.model.state_dict())
    saved_opts = [copy.deepcopy(opt.state_dict()) for opt in stepper.optimizers]
    saved_scaler = copy.deepcopy(stepper.scaler.state_dict()) if stepper.scaler else None
    stages = stepper.plan.stages
    states = loop_states(stepper.plan)
    looping = stepper.plan.model.loop.on
    described = f" x {len(states)} layer-loop state(s)" if looping else ""
    log(f"warm-up: {steps} step(s) x {len(stages)} context length(s){described} to compile and autotune (not timed)")
    t0 = time.perf_counter()
    for stage in stages:
        batches = make_batches(stage.seq_len, stage.micro_batch)
        for looped in states:
            if looping:
                _set_loop(stepper.model, looped)
            for _ in range(steps):
                stepper(batches)
    if looping:
        _set_loop(stepper.model, False)  # train() switches it when the budget says
    _sync(stepper.plan.device)
    state.compile_seconds = time.perf_counter() - t0
    stepper.model.load_state_dict(saved_model)
    for opt, saved in zip(stepper.optimizers, saved_opts):
        opt.load_state_dict(saved)
    if stepper.scaler and saved_scaler:
        stepper.scaler.load_state_dict(saved_scaler)
    log(f"warm-up done in {state.compile_seconds:.1f}s")


def train(
    stepper: Stepper,
    make_batches: MakeBatches,
    *,
    state: TrainState,
    log: Callable[[str], None],
    on_metrics: Callable[[dict[str, Any]], None],
    extras: Any = None,
) -> TrainState:
    """Train until a budget is spent (speedrun.training.budget: time, steps, tokens or FLOPs, whichever first) or the loss
    goes non-finite; a run whose loss ends above where it started or above uniform guessing is diverged too
    (state.diverged, speedrun.training.dense_metrics.divergence). ``state`` may come from a checkpoint: the loop continues where
    it stopped.

    Context stages switch when their fraction of the budget (time or steps, never later than whichever budget
    ends the run) is used up; the new stream continues at the token where the previous one stopped, and the LR
    re-warms over schedule.rewarmup_steps. Losses stay on the device until a flush (speedrun.training.dense_metrics). ``extras``
    (speedrun.training.periodic.LoopExtras) runs periodic validation and checkpoints between steps with the clock paused,
    and turns a stop signal into a checkpoint at the end of the step.

    With plan.ema on, the weights' average is updated after every step, and a run that did not diverge returns
    with the average in the model (as the record's train_model does), so evaluation and export use it.
    """
    plan = stepper.plan
    optim, schedule, log_every_seconds = plan.optim, plan.schedule, plan.logger.log_every_seconds
    budget, clock = Budget.of(plan.budget, state.hessian_reserve_seconds), Clock(state.train_seconds)
    pace = StepPace()
    losses = LossBuffer(plan.device, plan.logger.flush_every_steps)
    batches: Any = None
    graphs_before = graphs_compiled()
    step_tokens = plan.tokens_per_step
    # On several ranks every decision below (stop, LR, context stage, when to flush and log, periodic validation and
    # checkpoints) is taken on rank 0's clock, broadcast after each step, so all ranks run the same steps and stop
    # together (one small collective per step, which also carries a stop signal that reached any rank; nothing on
    # one process).
    agree = stepper.world.agree
    seconds = agree(clock.elapsed())
    next_log = seconds + min(log_every_seconds, 2.0)  # seconds into training, on the agreed clock
    lr = 1.0

    def used(seconds: float) -> tuple[float, int, int, float]:
        return seconds, state.steps, state.tokens, state.flops

    def flush(line: bool) -> bool:
        """Copy the buffered losses out (one sync) into metrics.jsonl; False when one of them is not finite."""
        _sync(plan.device)
        state.train_seconds = clock.elapsed()
        records = losses.flush()
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
            progress_line(records[-1], budget.progress(*used(state.train_seconds)), state.train_seconds, log)
        for record in records if plan.logger.dense else records[-1:]:
            on_metrics(record)
        return not state.diverged

    if extras is not None:
        extras.start()
    with extras.deferring() if extras is not None else contextlib.nullcontext():
        while True:
            if state.target_steps is not None:  # resumed from the checkpoint of a run that had reached its target
                state.budget_end = "target"
                break
            if budget.progress(*used(seconds)) >= 1.0:
                state.budget_end = budget.ended_by(*used(seconds))
                break
            if budget.next_step_passes_time(seconds, pace.mean()):
                state.budget_end = "time"
                break
            stage_frac = budget.stage_fraction(plan.stage_progress, *used(seconds))
            wanted = next((i for i, st in enumerate(plan.stages) if stage_frac < st.until), len(plan.stages) - 1)
            looped = _loop_due(plan, stage_frac)  # model.loop: None without one
            if wanted > state.stage_index or batches is None:
                position = batches.state_dict()["position"] if batches is not None else state.position
                if wanted > state.stage_index:
                    stage = plan.stages[wanted]
                    state.stage_index, state.stage_start_step = wanted, state.steps
                    state.stages.append(
                        {"seq_len": stage.seq_len, "start_step": state.steps, "start_seconds": round(seconds, 3)}
                        | ({} if looped is None else {"loop": looped})
                    )
                    if len(plan.stages) > 1:
                        log(
                            f"context stage {wanted + 1}/{len(plan.stages)}: seq_len {stage.seq_len} x "
                            f"{stage.micro_batch} from step {state.steps}"
                        )
                stage = plan.stages[state.stage_index]
                batches = make_batches(stage.seq_len, stage.micro_batch, position)
                step_flops = step_tokens * plan_flops_per_token(plan, stage.seq_len, looped=bool(looped))
            if looped is not None and looped != stepper.model.loop_active:
                step_flops = _switch_loop(stepper, state, looped, seconds, log)
            lr = lr_multiplier(budget.progress(*used(seconds)), schedule)
            if state.stage_index > 0 and schedule.rewarmup_steps > 0:
                lr *= min(1.0, (state.steps - state.stage_start_step + 1) / schedule.rewarmup_steps)
            set_lr_multiplier(stepper.optimizers, lr)
            set_muon_momentum(stepper.optimizers, muon_momentum(state.steps, optim))
            loss = stepper(batches)
            if stepper.ema is not None:
                stepper.ema.update()
            state.steps += 1
            state.tokens += step_tokens
            state.flops += step_flops
            state.position = batches.state_dict()["position"]
            # with extras, the same collective also carries every rank's stop request and checkpoint clock
            seconds = extras.agree(clock.elapsed()) if extras is not None else agree(clock.elapsed())
            losses.add(loss, state.steps, state.tokens, lr, seconds)
            pace.add(seconds)
            line = seconds >= next_log
            boundary = extras is not None and extras.due(state, seconds)
            if line or boundary or losses.full:
                if not flush(line):
                    break
                if line:
                    next_log = agree(clock.elapsed()) + log_every_seconds
            if boundary:
                with clock.paused():
                    extras.run(state)  # raises KeyboardInterrupt after its checkpoint when a stop was requested
                # a reached target ends training here, on every rank alike: the periodic evaluation is sharded and
                # all-reduced, so every rank holds the same numbers and verdict; rank 0's is broadcast all the same
                # (one scalar), so no float could ever make the ranks part
                if plan.target_metric is not None and agree(float(state.target_steps is not None)):
                    state.budget_end = "target"
                    break
    _sync(plan.device)
    state.train_seconds = clock.elapsed()
    state.recompiles = graphs_compiled() - graphs_before
    if plan.model.loop.on:  # evaluation, export and TTT run the model as training left it (a resumed run too)
        _set_loop(stepper.model, bool(state.stages) and bool(state.stages[-1].get("loop")))
    if not state.diverged:
        flush(line=True)
    if not state.diverged and state.recent_losses:
        assert state.first_loss is not None and state.first_loss_step is not None
        found = divergence(
            state.recent_losses,
            plan.model.vocab_size,
            start_step=state.steps - len(state.recent_losses) + 1,
            first=(state.first_loss_step, state.first_loss),
        )
        if found is not None:
            _diverged(state, found)
    if extras is not None and not state.diverged:
        with clock.paused():
            extras.finish(state)
    if stepper.ema is not None and not state.diverged:
        # from here on the model holds the average: the final eval, the artifact and TTT use it (periodic
        # validation and the checkpoints above had the live weights, and the checkpoints the EMA beside them)
        stepper.ema.copy_to()
        log(f"ema: the model now holds the weights' moving average (decay {stepper.ema.decay:g}) for evaluation")
        share = stepper.ema.decay**state.steps  # the initial weights' part of the average (result: ema_init_share)
        if state.steps and share > EMA_INIT_SHARE_WARN:
            log(
                f"warning: ema.decay {stepper.ema.decay:g} over {state.steps} steps leaves {share:.0%} of the initial "
                f"weights in the average that the final eval, export and TTT use; for a run this short set ema.decay "
                f"to about {1 - 10 / max(state.steps, 20):.3f} (about a tenth of the run) or ema.decay=null"
            )
    return state
