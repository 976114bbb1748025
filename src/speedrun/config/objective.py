"""``objective=<key>``: the result key a sweep optimises, what ``python -m run`` returns to Hydra's sweepers.

Hydra's adaptive sweepers (``hydra/sweeper=optuna``, Ax, Nevergrad) minimise the number the task returns; speedrun
returns this key of the run's result (speedrun.records.objective). The key is checked here, before any work: a
sweep that optimises a key no run records would spend its whole budget learning nothing.
"""

from __future__ import annotations

import difflib

DEFAULT_OBJECTIVE = "val_bpb"

OBJECTIVES: tuple[str, ...] = (
    # quality (lower is better)
    "val_bpb",
    "val_loss",
    "val_bpb_quant",
    "val_loss_quant",
    "val_bpb_ttt",
    "val_loss_ttt",
    "val_bpb_ttt_base",
    "val_loss_ttt_base",
    "train_loss",
    # size
    "artifact_bytes",
    "artifact_model_bytes",
    "artifact_code_bytes",
    "params",
    # time to a target (budget.target_*)
    "time_to_target",
    "steps_to_target",
    "tokens_to_target",
    # time and memory
    "train_seconds",
    "train_loop_seconds",
    "compile_seconds",
    "eval_seconds",
    "eval_seconds_warm",
    "quant_seconds",
    "compress_seconds",
    "ttt_seconds",
    "wall_seconds",
    "peak_mem_mb",
    "memory_estimate_gb",
    "recompiles",
    "eval_recompiles",
    # throughput and work done (higher is better: hydra.sweeper.direction=maximize)
    "tokens_per_s",
    "eval_tokens_per_s",
    "eval_tokens_per_s_quant",
    "ttt_tokens_per_s",
    "mfu",
    "mfu_profile",
    "steps",
    "tokens",
    "train_flops",
    "epochs",
)
"""The numeric result keys (docs/results.md) a sweep may optimise: what a run measures, not the settings it
records. tests/e2e/test_optuna_sweep.py checks them against a real run's result.json."""


def objective_problem(key: str) -> str | None:
    """One line naming what is wrong with ``objective=<key>`` and the fix, or None for a key a sweep can optimise."""
    if key in OBJECTIVES:
        return None
    close = difflib.get_close_matches(key, OBJECTIVES, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? fix: objective={close[0]}" if close else "choose one of them"
    return f"objective={key} is not a numeric result key a sweep can optimise ({', '.join(OBJECTIVES)}); {hint}"
