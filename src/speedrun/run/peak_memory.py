"""Peak memory of the timed training, measured the same way for every run (``peak_mem_mb``, ``peak_mem_scope``).

CUDA: ``torch.cuda.max_memory_allocated`` with the peak reset when timed training starts (after warm-up). Under
CUDA graphs (ours or inductor's) the captured step's tensors live in the graph's private memory pool, which the
allocated counter stops counting once capture ends (pgolf_baseline read 559 MB against 11,908 MB without graphs),
so those runs record ``torch.cuda.max_memory_reserved`` instead, scope ``reserved``: what the process held,
cache included, an upper bound rather than an undercount.
CPU: the process's peak resident set size (VmHWM) with the high-water mark reset when timed training starts, by
writing 5 to /proc/self/clear_refs (Linux). It then covers training only: what was already resident (Python,
torch, the model, data pages in use) plus what training added, but not a dataset build or tokenizer training
before it, which can take more memory than the run. Where the reset is not possible (not Linux) the figure is the
whole process's peak (``ru_maxrss``) and ``peak_mem_scope`` says ``process`` instead of ``training``.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


class PeakMemory:
    def __init__(self, device: str, graph_pools: bool = False):
        """graph_pools: training replays CUDA graphs, so count reserved memory (see the module's docstring)."""
        self.device = device
        self.graph_pools = graph_pools and device == "cuda"
        self.scope = "process"

    def start(self) -> None:
        """Reset the high-water mark: from here on the peak is training's."""
        if self.device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
            self.scope = "reserved" if self.graph_pools else "training"
            return
        try:
            with open(_CLEAR_REFS, "w") as f:
                f.write("5")
            self.scope = "training"
        except OSError:
            self.scope = "process"

    def read(self) -> dict[str, Any]:
        """{"peak_mem_mb": ..., "peak_mem_scope": "training" | "reserved" | "process"}."""
        if self.device == "cuda":
            import torch

            peak = torch.cuda.max_memory_reserved() if self.graph_pools else torch.cuda.max_memory_allocated()
            return {"peak_mem_mb": round(peak / 2**20, 1), "peak_mem_scope": self.scope}
        hwm = _vm_hwm_kb() if self.scope == "training" else None
        if hwm is None:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            hwm = rss // 1024 if sys.platform == "darwin" else rss  # bytes on macOS, KiB on Linux
            self.scope = "process"
        return {"peak_mem_mb": round(hwm / 1024, 1), "peak_mem_scope": self.scope}


def _vm_hwm_kb() -> int | None:
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
