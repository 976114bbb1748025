"""The run's budgets, resolved once into the Plan's BudgetPlan: budget.train_seconds is read here and nowhere after.

"No limit" has one spelling after this: None. On the command line budget.train_seconds=null takes the hardware
profile's default, and 0 (with a step, token or FLOPs budget) sets no time limit; a token or FLOPs budget alone
lifts the profile's default, since its point is the same training on any card.

GPTQ's Hessians read training data, so they count as training (parameter-golf's rule): with a time limit, their
time is reserved out of it. quant.reserve_seconds fixes the reserve; unset, warm-up measures it
(speedrun.run.quant_phase). Either way result.json's train_seconds is the loop's plus the Hessians', checked
against the limit.
"""

from __future__ import annotations

import math

from speedrun.config import Config, QuantConfig
from speedrun.config.choices import Progress, QuantName
from speedrun.errors import PlanError
from speedrun.hardware.profiles import HardwareProfile
from speedrun.plan.types import BudgetPlan


def reads_training_data(quant: QuantConfig) -> bool:
    """Whether the export reads training batches after the loop (GPTQ's Hessians, quant=int6)."""
    return quant.name == QuantName.int6


def resolve_budget(cfg: Config, profile: HardwareProfile) -> BudgetPlan:
    b = cfg.budget
    if cfg.schedule.progress == Progress.step and not (b.max_steps or b.tokens or b.flops):
        raise PlanError(
            "schedule.progress=step measures stages in steps: set budget.max_steps (or budget.tokens or "
            "budget.flops, which the stages then follow), or use schedule.progress=time"
        )
    if b.train_seconds is None:
        seconds = None if (b.tokens or b.flops) else profile.train_seconds
    else:
        seconds = b.train_seconds if 0 < b.train_seconds < math.inf else None
    _check_run_fractions(cfg, seconds)
    return BudgetPlan(
        seconds=None if seconds is None else float(seconds),
        steps=b.max_steps,
        tokens=b.tokens,
        flops=b.flops,
        hessian_reserve=_hessian_reserve(cfg.quant, seconds),
    )


def _hessian_reserve(quant: QuantConfig, seconds: float | None) -> float | None:
    """quant.reserve_seconds checked against the time limit; None: measure it in warm-up."""
    reserve = quant.reserve_seconds
    if not reads_training_data(quant):
        return 0.0  # QuantConfig refuses a reserve without GPTQ
    if seconds is None:
        if reserve:
            raise PlanError(
                f"quant.reserve_seconds={reserve:g} is taken from the time budget and this run has none: set "
                f"budget.train_seconds above it, or drop quant.reserve_seconds"
            )
        return 0.0  # no clock to reserve from; train_seconds still counts the Hessians
    if reserve is None:
        return None
    if reserve == 0:
        raise PlanError(
            "quant.reserve_seconds=0 would leave GPTQ's Hessians, which read training data, outside the training "
            f"budget (budget.train_seconds={seconds:g}): leave quant.reserve_seconds unset to have warm-up measure "
            "their time, or give it a positive number of seconds"
        )
    if not reserve < seconds:
        raise PlanError(
            f"quant.reserve_seconds={reserve:g} is taken from the time budget (budget.train_seconds={seconds:g}) "
            f"and must leave training some of it: raise budget.train_seconds, or lower quant.reserve_seconds"
        )
    return float(reserve)


def _check_run_fractions(cfg: Config, seconds: float | None) -> None:
    """Settings given as fractions of the run (speedrun.run.run_steps) need a run length in steps: a step or
    token budget, or a time budget whose warm-up times the steps."""
    fractions = [f"ema.horizon={cfg.ema.horizon:g}"] if cfg.ema.horizon is not None else []
    frac = cfg.optim.muon_momentum_warmup_frac
    fractions += [f"optim.muon_momentum_warmup_frac={frac:g}"] if frac is not None else []
    if not fractions or cfg.budget.max_steps or cfg.budget.tokens:
        return
    if seconds is None:
        raise PlanError(
            f"{' and '.join(fractions)} count in the run's steps, and this run has no step, token or time budget to "
            f"count them from: set budget.max_steps, budget.tokens or budget.train_seconds, or give them in steps"
        )
    if cfg.budget.warmup_steps == 0:
        raise PlanError(
            f"{' and '.join(fractions)} count in the steps a time budget makes, which warm-up projects from its step "
            f"times, and budget.warmup_steps=0 skips it: set budget.warmup_steps=1 or more, or give them in steps"
        )
