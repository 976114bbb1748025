"""The compile cache a sweep's jobs share: inductor's FX-graph and AOTAutograd caches and Triton's kernel cache
in one stable directory (outputs/.compile_cache by default), so a job whose shapes an earlier job on this machine
already compiled loads the compiled artifacts instead of recompiling (compile_seconds shows it).

torch's defaults (/tmp/torchinductor_$USER, ~/.triton/cache) are shared too, but /tmp is per job under some
schedulers and cleaned on reboot; a directory beside the results survives both. The pool launcher sets the
variables for its jobs (never overriding ones the user set); each run records what its compile hit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
"""Environment variable -> subdirectory of the shared cache."""


def cache_env(root: Path | None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables to add to a job's environment for a cache under ``root`` (None: none); variables already in
    ``environ`` are left alone, so a user's own cache location wins."""
    if root is None:
        return {}
    root = Path(root).expanduser().resolve()
    return {var: str(root / sub) for var, sub in CACHE_VARS.items() if not environ.get(var)}


def cache_stats() -> dict[str, Any]:
    """Result keys: where this process's compile cache lives and how many graphs it found there or compiled
    (inductor's FX-graph cache and AOTAutograd's), from dynamo's counters."""
    from torch._dynamo.utils import counters

    inductor: dict[str, int] = counters.get("inductor", {})
    aot: dict[str, int] = counters.get("aot_autograd", {})
    hits = int(inductor.get("fxgraph_cache_hit", 0)) + int(aot.get("autograd_cache_hit", 0))
    misses = int(inductor.get("fxgraph_cache_miss", 0)) + int(aot.get("autograd_cache_miss", 0))
    return {
        "compile_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "compile_cache_hits": hits,
        "compile_cache_misses": misses,
    }
