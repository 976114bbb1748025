"""At a run's end: whether it met its track's rules (track_ok, track_problems), and, for a run on fewer GPUs or
another card than the contest's, what it would take there, labelled as a projection."""

from __future__ import annotations

from typing import Any

from speedrun.config.track import TrackConfig
from speedrun.hardware.cards import card_for
from speedrun.plan.types import Plan

PROJECTION_BASIS = (
    "projection, not a measurement: the run's measured seconds x its GPUs / the track's, x its card's dense peak / "
    "the track card's (perfect scaling assumed)"
)


def track_keys(plan: Plan, result: dict[str, Any]) -> dict[str, Any]:
    """track, track_ok, track_problems (null when none), and the track_projected_* keys where they apply."""
    track = plan.track
    problems = track.problems(result)
    return {
        "track": track.name,
        "track_ok": not problems,
        "track_problems": problems or None,
        **projection(track, plan, result),
    }


def projection(track: TrackConfig, plan: Plan, result: dict[str, Any]) -> dict[str, Any]:
    """The train and eval seconds on the track's machine, from this run's, where the run had other GPUs (count or
    card) and both cards' peaks are known; {} otherwise (a CPU run: no peak to scale by)."""
    world = int(result.get("world_size") or 1)
    ours, theirs = card_for(plan.device_name) if plan.device == "cuda" else None, card_for(track.card_model)
    if track.gpus is None or ours is None or theirs is None:
        return {}
    if world == track.gpus and ours.name == theirs.name:
        return {}
    dtype = plan.matmul_dtype
    ours_peak, theirs_peak = ours.peak_flops(dtype), theirs.peak_flops(dtype)
    if not ours_peak or not theirs_peak:
        return {}
    scale = world / track.gpus * ours_peak / theirs_peak

    def scaled(key: str) -> float | None:
        value = result.get(key)
        return None if value is None else round(float(value) * scale, 1)

    return {
        "track_projected_train_seconds": scaled("train_seconds"),
        "track_projected_eval_seconds": scaled("eval_seconds"),
        "track_projection": f"{world} x {ours.name} -> {track.gpus} x {theirs.name}: {PROJECTION_BASIS}",
    }
