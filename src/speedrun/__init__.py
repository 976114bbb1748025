"""speedrun: declarative experiment orchestration for small GPT training runs.

The package imports nothing heavy at import time; ``main`` pulls in torch and the rest when a run starts.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def main(cfg: Any) -> dict[str, Any]:
    """Run one job from a composed Hydra config; returns the result record (also written to disk)."""
    from .runner import run_job

    return run_job(cfg)
