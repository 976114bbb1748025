"""The export's record keeping around the core's quantization (speedrun.core.quant, speedrun.core.gptq): the Plan's
quant block as QuantSettings, GPTQ's Hessians on the training clock, the float weights kept, the log lines and the
per-tensor report.

GPTQ's Hessians read training data, so parameter-golf counts them as training. Warm-up measures what the collection
will take (``measure_reserve``) and the loop stops that much before the time limit; the Hessians are then collected
right after the last step (speedrun.core.pipeline.gptq_hessians), before anything is scored, so that
``train_seconds`` (the loop's clock + the Hessians) runs from the first step to the last read of training data, less
the pauses the loop's clock leaves out (periodic validation, checkpoints), and the export quantizes with them later
(speedrun.run.finish).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speedrun.core.gptq import Calibration, calibrate
from speedrun.core.quant import Artifact, Quantized, export_packed
from speedrun.core.train import autocast_dtype
from speedrun.plan.types import Plan
from speedrun.records.quant_report import rules_of, tensor_report

FLOAT_WEIGHTS = "model.pt"
"""quant.keep_weights: the float state dict the export quantized, in the run dir (scripts/quant_table.py reads it)."""

COMPRESS_WORKERS = max(1, (os.cpu_count() or 2) - 1)
"""Threads of the pergroup compression: every core but one, which the round-trip score beside it drives."""

RESERVE_MARGIN = 1.25
"""The measured collection time is scaled by this: a run whose Hessians take a little longer than warm-up's
estimate (a busier host, a later allocation) still fits its budget, and quant_reserve_ok says if it did not."""


def _calibrate(plan: Plan, model: Any, data: Any, batches: int, log: Callable[[str], None] | None) -> Calibration:
    return calibrate(
        model,
        data.train_batches(),  # a fresh training stream, never validation data (GPTQ fits the weights to it)
        batches,
        device=plan.device,
        autocast_dtype=autocast_dtype(plan.autocast),
        head=plan.quant.embed_gptq,
        log=log,
    )


def measure_reserve(plan: Plan, model: torch.nn.Module, data: Any, log: Callable[[str], None]) -> float:
    """Seconds to keep for the Hessians: one calibration batch untimed (first-call costs), two timed, scaled to
    quant.calib_batches with RESERVE_MARGIN. Runs before the clock starts and leaves the model unchanged. With
    model.loop, timed with the loop on: a run with a loop ends with it on, and its Hessians take that many more
    layer calls."""
    looped = model.looped(True) if plan.model.loop.on else contextlib.nullcontext()  # type: ignore[operator]
    with looped:
        _calibrate(plan, model, data, 1, None)
        per_batch = _calibrate(plan, model, data, 2, None).seconds / 2
    reserve = RESERVE_MARGIN * per_batch * plan.quant.calib_batches
    log(
        f"warm-up: GPTQ's Hessians take {per_batch:.3f} s a batch; {reserve:.1f} s of the time budget kept for "
        f"{plan.quant.calib_batches} batches after the last step (x{RESERVE_MARGIN:g})"
    )
    return reserve


def keep_quantized(plan: Plan, quantized: Quantized, run_dir: Path, log: Callable[[str], None], seconds: float) -> None:
    """What the shell does with the codes once the core quantized them (rank 0): quant.keep_weights saves the float
    weights to <run dir>/model.pt, and a GPTQ export says what it did (``seconds``: the quantization's)."""
    q = plan.quant
    if q.keep_weights:
        torch.save(quantized.state, run_dir / FLOAT_WEIGHTS)
    if q.name != "int8":
        gptq = sum(name in quantized.hessians for name in quantized.packed)
        levers = ", ".join(q.levers_on()) or "no levers"
        log(
            f"quant: GPTQ on {gptq} matrices (Hessians of {q.calib_batches} training batches), quantized in "
            f"{seconds:.1f} s, int{q.bits} blocks, int{q.embed_bits} embeddings; {levers}"
        )


def compress_quantized(
    plan: Plan, quantized: Quantized, log: Callable[[str], None], workers: int | None = None
) -> Artifact:
    """Serialize and compress the codes; the Artifact's ``extra`` carries the per-tensor report and the export's
    timings. Reads nothing but ``quantized`` (it runs on a thread beside the round-trip score)."""
    q = plan.quant
    artifact = export_packed(quantized.packed, str(q.compressor), q.level, log, str(q.pergroup_codec), workers)
    rules = rules_of(quantized.packed, quantized.hessians, q)
    report = tensor_report(
        quantized.state, quantized.packed, rules, quantized.hessians, artifact.group_bytes, str(q.compressor)
    )
    return dataclasses.replace(artifact, extra={**quantized.extra, "report": report})
