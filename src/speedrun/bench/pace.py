"""Stalls inside timed training, found in a run's log of (step, train seconds) points.

A recompile, a data loader waiting on disk or a neighbour taking the GPU shows as an interval between two logged
steps whose seconds per step far exceed the run's usual pace. Its tokens/s hides where the time went; a stall
measured beside it says whether the rate is the trainer's steady one. Both sides of a comparison get the same
measure: a peer's from its log lines, a speedrun run's from metrics.jsonl.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from statistics import median

STALL_FACTOR = 3.0
"""An interval counts as a stall when its seconds per step exceed this many times the median interval's. A layer
loop switching on slows steps by well under 2x; a recompile of a step costs tens of steps' time."""

MIN_INTERVALS = 3
"""Fewer logged intervals than this give no median worth comparing against."""


def stall_seconds(points: Sequence[tuple[int, float]]) -> float | None:
    """Seconds lost to stalls: over the intervals between consecutive ``(step, seconds)`` points whose pace is more
    than STALL_FACTOR times the median interval's, the seconds beyond that median pace. 0.0 when no interval
    stalled; None when the points give fewer than MIN_INTERVALS intervals."""
    ordered = sorted(points)
    intervals = [(s1 - s0, t1 - t0) for (s0, t0), (s1, t1) in zip(ordered, ordered[1:]) if s1 > s0]
    if len(intervals) < MIN_INTERVALS:
        return None
    pace = median(dt / ds for ds, dt in intervals)
    lost = sum(dt - ds * pace for ds, dt in intervals if dt > STALL_FACTOR * ds * pace)
    return round(lost, 1)


def run_points(run_dir: Path) -> list[tuple[int, float]]:
    """(step, elapsed_s) of a speedrun run's train records in metrics.jsonl (validation records pause the clock
    and are left out); empty when the file is missing."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    points = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by a killed run
            continue
        if isinstance(record, dict) and record.get("kind") is None and "elapsed_s" in record and "step" in record:
            points.append((int(record["step"]), float(record["elapsed_s"])))
    return points
