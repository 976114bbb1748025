"""GPTQ's Hessians on the training clock: they read training data, so parameter-golf counts them as training.

Warm-up measures what the collection will take (``measure_reserve``) and the loop stops that much before the time
limit; the Hessians are then collected right after the last step (``collect_after_training``), before anything
is scored, so that ``train_seconds`` (the loop's clock + the Hessians) runs from the first step to the last read of
training data, less the pauses the loop's clock leaves out (periodic validation, checkpoints), and the export
quantizes with them later (speedrun.run.finish).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from speedrun.plan.dtypes import autocast_dtype
from speedrun.plan.types import Plan
from speedrun.progress import Progress

RESERVE_MARGIN = 1.25
"""The measured collection time is scaled by this: a run whose Hessians take a little longer than warm-up's
estimate (a busier host, a later allocation) still fits its budget, and quant_reserve_ok says if it did not."""


@dataclass
class Calibration:
    """The Hessians collected after training, and the seconds they took."""

    hessians: dict[str, torch.Tensor]
    seconds: float


def _collect(plan: Plan, model: torch.nn.Module, data: Any, batches: int, log: Callable[[str], None] | None) -> dict:
    q = plan.quant
    from speedrun.quant.gptq import collect_hessians  # a Plan's choice (artifact.closure)

    hessians = collect_hessians(
        model,
        data.train_batches(),  # a fresh training stream, never validation data (GPTQ fits the weights to it)
        batches,
        device=plan.device,
        autocast_dtype=autocast_dtype(plan),
        progress=Progress("gptq: Hessians", log, unit="batches") if log is not None else None,
        head=q.embed_gptq,
    )
    if plan.device == "cuda":
        torch.cuda.synchronize()
    return hessians


def measure_reserve(plan: Plan, model: torch.nn.Module, data: Any, log: Callable[[str], None]) -> float:
    """Seconds to keep for the Hessians: one calibration batch untimed (first-call costs), two timed, scaled to
    quant.calib_batches with RESERVE_MARGIN. Runs before the clock starts and leaves the model unchanged. With
    model.loop, timed with the loop on: a run with a loop ends with it on, and its Hessians take that many more
    layer calls."""
    looped = model.looped(True) if plan.model.loop.on else contextlib.nullcontext()  # type: ignore[operator]
    with looped:
        _collect(plan, model, data, 1, None)
        t0 = time.perf_counter()
        _collect(plan, model, data, 2, None)
        per_batch = (time.perf_counter() - t0) / 2
    reserve = RESERVE_MARGIN * per_batch * plan.quant.calib_batches
    log(
        f"warm-up: GPTQ's Hessians take {per_batch:.3f} s a batch; {reserve:.1f} s of the time budget kept for "
        f"{plan.quant.calib_batches} batches after the last step (x{RESERVE_MARGIN:g})"
    )
    return reserve


def collect_after_training(plan: Plan, model: torch.nn.Module, data: Any, log: Callable[[str], None]) -> Calibration:
    """GPTQ's Hessians of the trained model (its EMA weights when ema.decay is set), timed."""
    t0 = time.perf_counter()
    hessians = _collect(plan, model, data, plan.quant.calib_batches, log)
    return Calibration(hessians, time.perf_counter() - t0)
