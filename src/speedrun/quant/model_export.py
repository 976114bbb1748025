"""The export's model side: quantize a trained model (int8, or GPTQ int6 with Hessians from training batches),
compress the codes into the artifact's bytes, and check that the file read back holds exactly the codes scored.

speedrun.run.finish runs these in two overlapped steps (the round-trip score beside the compression);
export_artifact does both in one go for scripts.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speedrun.config.choices import QuantName
from speedrun.plan.types import Plan
from speedrun.progress import Progress
from speedrun.quant.calibration import collect_after_training
from speedrun.quant.quantize import Artifact, export_packed, quantize_int6, quantize_state_dict
from speedrun.quant.report import tensor_report

FLOAT_WEIGHTS = "model.pt"
"""quant.keep_weights: the float state dict the export quantized, in the run dir (scripts/quant_table.py reads it)."""

COMPRESS_WORKERS = max(1, (os.cpu_count() or 2) - 1)
"""Threads of the pergroup compression: every core but one, which the round-trip score beside it drives."""


@dataclasses.dataclass
class Quantized:
    """What the export computed before compression (rank 0): the codes and what the per-tensor report needs."""

    packed: dict[str, dict[str, torch.Tensor]]
    """The packed state dict (codes, scales, LQER factors, fp16 and raw tensors), on the CPU."""
    state: dict[str, torch.Tensor]
    """The float weights that were quantized: a CPU copy, since the model's own tensors take the dequantized ones."""
    rules: dict[str, dict[str, Any]]
    hessians: dict[str, torch.Tensor]
    extra: dict[str, Any]


def quantize_model(
    plan: Plan,
    model: torch.nn.Module,
    data: Any,
    log: Callable[[str], None],
    run_dir: Path,
    hessians: dict[str, torch.Tensor] | None = None,
) -> Quantized:
    """Quantize the model (rank 0). int6: with the ``hessians`` collected after training, or, without them, collected
    here (recording quant_hessian_seconds in ``extra``). quant.keep_weights: the float weights to <run dir>/model.pt
    first."""
    q = plan.quant
    state = model.state_dict()  # quantized where the weights are (GPTQ, clip searches on the GPU), as before
    # the report's float weights: a CPU copy, since the model's own tensors take the dequantized ones next
    float_state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
    if q.keep_weights:
        torch.save(float_state, run_dir / FLOAT_WEIGHTS)
    extra: dict[str, Any] = {}
    rules: dict[str, dict[str, Any]] = {}
    if q.name == QuantName.int8:
        packed = quantize_state_dict(state)
        hessians = {}
    else:
        if hessians is None:
            calibration = collect_after_training(plan, model, data, log)
            hessians = calibration.hessians
            extra["quant_hessian_seconds"] = round(calibration.seconds, 3)
        t1 = time.perf_counter()
        packed, rules = quantize_int6(state, hessians, q, Progress(f"gptq: int{q.bits}", log, unit="matrices"))
        gptq = sum(r["method"] == "gptq" for r in rules.values())
        levers = ", ".join(q.levers_on()) or "no levers"
        log(
            f"quant: GPTQ on {gptq} matrices (Hessians of {q.calib_batches} training batches), quantized in "
            f"{time.perf_counter() - t1:.1f} s, int{q.bits} blocks, int{q.embed_bits} embeddings; {levers}"
        )
    packed = {name: {f: t.detach().cpu() for f, t in entry.items()} for name, entry in packed.items()}
    hessians = {name: h.detach().cpu() for name, h in hessians.items()}  # the report thread touches no GPU
    return Quantized(packed, float_state, rules, hessians, extra)


def compress_quantized(
    plan: Plan, quantized: Quantized, log: Callable[[str], None], workers: int | None = None
) -> Artifact:
    """Serialize and compress the codes; the Artifact's ``extra`` carries the per-tensor report and the export's
    timings. Reads nothing but ``quantized`` (it runs on a thread beside the round-trip score)."""
    q = plan.quant
    artifact = export_packed(quantized.packed, str(q.compressor), q.level, log, str(q.pergroup_codec), workers)
    report = tensor_report(
        quantized.state, quantized.packed, quantized.rules, quantized.hessians, artifact.group_bytes, str(q.compressor)
    )
    return dataclasses.replace(artifact, extra={**quantized.extra, "report": report})


def export_artifact(
    plan: Plan, model: torch.nn.Module, data: Any, log: Callable[[str], None], run_dir: Path
) -> Artifact:
    """Quantize and compress the model in one go (rank 0): what the finishing phase does in two overlapped steps."""
    return compress_quantized(plan, quantize_model(plan, model, data, log, run_dir), log)


def check_round_trip(
    read: dict[str, dict[str, torch.Tensor]], scored: dict[str, dict[str, torch.Tensor]], path: Path
) -> None:
    """The artifact read back must hold exactly the codes whose dequantized weights were scored (val_bpb_quant is
    a claim about the file), tensor for tensor, bit for bit."""
    if list(read) != list(scored):
        missing, extra = sorted(set(scored) - set(read)), sorted(set(read) - set(scored))
        raise RuntimeError(
            f"{path}: the artifact's tensors differ from those scored (missing {missing}, extra {extra})"
        )
    for name, entry in scored.items():
        got = read[name]
        for f, t in entry.items():
            if f not in got or got[f].dtype != t.dtype or not torch.equal(got[f], t):
                raise RuntimeError(
                    f"{path}: {name}.{f} read back from the artifact differs from the codes scored; the compressor "
                    f"({type(got.get(f)).__name__}) did not round-trip, so val_bpb_quant would not be the file's"
                )
