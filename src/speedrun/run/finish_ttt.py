"""The TTT phase of the finish: the plan's ttt block as score-first TTT's settings, and its result keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from speedrun.config import TTTConfig
from speedrun.core.ttt_lora import GlobalSettings, TTTSettings
from speedrun.core.ttt_score import ttt_evaluate
from speedrun.plan.settings import settings
from speedrun.plan.types import Plan


def run_ttt(
    plan: Plan,
    model: torch.nn.Module,
    data: Any,
    autocast_dtype: Any,
    log: Callable[[str], None],
    world: Any = None,
    on_clock: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Score-first TTT as the plan sets it; its result keys (val_bpb_ttt, ttt_*), and one log line."""
    res = ttt_evaluate(
        model,
        data.val_tokens,
        data.luts,
        ttt_settings(plan),
        bos_id=data.bos_id,
        seq_len=plan.model.seq_len,
        device=plan.device,
        autocast_dtype=autocast_dtype,
        log=log,
        shard=world,
        on_clock=on_clock,
    )
    t = plan.ttt
    phased = (
        f", {res.phases_done}/{t.phased.phases} global phases in {res.global_seconds:.1f} s" if t.phased.phases else ""
    )
    log(
        f"ttt ({t.name}, rank {t.rank}, targets {t.targets}): val_bpb_ttt "
        f"{'n/a' if res.val_bpb is None else f'{res.val_bpb:.4f}'} (unadapted "
        f"{'n/a' if res.base_val_bpb is None else f'{res.base_val_bpb:.4f}'}) over {res.tokens_scored:,}/{res.tokens_total:,} "
        f"tokens ({100 * res.fraction:.1f}%) of {res.docs_total:,} documents in {res.seconds:.1f} s{phased}"
    )
    return ttt_keys(res, t)


def ttt_settings(plan: Plan) -> TTTSettings:
    """The plan's ttt block as ttt_evaluate takes it."""
    t = plan.ttt
    return settings(
        TTTSettings,
        t,
        seed=plan.seed,
        batch_size=t.batch_size or plan.eval.batch_size,  # the resolver fills it; None only in a hand-made plan
        compile="inductor" if t.compile else None,
        cuda_graphs=bool(t.cuda_graphs),
        # a step's activations never exceed a training micro-step's
        phased=settings(GlobalSettings, t.phased, micro_rows=plan.micro_batch),
    )


def ttt_keys(res: Any, t: TTTConfig) -> dict[str, Any]:
    """TTT's result keys: its scores, coverage, timings and graph counts, and how it learnt (ttt_setting_keys)."""
    return dict(
        val_bpb_ttt=None if res.val_bpb is None else round(res.val_bpb, 6),
        val_loss_ttt=None if res.val_loss is None else round(res.val_loss, 6),
        val_bpb_ttt_base=None if res.base_val_bpb is None else round(res.base_val_bpb, 6),
        val_loss_ttt_base=None if res.base_val_loss is None else round(res.base_val_loss, 6),
        ttt_seconds=round(res.seconds, 3),
        ttt_tokens_scored=res.tokens_scored,
        ttt_fraction=round(res.fraction, 6),
        ttt_complete=res.complete,
        ttt_docs=res.docs_total,
        ttt_tokens_per_s=None if res.tokens_per_s is None else round(res.tokens_per_s, 1),
        ttt_compile_seconds=round(res.compile_seconds, 3),
        ttt_recompiles=res.recompiles,
        ttt_cuda_graphs_captured=res.cuda_graphs,
        ttt_cuda_graphs_late=res.cuda_graphs_late,
        ttt_rank_seconds=res.rank_seconds,
        ttt_rank_cost=res.rank_cost,
        **ttt_setting_keys(t),
        ttt_phases_done=res.phases_done,
        ttt_phased_steps=res.global_steps,
        ttt_phased_tokens=res.global_tokens,
        ttt_phased_seconds=round(res.global_seconds, 3),
    )


def ttt_setting_keys(t: TTTConfig) -> dict[str, Any]:
    """How TTT learnt, as flat ttt_* result keys (the phased knobs as ttt_phased_*), so the report can group runs by
    them without reading the config."""
    keys: dict[str, Any] = {
        f"ttt_{name}": getattr(t, name)
        for name in ("rank", "alpha", "lr", "local_lr_mult", "beta1", "beta2", "eps", "momentum", "weight_decay")
    }
    keys.update(
        ttt_optimizer=str(t.optimizer),
        ttt_warm_start_a=t.warm_start_a,
        ttt_warm_start_chains=t.warm_start_chains,
        ttt_compile=t.compile,
        ttt_compile_scope=t.compile_scope,
        ttt_cuda_graphs=t.cuda_graphs,
        ttt_row_widths=t.row_widths,
        ttt_graph_rows=t.graph_rows,
        ttt_shared_attn_a=t.shared_attn_a,
        ttt_max_batch_share=t.max_batch_share,
        ttt_targets=t.targets,
        ttt_chunk_size=t.chunk_size,
        ttt_short_chunks=t.short_chunks,
        ttt_batch_size=t.batch_size,
    )
    keys.update((f"ttt_phased_{f.name}", getattr(t.phased, f.name)) for f in dataclasses.fields(t.phased))
    return keys
