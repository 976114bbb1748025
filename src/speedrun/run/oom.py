"""Out of memory as its own outcome: status ``oom``, the phase it happened in, the peak memory, the plan's estimate
and a one-line fix for that phase; with ``hardware.memory_snapshot=true``, the CUDA allocation history dumped to
the run dir for https://pytorch.org/memory_viz.

An OOM is not a bug in the code but a request the card cannot hold, so like a user error it ends the process
with one line and exit status 1 (traceback in error.txt); a sweep records it and goes on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the Plan only as a type: this module is imported before any run needs torch
    from speedrun.plan import Plan

SNAPSHOT_FILE = "memory_snapshot.pickle"
HISTORY_ENTRIES = 100_000
"""Allocation events kept (a ring buffer): enough for the steps before an OOM, bounded in memory."""


def find_oom(exc: BaseException | None) -> BaseException | None:
    """The torch.cuda.OutOfMemoryError behind ``exc`` (itself, or wrapped as a cause, e.g. by torch.compile)."""
    import torch

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def start_history(plan: Plan | None) -> None:
    """Start recording allocations (hardware.memory_snapshot=true on CUDA), before the model is built."""
    if plan is not None and plan.memory_snapshot:
        import torch

        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)


def dump_history(plan: Plan | None, run_dir: Path) -> str | None:
    """Write the recorded history to the run dir; the path, or None when none was recorded or it failed."""
    if plan is None or not plan.memory_snapshot:
        return None
    import torch

    path = run_dir / SNAPSHOT_FILE
    try:
        torch.cuda.memory._dump_snapshot(str(path))
    except Exception:  # noqa: BLE001 - the snapshot is a diagnosis aid; the oom record must still be written
        return None
    return str(path)


def fix_for(phase: str | None, plan: Plan | None) -> str:
    """What to change, for the phase that ran out of memory."""
    if plan is None:
        return "use a smaller model or micro-batch (hardware.micro_batch)"
    if phase == "eval":
        return f"lower eval.batch_size (now {plan.eval.batch_size}); training is unchanged by it"
    if phase == "ttt":
        return f"lower ttt.batch_size (now {plan.ttt.batch_size}) or ttt.chunk_size (now {plan.ttt.chunk_size})"
    if phase == "quant":
        return (
            f"lower hardware.micro_batch (now {plan.micro_batch}; GPTQ calibrates on training micro-batches) "
            f"or use quant=int8"
        )
    attn = (
        "attn=sdpa or attn=flex (math keeps B x H x T x T scores)"
        if "math" in plan.attn_kernel
        else "another attention backend (attn=sdpa, attn=flex)"
    )
    return (
        f"lower hardware.micro_batch (now {plan.micro_batch}; budget.tokens_per_step stays, through more "
        f"accumulation), a shorter model.seq_len (now {plan.model.seq_len}), or {attn}"
    )


def oom_result(plan: Plan | None, phase: str | None, exc: BaseException, run_dir: Path) -> dict[str, Any]:
    """The result keys of a run that ran out of memory: status, error (one line), oom_peak_mem_mb,
    memory_estimate_gb, memory_snapshot."""
    import torch

    peak_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None
    asked = re.search(r"Tried to allocate ([\d.]+ \w+)", str(exc))
    parts = [f"out of memory in {phase or 'setup'}"]
    if asked:
        parts.append(f"tried to allocate {asked.group(1)}")
    if peak_mb is not None:
        parts.append(f"peak {peak_mb:,.0f} MB allocated")
    if plan is not None:
        cap = f", memory cap {plan.memory_cap_gb:g} GB" if plan.memory_cap_gb else ""
        parts.append(f"plan estimate {plan.memory_estimate_gb:g} GB{cap}")
    snapshot = dump_history(plan, run_dir)
    return {
        "status": "oom",
        "error": "; ".join(parts) + f"; fix: {fix_for(phase, plan)}",
        "oom_peak_mem_mb": peak_mb,
        "memory_estimate_gb": plan.memory_estimate_gb if plan else None,
        "memory_snapshot": snapshot,
    }
