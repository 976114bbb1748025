"""The pool launcher's GPUs: which are visible, the slots jobs run in, and which free slots a job of N ranks takes.

Kept apart from pool_launcher.py so that module stays about running jobs. No torch import at module level (Hydra
loads the plugins on every start).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any


def visible_gpus() -> list[str]:
    """GPU ids as CUDA_VISIBLE_DEVICES spells them, without touching CUDA in this process."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [d.strip() for d in env.split(",") if d.strip()]
        # CUDA stops at the first invalid id; "-1" is the usual way to hide every GPU
        out = []
        for d in ids:
            if d.startswith("-"):
                break
            out.append(d)
        return out
    if shutil.which("nvidia-smi"):
        try:
            proc = subprocess.run(
                ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
            if proc.returncode == 0:
                return [line.strip() for line in proc.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no torch, no CUDA: a CPU machine
        return []


def pool_slots(gpus: Any, jobs_per_gpu: int, cpu_jobs: int) -> list[str | None]:
    """One entry per concurrent job: a GPU id, or None for a CPU slot."""
    if gpus is None:
        ids = visible_gpus()
    elif isinstance(gpus, int) and not isinstance(gpus, bool):
        visible = visible_gpus()
        if gpus > len(visible):
            raise ValueError(f"hydra.launcher.gpus={gpus}: only {len(visible)} GPU(s) visible ({visible})")
        ids = visible[:gpus]
    elif isinstance(gpus, str):
        ids = [g.strip() for g in gpus.split(",") if g.strip()]
    else:
        ids = [str(g) for g in gpus]
    if not ids:
        return [None] * max(1, int(cpu_jobs))
    return [g for g in ids for _ in range(max(1, int(jobs_per_gpu)))]


def take_slots(slots: list[str | None], free: list[int], gpus: int) -> list[int] | None:
    """Take (remove from ``free``) the slots for a job that needs ``gpus`` distinct GPUs at once (its dist.nproc),
    the first free ones in order. None: not enough are free now (the job waits); []: the pool has fewer GPUs than
    that, so it can never start. A CPU pool gives any job one slot (its ranks share the machine's cores)."""
    if not free:
        return None
    if all(s is None for s in slots):
        return [free.pop(0)]
    if gpus > len({s for s in slots if s is not None}):
        return []
    chosen: list[int] = []
    for i in free:
        if slots[i] not in {slots[j] for j in chosen}:
            chosen.append(i)
        if len(chosen) == gpus:
            for j in chosen:
                free.remove(j)
            return chosen
    return None
