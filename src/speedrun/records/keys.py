"""The result keys of a run's settings: what result.json and the results row record of the model, the optimizer,
the schedule, the EMA, the export's levers and the CPU threads, flat and prefixed, so a sweep over any of them
groups in the report (every other field is in plan.json).

Functions of the settings, not methods on them: the types the core computes with and the config's schemas hold no
record keeping."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from speedrun.config import TTTConfig
from speedrun.config.quant import TENSOR_CLASSES, QuantConfig
from speedrun.config.training import EMAConfig, OptimConfig, ScheduleConfig
from speedrun.core.model import ModelShape

if TYPE_CHECKING:  # a CPU run's alone: a GPU run's file need not carry it
    from speedrun.hardware.threads import ThreadChoice

__all__ = ["model_keys", "optim_keys", "quant_keys", "thread_keys", "ttt_keys", "ttt_setting_keys"]


def model_keys(shape: ModelShape) -> dict[str, Any]:
    """Every record lever of the model's shape, ``model_``-prefixed and flat (the full shape is in plan.json)."""
    return {
        "model_mlp_act": shape.mlp_act,
        "model_mlp_leaky_slope": shape.mlp_leaky_slope,
        "model_rope_dims": shape.rope_dims or None,
        "model_ln_scale": shape.ln_scale,
        "model_qk_gain_init": shape.qk_gain_init,
        "model_xsa_last_n": shape.xsa_last_n,
        "model_skip_gates": shape.skip_gates,
        "model_loop_start": shape.loop.start,
        "model_loop_end": shape.loop.end,
        "model_loop_num": shape.loop.num,
        "model_loop_enable_at": shape.loop.enable_at,
        "model_parallel_start_layer": shape.parallel_start_layer or None,
        "model_parallel_final_lane": shape.parallel_final_lane,
        "model_smear_gate_window": shape.smear_gate.window,
        "model_attn_out_gate_window": shape.attn_out_gate.window,
        "model_attn_out_gate_scale": shape.attn_out_gate.scale,
        "model_attn_out_gate_init_std": shape.attn_out_gate.init_std,
    }


def optim_keys(optim: OptimConfig, schedule: ScheduleConfig, ema: EMAConfig) -> dict[str, Any]:
    """The optimizer, schedule and EMA levers of the record stack: muon_wd, muon_row_normalize, ns_coefficients,
    adam_wd, embed_wd, the momentum warm-up, min_lr, ema_decay (the decay that ran: ema.horizon's once the run's
    steps resolved it; None when off) and ema_horizon."""
    return {
        "muon_wd": optim.muon_wd,
        "muon_row_normalize": optim.muon_row_normalize,
        "ns_coefficients": str(optim.ns_coefficients),
        "adam_wd": optim.adam_wd,
        "embed_wd": optim.embed_wd,
        "muon_momentum_warmup_steps": optim.muon_momentum_warmup_steps,
        "muon_momentum_warmup_frac": optim.muon_momentum_warmup_frac,
        "min_lr": schedule.min_lr,
        "ema_decay": ema.decay if ema.decay else None,
        "ema_horizon": ema.horizon,
    }


def quant_keys(q: QuantConfig) -> dict[str, Any]:
    """The export's levers (quant_*), null where a lever does not apply: every key with quant=off, the sigmas
    without clip=sigma, LQER's knobs at rank 0."""
    on = str(q.name) != "off"
    int6 = str(q.name) == "int6"
    sigma = int6 and str(q.clip) == "sigma"
    lqer = int6 and q.lqer.rank > 0
    awq = int6 and q.awq.top_k > 0
    return {
        "quant_bits": q.bits if int6 else None,
        "quant_embed_bits": q.embed_bits if int6 else None,
        "quant_clip": str(q.clip) if int6 else None,
        **{f"quant_sigmas_{c}": q.sigmas.of(c) if sigma else None for c in TENSOR_CLASSES},
        "quant_embed_gptq": q.embed_gptq if int6 else None,
        "quant_lqer_rank": q.lqer.rank if int6 else None,
        "quant_lqer_top_k": q.lqer.top_k if lqer else None,
        "quant_lqer_factor_bits": q.lqer.factor_bits if lqer else None,
        "quant_lqer_asym_group": q.lqer.asym_group if lqer else None,
        "quant_awq_top_k": q.awq.top_k if int6 else None,
        "quant_awq_bits": q.awq.bits if awq else None,
        "quant_awq_group_size": q.awq.group_size if awq else None,
        "quant_logit_rescale": True if q.logit_rescale else None,
        "quant_gate_bits": q.gate_bits if int6 else None,
        "quant_reserve_seconds": q.reserve_seconds if int6 else None,
        "quant_pergroup_codec": str(q.pergroup_codec) if on and str(q.compressor) == "pergroup" else None,
    }


def thread_keys(t: ThreadChoice) -> dict[str, Any]:
    """A CPU run's threads: how many, who chose them, and how busy the other cores were when measured."""
    return {
        "cpu_threads": t.threads,
        "cpu_threads_source": t.source,
        "cpu_cores_busy": None if t.busy is None else round(t.busy, 2),
    }


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
