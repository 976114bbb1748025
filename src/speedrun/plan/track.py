"""A run with a track (conf/track/) is refused here, before any work, where it cannot comply with the contest's
rules whatever happens on the way: a validation subset, a time budget over the limit, TTT allowed more than the
evaluation limit. What only the run can tell (the time measured, the GPUs, the card, the data) is judged at its end
(speedrun.config.track.TrackConfig.problems, recorded as track_ok and track_problems)."""

from __future__ import annotations

from speedrun.config import TTTConfig
from speedrun.config.choices import TTTName
from speedrun.config.track import TrackConfig
from speedrun.errors import PlanError
from speedrun.plan.types import BudgetPlan, EvalPlan


def check_track(track: TrackConfig, budget: BudgetPlan, eval_plan: EvalPlan, ttt: TTTConfig) -> None:
    if not track.on:
        return
    why = _validation(track, eval_plan) + _time(track, budget, ttt)
    if why:
        raise PlanError(f"track={track.name} cannot accept this run: " + "; ".join(why))


def _validation(track: TrackConfig, eval_plan: EvalPlan) -> list[str]:
    tokens = eval_plan.tokens  # N targets need N + 1 tokens (the first is context only)
    if track.full_validation and tokens is not None:
        return [f"it scores the whole validation split, and eval.tokens={tokens} scores a subset (eval.tokens=null)"]
    if track.val_tokens is not None and (tokens is None or tokens - 1 != track.val_tokens):
        return [f"it scores the first {track.val_tokens:,} validation targets: set eval.tokens={track.val_tokens + 1}"]
    return []


def _time(track: TrackConfig, budget: BudgetPlan, ttt: TTTConfig) -> list[str]:
    out = []
    limit = track.train_seconds
    if limit is not None and (budget.seconds is None or budget.seconds > limit):
        have = "no time limit" if budget.seconds is None else f"budget.train_seconds={budget.seconds:g}"
        out.append(f"it limits training to {limit:g} s and this run has {have}: set budget.train_seconds<={limit:g}")
    if track.eval_seconds is not None and ttt.name != TTTName.off and ttt.max_seconds is not None:
        if ttt.max_seconds > track.eval_seconds:
            out.append(
                f"it limits evaluation to {track.eval_seconds:g} s, TTT included, and ttt.max_seconds="
                f"{ttt.max_seconds:g} allows more: lower ttt.max_seconds"
            )
    return out
