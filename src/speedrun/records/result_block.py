"""The grep-able end of every run: one aligned ``key: value`` line per result key (scripts read it)."""

from __future__ import annotations

import math
from typing import Any

BLOCK_KEYS = (
    "status",
    "val_bpb",
    "val_loss",
    "val_bpb_quant",
    "val_bpb_ttt",
    "val_bpb_ttt_base",
    "ttt_complete",
    "artifact_bytes",
    "artifact_model_bytes",
    "artifact_code_bytes",
    "artifact_ok",
    "tokens_per_s",
    "mfu",
    "mfu_profile",
    "peak_mem_mb",
    "steps",
    "tokens",
    "epochs",
    "train_seconds",
    "reached",
    "time_to_target",
    "steps_to_target",
    "tokens_to_target",
    "compile_seconds",
    "eval_seconds",
    "eval_tokens",
    "eval_complete",
    "eval_complete_quant",
    "eval_fingerprint",
    "tokenizer_sha256",
    "data",
    "params",
    "hardware",
    "device_name",
    "world_size",
    "card",
    "emulated",
    "attn_kernel",
    "precision",
    "seed",
    "phase",
    "run_dir",
    "error",
)


def format_result_block(result: dict[str, Any]) -> str:
    """The grep-able end of every run: one aligned ``key: value`` per line."""
    width = max(len(k) for k in BLOCK_KEYS)
    lines = []
    for key in BLOCK_KEYS:
        value = result.get(key)
        if isinstance(value, float) and math.isfinite(value):
            value = f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
        lines.append(f"{key + ':':<{width + 1}} {value}")
    return "\n".join(lines)
