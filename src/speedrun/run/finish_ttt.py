"""The TTT phase of the finish: the plan's ttt block as score-first TTT's settings, the pass, its log line and its
result keys (speedrun.records.keys.ttt_keys)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from speedrun.config import TTTConfig
from speedrun.core.ttt_score import TTT
from speedrun.plan.types import Plan


def ttt_pass(plan: Plan) -> Callable[..., Any]:
    """The score-first pass the plan's ttt.name picks (speedrun.core.ttt_score.TTT)."""
    return TTT[str(plan.ttt.name)]


def ttt_line(res: Any, t: TTTConfig) -> str:
    """TTT's log line: its score beside the unadapted one, its coverage and time."""
    phased = (
        f", {res.phases_done}/{t.phased.phases} global phases in {res.global_seconds:.1f} s" if t.phased.phases else ""
    )
    return (
        f"ttt ({t.name}, rank {t.rank}, targets {t.targets}): val_bpb_ttt "
        f"{'n/a' if res.val_bpb is None else f'{res.val_bpb:.4f}'} (unadapted "
        f"{'n/a' if res.base_val_bpb is None else f'{res.base_val_bpb:.4f}'}) over {res.tokens_scored:,}/{res.tokens_total:,} "
        f"tokens ({100 * res.fraction:.1f}%) of {res.docs_total:,} documents in {res.seconds:.1f} s{phased}"
    )
