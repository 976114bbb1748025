"""Step-counted settings in units of the run: how many optimizer steps the run will make, and the settings given as
fractions of them (ema.horizon, optim.muon_momentum_warmup_frac) turned into steps.

A recipe fitted to one budget counts its EMA horizon and its momentum warm-up in steps: parameter-golf's record
makes ~4,900 steps in 600 s on 8 GPUs, and its EMA 0.9965 (a horizon 1 / (1 - decay) of ~286 steps) and 1,500-step
warm-up are 5.8% and 31% of that run. On one GPU in 300 s the same recipe makes ~300 steps: its warm-up never ends
and the EMA keeps most of the initial weights. Given as fractions, they scale with the run.

The run's steps: budget.max_steps for a step budget; budget.tokens / tokens per step for a token budget; for a time
budget alone, projected from the step times warm-up measured at each context length and layer-loop state, over the
stretches of the budget each of them trains (the stages' and the loop's switch points are fractions of the time).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from speedrun.plan.types import Plan

EMA_INIT_SHARE_WARN = 0.10
"""The share of the initial weights left in the EMA at the end above which the plan warns (decay ** steps)."""


@dataclass(frozen=True)
class RunSteps:
    """The steps a run will make, and where the number comes from."""

    steps: int
    source: str
    """steps (budget.max_steps), tokens (budget.tokens), or projected (a time budget, from warm-up's step times)."""


def needs_projection(plan: Plan) -> bool:
    """Whether the run's steps must come from warm-up's step times: a time budget alone (no step or token budget)."""
    b = plan.budget
    return not (b.steps or b.tokens) and b.seconds is not None


def known_steps(plan: Plan) -> RunSteps | None:
    """The steps of a step or token budget (the smaller when both are set); None for a time budget alone."""
    candidates = []
    if plan.budget.steps:
        candidates.append(RunSteps(int(plan.budget.steps), "steps"))
    if plan.budget.tokens:
        candidates.append(RunSteps(math.ceil(plan.budget.tokens / plan.tokens_per_step), "tokens"))
    return min(candidates, key=lambda r: r.steps) if candidates else None


def project_steps(plan: Plan, loop_seconds: float, step_seconds: dict[tuple[int, bool], float]) -> RunSteps:
    """The steps ``loop_seconds`` of training make, from ``step_seconds`` {(stage index, layer loop on): seconds of
    one step} (warm-up's): each stretch of the budget between the stages' ends and the loop's switch-on trains at
    its own pace."""
    loop = plan.model.loop
    switch = loop.enable_at if loop.on and loop.enable_at > 0 else None
    bounds = sorted({0.0, 1.0, *(min(1.0, st.until) for st in plan.stages), *([switch] if switch else [])})
    steps = 0.0
    for lo, hi in zip(bounds, bounds[1:]):
        if hi <= lo:
            continue
        mid = (lo + hi) / 2
        stage = next((i for i, st in enumerate(plan.stages) if mid < st.until), len(plan.stages) - 1)
        looped = loop.on and (switch is None or mid >= switch)
        steps += (hi - lo) * loop_seconds / step_seconds[(stage, looped)]
    return RunSteps(max(1, int(steps)), "projected")


def resolve(plan: Plan, run: RunSteps) -> tuple[Plan, list[str]]:
    """The plan with its fractions of the run turned into steps, as if given so (ema.decay from ema.horizon, the
    momentum warm-up's steps from its fraction; the fractions null), and one warning line for each step-counted
    setting that spans more than the run: a warm-up longer than it, an EMA whose initial weights keep more than
    EMA_INIT_SHARE_WARN of the average at its end."""
    ema, optim = plan.ema, plan.optim
    if ema.horizon is not None:
        # decay = 1 - 1 / (the horizon in steps); a horizon of a step or less averages nothing: off (decay 0)
        window = ema.horizon * run.steps
        ema = dataclasses.replace(ema, decay=1.0 - 1.0 / window if window > 1 else 0.0, horizon=None)
    if optim.muon_momentum_warmup_frac is not None:
        warm = round(optim.muon_momentum_warmup_frac * run.steps)
        optim = dataclasses.replace(optim, muon_momentum_warmup_frac=None, muon_momentum_warmup_steps=warm)
    resolved = dataclasses.replace(plan, ema=ema, optim=optim)
    return resolved, warnings(resolved, run)


def result_keys(original: Plan, resolved: Plan, run: RunSteps) -> dict[str, object]:
    """What result.json records: the run's steps and their source, the decay and warm-up steps used, and the
    fractions they came from."""
    return {
        "run_steps": run.steps,
        "run_steps_source": run.source,
        "ema_decay": resolved.ema.decay or None,
        "ema_horizon": original.ema.horizon,
        "muon_momentum_warmup_steps": resolved.optim.muon_momentum_warmup_steps,
        "muon_momentum_warmup_frac": original.optim.muon_momentum_warmup_frac,
    }


def warnings(plan: Plan, run: RunSteps) -> list[str]:
    """One line per step-counted setting that spans more than the run's ``run.steps`` steps."""
    out = []
    how = {"steps": "budget.max_steps", "tokens": "budget.tokens", "projected": "projected from warm-up"}[run.source]
    warm = plan.optim.muon_momentum_warmup_steps or 0
    if warm > run.steps:
        out.append(
            f"warning: optim.muon_momentum_warmup_steps={warm} is longer than the run's {run.steps} steps ({how}): "
            f"the momentum never reaches {plan.optim.muon_momentum:g}; give it as a fraction of the run, "
            f"optim.muon_momentum_warmup_frac (with optim.muon_momentum_warmup_steps=null)"
        )
    decay = plan.ema.decay
    if decay and decay**run.steps > EMA_INIT_SHARE_WARN:
        out.append(
            f"warning: ema.decay={decay:g} over the run's {run.steps} steps ({how}) keeps {decay**run.steps:.0%} of "
            f"the initial weights in the average; give its horizon as a fraction of the run, ema.horizon (with "
            f"ema.decay=null)"
        )
    return out


def describe(original: Plan, resolved: Plan, run: RunSteps) -> str:
    """One line on the run's steps and what the fractions became, for the log."""
    how = {"steps": "budget.max_steps", "tokens": "budget.tokens", "projected": "projected from warm-up step times"}
    parts = []
    if original.ema.horizon is not None:
        parts.append(f"ema.horizon {original.ema.horizon:g} -> ema.decay {resolved.ema.decay:.6g}")
    if original.optim.muon_momentum_warmup_frac is not None:
        parts.append(
            f"optim.muon_momentum_warmup_frac {original.optim.muon_momentum_warmup_frac:g} -> "
            f"{resolved.optim.muon_momentum_warmup_steps} warm-up steps"
        )
    return f"run steps: {run.steps} ({how[run.source]})" + (": " + ", ".join(parts) if parts else "")
