"""The training loop: train() steps until a budget (seconds, steps, tokens or FLOPs) is spent; warm_up() before it.

Warm-up steps (compilation, autotuning) run before the clock starts and are undone afterwards (model and
optimizer state restored), so train_seconds measures training alone and the warm-up does not leak updates.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

from speedrun.core.optim import set_lr_multiplier, set_muon_momentum
from speedrun.kernels.compile import graphs_compiled
from speedrun.plan import Plan
from speedrun.training.budget import Budget, Clock, StepPace
from speedrun.training.dense_metrics import SMOOTH_STEPS, Divergence, LossBuffer, divergence, non_finite, progress_line
from speedrun.training.mfu import plan_flops_per_token
from speedrun.training.stepper import Batch, Stepper, TrainState, lr_multiplier, muon_momentum, sync_device

EMA_INIT_SHARE_WARN = 0.05
"""Above this share of the initial weights in the EMA at the end of training, the run says so (a short run)."""


def _diverged(state: TrainState, found: Divergence) -> None:
    state.diverged, state.diverged_step, state.divergence = True, found.step, found.reason


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


def warm_up(
    stepper: Stepper,
    make_batches: MakeBatches,
    state: TrainState,
    log: Callable[[str], None],
    time_steps: bool = False,
) -> dict[tuple[int, bool], float]:
    """Compile and autotune with Plan.warmup_steps real steps at every context length of the plan (with model.loop,
    in each loop state training will run: off and on), then restore the initial model and optimizer state, so
    training starts from the same weights whatever the warm-up did. ``time_steps``: one more step of each, timed
    (compiled by then), returned as {(stage index, loop on): seconds}, what speedrun.training.run_steps projects a
    time budget's steps from."""
    steps = stepper.plan.warmup_steps
    timed: dict[tuple[int, bool], float] = {}
    if steps <= 0:
        return timed
    saved_model = copy.deepcopy(stepper.model.state_dict())
    saved_opts = [copy.deepcopy(opt.state_dict()) for opt in stepper.optimizers]
    saved_scaler = copy.deepcopy(stepper.scaler.state_dict()) if stepper.scaler else None
    stages = stepper.plan.stages
    states = loop_states(stepper.plan)
    looping = stepper.plan.model.loop.on
    described = f" x {len(states)} layer-loop state(s)" if looping else ""
    log(f"warm-up: {steps} step(s) x {len(stages)} context length(s){described} to compile and autotune (not timed)")
    t0 = time.perf_counter()
    for index, stage in enumerate(stages):
        batches = make_batches(stage.seq_len, stage.micro_batch)
        for looped in states:
            if looping:
                _set_loop(stepper.model, looped)
            for _ in range(steps):
                stepper(batches)
            if time_steps:
                sync_device(stepper.plan.device)
                t = time.perf_counter()
                stepper(batches)
                sync_device(stepper.plan.device)
                timed[(index, looped)] = time.perf_counter() - t
    if looping:
        _set_loop(stepper.model, False)  # train() switches it when the budget says
    sync_device(stepper.plan.device)
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
        self.plan = plan = stepper.plan
        self.budget, self.clock = Budget.of(plan.budget, state.hessian_reserve_seconds), Clock(state.train_seconds)
        self.pace = StepPace()
        self.losses = LossBuffer(plan.device, plan.logger.flush_every_steps)
        self.batches: Any = None
        self.step_flops = 0.0
        self.graphs_before = graphs_compiled()
        self.agree = stepper.world.agree
        self.seconds = self.agree(self.clock.elapsed())
        self.next_log = self.seconds + min(plan.logger.log_every_seconds, 2.0)  # on the agreed clock

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
        plan, state, stepper = self.plan, self.state, self.stepper
        stage_frac = self.budget.stage_fraction(plan.stage_progress, *self.used(self.seconds))
        looped = _loop_due(plan, stage_frac)  # model.loop: None without one
        self._follow_stage(stage_frac, looped)
        if looped is not None and looped != stepper.model.loop_active:
            self.step_flops = _switch_loop(stepper, state, looped, self.seconds, self.log)
        lr = lr_multiplier(self.budget.progress(*self.used(self.seconds)), plan.schedule)
        if state.stage_index > 0 and plan.schedule.rewarmup_steps > 0:
            lr *= min(1.0, (state.steps - state.stage_start_step + 1) / plan.schedule.rewarmup_steps)
        set_lr_multiplier(stepper.optimizers, lr)
        set_muon_momentum(stepper.optimizers, muon_momentum(state.steps, plan.optim))
        loss = stepper(self.batches)
        if stepper.ema is not None:
            stepper.ema.update()
        state.steps += 1
        state.tokens += plan.tokens_per_step
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
        plan, state = self.plan, self.state
        wanted = next((i for i, st in enumerate(plan.stages) if stage_frac < st.until), len(plan.stages) - 1)
        if wanted <= state.stage_index and self.batches is not None:
            return
        position = self.batches.state_dict()["position"] if self.batches is not None else state.position
        if wanted > state.stage_index:
            stage = plan.stages[wanted]
            state.stage_index, state.stage_start_step = wanted, state.steps
            state.stages.append(
                {"seq_len": stage.seq_len, "start_step": state.steps, "start_seconds": round(self.seconds, 3)}
                | ({} if looped is None else {"loop": looped})
            )
            if len(plan.stages) > 1:
                self.log(
                    f"context stage {wanted + 1}/{len(plan.stages)}: seq_len {stage.seq_len} x "
                    f"{stage.micro_batch} from step {state.steps}"
                )
        stage = plan.stages[state.stage_index]
        self.batches = self.make_batches(stage.seq_len, stage.micro_batch, position)
        self.step_flops = plan.tokens_per_step * plan_flops_per_token(plan, stage.seq_len, looped=bool(looped))

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
                self.next_log = self.agree(self.clock.elapsed()) + self.plan.logger.log_every_seconds
        if boundary:
            with self.clock.paused():
                extras.run(state)  # raises KeyboardInterrupt after its checkpoint when a stop was requested
            # a reached target ends training here, on every rank alike: the periodic evaluation is sharded and
            # all-reduced, so every rank holds the same numbers and verdict; rank 0's is broadcast all the same
            # (one scalar), so no float could ever make the ranks part
            if self.plan.target_metric is not None and self.agree(float(state.target_steps is not None)):
                state.budget_end = "target"
                return False
            if state.budget_end == "pruned":  # an Optuna trial its study pruned (one process: nothing to agree)
                return False
        return True

    def flush(self, line: bool) -> bool:
        """Copy the buffered losses out (one sync) into metrics.jsonl; False when one of them is not finite."""
        state = self.state
        sync_device(self.plan.device)
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
        for record in records if self.plan.logger.dense else records[-1:]:
            self.on_metrics(record)
        return not state.diverged

    def end(self) -> None:
        """After the last step: the clock read after a device sync, the last flush, the verdict on divergence,
        the extras' final checkpoint, and the EMA's weights into the model."""
        plan, state, stepper = self.plan, self.state, self.stepper
        sync_device(plan.device)
        state.train_seconds = self.clock.elapsed()
        state.recompiles = graphs_compiled() - self.graphs_before
        if plan.model.loop.on:  # evaluation, export and TTT run the model as training left it (a resumed run too)
            _set_loop(stepper.model, bool(state.stages) and bool(state.stages[-1].get("loop")))
        if not state.diverged:
            self.flush(line=True)
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
        if self.extras is not None and not state.diverged:
            with self.clock.paused():
                self.extras.finish(state)
        if stepper.ema is not None and not state.diverged:
            _average_into_model(stepper, state, self.log)


def _average_into_model(stepper: Stepper, state: TrainState, log: Callable[[str], None]) -> None:
    """From here on the model holds the average: the final eval, the artifact and TTT use it (periodic validation
    and the checkpoints had the live weights, and the checkpoints the EMA beside them)."""
    ema = stepper.ema
    assert ema is not None
    ema.copy_to()
    log(f"ema: the model now holds the weights' moving average (decay {ema.decay:g}) for evaluation")
    share = ema.decay**state.steps  # the initial weights' part of the average (result: ema_init_share)
    if state.steps and share > EMA_INIT_SHARE_WARN:
        log(
            f"warning: ema.decay {ema.decay:g} over {state.steps} steps leaves {share:.0%} of the initial "
            f"weights in the average that the final eval, export and TTT use; for a run this short set ema.decay "
            f"to about {1 - 10 / max(state.steps, 20):.3f} (about a tenth of the run) or ema.decay=null"
        )
