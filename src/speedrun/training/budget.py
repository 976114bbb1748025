"""Training budgets, whichever ends first: wall-clock train seconds, optimizer steps, tokens and model FLOPs.

Each budget gives a fraction of itself used; the run's progress is the largest of them, so the LR warm-up and
warm-down and the progressive context stages follow whichever budget governs the run, and the budget whose
fraction reaches 1 ends it (recorded as ``budget_end``: time, steps, tokens or flops). Tokens and FLOPs mean the
same amount of training on any card; FLOPs follow the MFU convention (ModelShape.flops_per_token at the seq_len
of the stage each token was trained in).

A time limit also ends the run a step early when the next step, at the mean pace so far, would end past it, so
that a run ends within budget.train_seconds (a contest's limit) rather than a step past it; the clock is read
without a device sync, so work still queued on the GPU at the end can add a little.

The clock counts train seconds only: periodic validation and checkpoint writes pause it, and a resumed run
starts it at the elapsed train seconds of its checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from speedrun.plan.types import BudgetPlan

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
    def of(cls, budget: BudgetPlan, hessian_reserve: float) -> Budget:
        """The training loop's budgets: the Plan's, with ``hessian_reserve`` seconds of the time limit left for
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
