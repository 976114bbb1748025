"""One optimizer step (Stepper) and what the loop keeps between steps (TrainState), with the LR and Muon momentum
schedules the loop sets before each step."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from speedrun.config import OptimConfig, ScheduleConfig
from speedrun.core.dist import SINGLE
from speedrun.core.optim import WeightEMA
from speedrun.kernels.compile import keeps_grads
from speedrun.kernels.graphs import GraphedMicroStep
from speedrun.plan import Plan
from speedrun.plan.dtypes import autocast_dtype

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


def lr_multiplier(progress: float, schedule: ScheduleConfig) -> float:
    """Linear warm-up over the first warmup_frac of the budget, linear warm-down to 0 over the last warmdown_frac,
    held at schedule.min_lr once it gets there (the record's ``max((1 - frac) / warmdown_frac, min_lr)``)."""
    if schedule.warmup_frac > 0 and progress < schedule.warmup_frac:
        return max(progress / schedule.warmup_frac, 1e-3)
    if schedule.warmdown_frac > 0 and progress > 1 - schedule.warmdown_frac:
        return max((1 - progress) / schedule.warmdown_frac, schedule.min_lr)
    return 1.0


def muon_momentum(step: int, optim: OptimConfig) -> float:
    # None: a fraction of the run not resolved into steps (speedrun.training.run_steps), which training never sees
    warm = optim.muon_momentum_warmup_steps or 0
    if warm <= 0:
        return optim.muon_momentum
    frac = min(step / warm, 1.0)
    return optim.muon_momentum_warmup_start + frac * (optim.muon_momentum - optim.muon_momentum_warmup_start)


class Stepper:
    """One optimizer step: grad accumulation over micro-batches, autocast, GradScaler, clipping. On several ranks
    (``world``, speedrun.distributed.world) each runs its own micro-batches; gradients and the loss are averaged over them.

    ``ema`` (plan.ema on): the weights' moving average (speedrun.core.optim.WeightEMA), started from the weights the
    Stepper is made with (those warm-up restores); train() updates it after each timed step, never warm-up's."""

    def __init__(self, model: torch.nn.Module, forward: Callable, optimizers: list, plan: Plan, world: Any = None):
        self.model, self.forward, self.optimizers, self.plan = model, forward, optimizers, plan
        decay = plan.ema.decay
        self.ema = WeightEMA(model, decay) if plan.ema.on and decay is not None else None
        self.world = world or SINGLE
        dtype = autocast_dtype(plan)
        # a captured graph must not keep autocast's cache of cast weights (torch.cuda.graph's docs)
        cache = not plan.kernel.cuda_graphs
        self.autocast = (
            (lambda: torch.autocast(plan.device, dtype=dtype, cache_enabled=cache)) if dtype else contextlib.nullcontext
        )
        self.scaler = torch.amp.GradScaler("cuda") if plan.grad_scaler else None
        # CUDA graphs accumulate into .grad tensors that must outlive each step (zeroed in place, never freed)
        self.keep_grads = keeps_grads(plan)
        self.micro: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._micro_step
        if plan.kernel.cuda_graphs:
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


def sync_device(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
