"""Training FLOPs and MFU, by the convention in docs/architecture.md ("MFU convention").

Per token at context T: 6 x matmul parameters + 12 x layers x d_model x T_eff (ModelShape.flops_per_token), with
    T_eff = T                  full causal attention, no halving for the causal mask (nanochat / autoresearch)
    T_eff = min(window, T)     a sliding window (attn.window): a query sees at most `window` keys, and the kernel
                               skips the rest (nanochat's estimate_flops counts windows the same way)
    document masks: not discounted. What they skip depends on where documents end in the data; counting the full
    T keeps a run's FLOPs a function of the model and schedule alone.
A progressive schedule charges each token the T_eff of the stage it was trained in (TrainState.stages holds
each stage's start step; tokens per step are the same in every stage). With model.loop, a stage entry that says
``loop: true`` (the loop switched on at its start step) charges its tokens the looped FLOPs: every looped layer
counted once per call (ModelShape.flops_per_token(T, looped=True)).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from speedrun.core.model import ModelShape

if TYPE_CHECKING:  # the Plan only as a type: the FLOPs arithmetic imports no torch
    from speedrun.plan.types import Plan

log = logging.getLogger("speedrun")


def stage_tokens(
    stages: Sequence[dict[str, Any]], steps: int, tokens_per_step: int, default_seq_len: int
) -> list[tuple[int, ...]]:
    """(seq_len, tokens trained at it) for each stage that ran, (seq_len, tokens, True) for one trained with
    model.loop on; every token at ``default_seq_len`` if none ran."""
    if not stages:
        return [(default_seq_len, steps * tokens_per_step)]
    out: list[tuple[int, ...]] = []
    for i, stage in enumerate(stages):
        end = stages[i + 1]["start_step"] if i + 1 < len(stages) else steps
        entry = (int(stage["seq_len"]), max(0, end - int(stage["start_step"])) * tokens_per_step)
        out.append(entry + (True,) if stage.get("loop") else entry)
    return out


def training_flops(model: ModelShape, per_stage: Sequence[tuple[int, ...]], window: int | None = None) -> int:
    """Model FLOPs of training ``per_stage`` = [(seq_len, tokens), ...] by the convention above; an entry
    (seq_len, tokens, True) was trained with model.loop on."""
    return sum(
        entry[1]
        * model.flops_per_token(min(entry[0], window) if window else entry[0], looped=len(entry) > 2 and bool(entry[2]))
        for entry in per_stage
    )


def mfu_keys(plan: Plan, stages: Sequence[dict[str, Any]], steps: int, train_seconds: float) -> dict[str, Any]:
    """The result keys: flops_per_token (mean over the tokens trained), train_flops, mfu (the card that ran),
    mfu_profile (the emulated profile's peak, emulated runs only), card. mfu is None on CPU and on unknown cards."""
    per_stage = stage_tokens(stages, steps, plan.tokens_per_step, plan.model.seq_len)
    tokens = sum(entry[1] for entry in per_stage)
    flops = training_flops(plan.model, per_stage, dict(plan.attn_options).get("window"))
    out: dict[str, Any] = {
        "card": plan.card,
        "train_flops": flops,
        "flops_per_token": round(flops / tokens) if tokens else None,
        "mfu": None,
    }
    if plan.emulated:
        out["mfu_profile"] = None
    if not flops or train_seconds <= 0:
        return out
    # flops are the whole run's (tokens are global), so the peak is every rank's card together
    achieved = flops / train_seconds / getattr(plan, "world_size", 1)
    if plan.peak_flops:
        out["mfu"] = round(achieved / plan.peak_flops, 4)
    elif plan.device == "cuda":
        log.warning(
            "mfu: no peak FLOP/s known for %r (not in speedrun.hardware.cards): mfu is null; add the card's dense "
            "datasheet peaks to speedrun/hardware/cards.py",
            plan.device_name,
        )
    if plan.emulated and plan.profile_peak_flops:
        # what the recipe would score if the emulated card ran this fast: can exceed 1
        out["mfu_profile"] = round(achieved / plan.profile_peak_flops, 4)
    return out
