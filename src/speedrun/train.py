"""The training loop: a plain function over a budget of wall-clock seconds or steps, whichever ends first.

Warm-up steps (compilation, autotuning) run before the clock starts and are undone afterwards (model and
optimizer state restored), so train_seconds measures training alone and the warm-up does not leak updates.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch

from .config import OptimConfig, ScheduleConfig
from .optim import set_lr_multiplier, set_muon_momentum
from .plan import Plan

Batch = tuple[torch.Tensor, torch.Tensor]


def autocast_dtype(plan: Plan) -> Optional[torch.dtype]:
    """The torch dtype of Plan.autocast (None: no autocast, fp32). fp8 plans autocast to bf16 around their fp8
    linears, and evaluate in bf16."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.autocast or "")


@dataclass
class TrainState:
    """Progress so far; the runner reads it to record a run that was interrupted or failed mid-way."""
    steps: int = 0
    tokens: int = 0
    train_seconds: float = 0.0
    compile_seconds: float = 0.0
    last_loss: Optional[float] = None
    diverged: bool = False
    stages: list[dict[str, Any]] = field(default_factory=list)
    """Each context stage that ran: seq_len, start_step, start_seconds."""
    recompiles: Optional[int] = None
    """Graphs dynamo compiled during timed training (0 when warm-up covered every shape); None until it ends."""


def lr_multiplier(progress: float, schedule: ScheduleConfig) -> float:
    """Linear warm-up over the first warmup_frac of the budget, linear warm-down to 0 over the last warmdown_frac."""
    if schedule.warmup_frac > 0 and progress < schedule.warmup_frac:
        return max(progress / schedule.warmup_frac, 1e-3)
    if schedule.warmdown_frac > 0 and progress > 1 - schedule.warmdown_frac:
        return max((1 - progress) / schedule.warmdown_frac, 0.0)
    return 1.0


def muon_momentum(step: int, optim: OptimConfig) -> float:
    if optim.muon_momentum_warmup_steps <= 0:
        return optim.muon_momentum
    frac = min(step / optim.muon_momentum_warmup_steps, 1.0)
    return optim.muon_momentum_warmup_start + frac * (optim.muon_momentum - optim.muon_momentum_warmup_start)


class Stepper:
    """One optimizer step: grad accumulation over micro-batches, autocast, GradScaler, clipping."""

    def __init__(self, model: torch.nn.Module, forward: Callable, optimizers: list, plan: Plan):
        self.model, self.forward, self.optimizers, self.plan = model, forward, optimizers, plan
        dtype = autocast_dtype(plan)
        # a captured graph must not keep autocast's cache of cast weights (torch.cuda.graph's docs)
        cache = not plan.kernel.cuda_graphs
        self.autocast = (lambda: torch.autocast(plan.device, dtype=dtype, cache_enabled=cache)) if dtype \
            else _null_context
        self.scaler = torch.amp.GradScaler("cuda") if plan.grad_scaler else None
        from .kernels.compile import keeps_grads

        # CUDA graphs accumulate into .grad tensors that must outlive each step (zeroed in place, never freed)
        self.keep_grads = keeps_grads(plan)
        self.micro: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._micro_step
        if plan.kernel.cuda_graphs:
            from .kernels.graphs import GraphedMicroStep

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
        return total


def _null_context():
    import contextlib

    return contextlib.nullcontext()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


MakeBatches = Callable[..., Iterator[Batch]]
"""make_batches(seq_len, micro_batch, position) -> a stream of micro-batches (build.DataBundle.train_batches)."""


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def warm_up(stepper: Stepper, make_batches: MakeBatches, state: TrainState, log: Callable[[str], None]) -> None:
    """Compile and autotune with Plan.warmup_steps real steps at every context length of the plan, then restore
    the initial model and optimizer state, so training starts from the same weights whatever the warm-up did."""
    steps = stepper.plan.warmup_steps
    if steps <= 0:
        return
    saved_model = copy.deepcopy(stepper.model.state_dict())
    saved_opts = [copy.deepcopy(opt.state_dict()) for opt in stepper.optimizers]
    saved_scaler = copy.deepcopy(stepper.scaler.state_dict()) if stepper.scaler else None
    stages = stepper.plan.stages
    log(f"warm-up: {steps} step(s) x {len(stages)} context length(s) to compile and autotune (not timed)")
    t0 = time.perf_counter()
    for stage in stages:
        batches = make_batches(stage.seq_len, stage.micro_batch)
        for _ in range(steps):
            stepper(batches)
    _sync(stepper.plan.device)
    state.compile_seconds = time.perf_counter() - t0
    stepper.model.load_state_dict(saved_model)
    for opt, saved in zip(stepper.optimizers, saved_opts):
        opt.load_state_dict(saved)
    if stepper.scaler and saved_scaler:
        stepper.scaler.load_state_dict(saved_scaler)
    log(f"warm-up done in {state.compile_seconds:.1f}s")


def train(stepper: Stepper, make_batches: MakeBatches, *, state: TrainState, log: Callable[[str], None],
          on_metrics: Callable[[dict[str, Any]], None]) -> TrainState:
    """Train until the budget is spent or the loss goes non-finite (state.diverged).

    Context stages switch when their fraction of the budget (time or steps, never later than whichever budget
    ends the run) is used up; the new stream continues at the token where the previous one stopped, and the LR
    re-warms over schedule.rewarmup_steps.
    """
    plan = stepper.plan
    optim, schedule, log_every_seconds = plan.optim, plan.schedule, plan.logger.log_every_seconds
    stage_index, stage_start_step = -1, 0
    batches: Any = None
    graphs_before = _graphs_compiled()
    step_tokens = plan.tokens_per_step
    budget_s, max_steps = plan.train_seconds, plan.max_steps
    pending: Optional[torch.Tensor] = None  # last step's loss, read one step late to avoid a pipeline stall
    t0 = time.perf_counter()
    next_log = t0 + min(log_every_seconds, 2.0)
    lr, last_logged = 1.0, -1

    def progress(elapsed: float) -> float:
        p = elapsed / budget_s if math.isfinite(budget_s) else 0.0
        return max(p, state.steps / max_steps) if max_steps else p

    def stage_progress(elapsed: float) -> float:
        own = state.steps / max_steps if plan.stage_progress == "step" and max_steps else 0.0
        if plan.stage_progress == "time" and math.isfinite(budget_s):
            own = elapsed / budget_s
        return max(own, progress(elapsed))  # whichever budget ends the run also drives the stages

    while True:
        elapsed = time.perf_counter() - t0
        frac = progress(elapsed)
        if frac >= 1.0:
            break
        wanted = next((i for i, st in enumerate(plan.stages) if stage_progress(elapsed) < st.until),
                      len(plan.stages) - 1)
        if wanted > stage_index:
            stage = plan.stages[wanted]
            position = batches.state_dict()["position"] if batches is not None else 0
            batches = make_batches(stage.seq_len, stage.micro_batch, position)
            stage_index, stage_start_step = wanted, state.steps
            state.stages.append({"seq_len": stage.seq_len, "start_step": state.steps,
                                 "start_seconds": round(elapsed, 3)})
            if len(plan.stages) > 1:
                log(f"context stage {wanted + 1}/{len(plan.stages)}: seq_len {stage.seq_len} x {stage.micro_batch} "
                    f"from step {state.steps}")
        lr = lr_multiplier(frac, schedule)
        if stage_index > 0 and schedule.rewarmup_steps > 0:
            lr *= min(1.0, (state.steps - stage_start_step + 1) / schedule.rewarmup_steps)
        set_lr_multiplier(stepper.optimizers, lr)
        set_muon_momentum(stepper.optimizers, muon_momentum(state.steps, optim))
        loss = stepper(batches)
        if pending is not None and not _check_finite(pending, state):
            break
        pending = loss
        state.steps += 1
        state.tokens += step_tokens
        now = time.perf_counter()
        state.train_seconds = now - t0
        if now >= next_log:
            _sync(plan.device)
            state.train_seconds = time.perf_counter() - t0
            if not _check_finite(pending, state):
                break
            _report(state, progress(state.train_seconds), lr, log, on_metrics)
            last_logged = state.steps
            next_log = time.perf_counter() + log_every_seconds
    _sync(plan.device)
    state.train_seconds = time.perf_counter() - t0
    state.recompiles = _graphs_compiled() - graphs_before
    if pending is not None and not state.diverged:
        _check_finite(pending, state)
    if not state.diverged and state.steps != last_logged:
        _report(state, 1.0, lr, log, on_metrics)
    return state


def _check_finite(loss: torch.Tensor, state: TrainState) -> bool:
    value = float(loss.item())
    state.last_loss = value
    if not math.isfinite(value):
        state.diverged = True
        return False
    return True


def _report(state: TrainState, frac: float, lr_mult: float, log: Callable[[str], None],
            on_metrics: Callable[[dict[str, Any]], None]) -> None:
    tok_s = state.tokens / state.train_seconds if state.train_seconds > 0 else 0.0
    eta = state.train_seconds / frac - state.train_seconds if 0 < frac < 1 else 0.0
    record = {"step": state.steps, "tokens": state.tokens, "train_loss": state.last_loss, "lr_mult": lr_mult,
              "elapsed_s": round(state.train_seconds, 3), "tokens_per_s": round(tok_s, 1), "progress": round(frac, 4)}
    on_metrics(record)
    loss = f"{state.last_loss:.4f}" if state.last_loss is not None else "-"
    log(f"step {state.steps:>6}  loss {loss}  lr x{lr_mult:.2f}  {tok_s:,.0f} tok/s  "
        f"elapsed {state.train_seconds:.0f}s  eta {eta:.0f}s")
