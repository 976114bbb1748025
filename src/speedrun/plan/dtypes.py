"""The torch dtypes a Plan's precision names (torch imported when asked, so the resolver stays torch-free)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from speedrun.plan.types import Plan


def autocast_dtype(plan: Plan) -> torch.dtype | None:
    """The torch dtype of Plan.autocast (None: no autocast, fp32). fp8 plans autocast to bf16 around their fp8
    linears, and evaluate in bf16."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.autocast or "")
