"""Metrics of a speedrun arm: keys of its run's result.json, and a few derived from them.

Derived metrics (named where result.json has no key of that name):

- ``tokens_per_s_before_loop``: training tokens / train seconds up to the step where ``model.loop`` switched on
  (the stage result.json records with ``loop: true``), counted from the start of timed training; the whole run's
  ``tokens_per_s`` when no loop switched on.
- ``tokens_per_s_with_loop``: the same after the switch, to the end of the training loop (``train_loop_seconds``
  where GPTQ's reserve is on, else ``train_seconds``); null without a loop.
- ``ttt_gain``: ``val_bpb_ttt_base - val_bpb_ttt``.
- ``stall_seconds``: train seconds lost to stalls, from the run dir's metrics.jsonl (speedrun.bench.pace).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from speedrun.bench.pace import run_points, stall_seconds


def _loop_stage(result: Mapping[str, Any]) -> dict[str, Any] | None:
    for stage in result.get("stages") or []:
        if isinstance(stage, dict) and stage.get("loop"):
            return stage
    return None


def tokens_per_s_before_loop(result: Mapping[str, Any]) -> float | None:
    stage = _loop_stage(result)
    if stage is None:
        return result.get("tokens_per_s")
    step, seconds, per_step = stage.get("start_step"), stage.get("start_seconds"), result.get("tokens_per_step")
    if not step or not seconds or not per_step:
        return None
    return float(step * per_step / seconds)


def tokens_per_s_with_loop(result: Mapping[str, Any]) -> float | None:
    stage = _loop_stage(result)
    if stage is None:
        return None
    step, start, per_step = stage.get("start_step"), stage.get("start_seconds"), result.get("tokens_per_step")
    end = result.get("train_loop_seconds") or result.get("train_seconds")
    steps = result.get("steps")
    if step is None or start is None or not per_step or not end or not steps or end <= start:
        return None
    return float((steps - step) * per_step / (end - start))


def ttt_gain(result: Mapping[str, Any]) -> float | None:
    base, ttt = result.get("val_bpb_ttt_base"), result.get("val_bpb_ttt")
    return None if base is None or ttt is None else float(base - ttt)


DERIVED: dict[str, Callable[[Mapping[str, Any]], float | None]] = {
    "tokens_per_s_before_loop": tokens_per_s_before_loop,
    "tokens_per_s_with_loop": tokens_per_s_with_loop,
    "ttt_gain": ttt_gain,
}


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """The run's result.json, or None when the run wrote none (killed before it could)."""
    path = run_dir / "result.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_metrics(result: Mapping[str, Any], names: tuple[str, ...], run_dir: Path | None = None) -> dict[str, Any]:
    """``names`` from a result.json: its own key where it has one, else the derived metric of that name (those
    read from the run's other files need ``run_dir``)."""
    out: dict[str, Any] = {}
    for name in names:
        if name in result:
            out[name] = result[name]
        elif name in DERIVED:
            out[name] = DERIVED[name](result)
        elif name == "stall_seconds" and run_dir is not None:
            out[name] = stall_seconds(run_points(run_dir))
    return out
