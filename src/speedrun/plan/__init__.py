"""The resolver: requested config + detected device -> a frozen Plan, or a PlanError naming what works.

Every decision about what will run is made here, once, before any data is built or GPU time is spent. After
``resolve`` the Plan is the only description of the run: build, train, evaluate and finalize read it and never
the config, and plan.json (``Plan.to_dict``) is exactly what ran. Checks that need no device live beside their
fields in speedrun.config; this module keeps the ones that need the device, the model or the data.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from speedrun.config import ArtifactConfig, Config, DataConfig, EMAConfig, QuantConfig
from speedrun.config.choices import PrecisionName, QuantName, TTTName
from speedrun.config.code_rule import check_code_rule
from speedrun.config.quant import check_compressor
from speedrun.core.data import GPT2, is_tiktoken, require_tiktoken
from speedrun.core.model import ModelShape
from speedrun.errors import PlanError
from speedrun.hardware.cards import card_for
from speedrun.hardware.profiles import PROFILES, DetectedDevice, HardwareProfile
from speedrun.plan.attention import check_scores_memory, resolve_attention, scores_bytes
from speedrun.plan.batch import StepSplit, resolve_batch, stages_of
from speedrun.plan.budget import resolve_budget
from speedrun.plan.dist_choice import DistPlan, WorldInfo
from speedrun.plan.kernel_choice import graph_warmup_steps, resolve_kernel
from speedrun.plan.memory import param_count, training_memory_bytes
from speedrun.plan.model_choice import load_option, model_class, resolve_arch, resolve_model
from speedrun.plan.scoring import resolve_eval, resolve_ttt
from speedrun.plan.types import BudgetPlan, DataPlan, EvalPlan, KernelPlan, Plan, Stage, plan_json

__all__ = [
    "Plan",
    "BudgetPlan",
    "PlanError",
    "Stage",
    "EvalPlan",
    "DataPlan",
    "DistPlan",
    "KernelPlan",
    "WorldInfo",
    "resolve",
    "load_option",
    "plan_json",
]


def choose_profile(requested: str, device: DetectedDevice) -> tuple[HardwareProfile, bool]:
    """The profile to run and whether it is emulated on a bigger device."""
    if requested == "auto":
        return device.profile, False
    profile = PROFILES[requested]
    if profile.device_type == "cpu":
        return profile, False
    if device.device_type != "cuda":
        raise PlanError(
            f"hardware={requested} needs a CUDA GPU, and none is visible here; use hardware=auto or hardware=cpu"
        )
    if profile.family == device.profile.family:
        # Same chip family but another profile (an H200 asked to be an h100): the recipe runs with the profile's
        # memory cap on a card that is not the profile's, so it is emulation, and recorded as such.
        return profile, profile.name != device.profile.name
    # a CPU (no capability, no GPU memory) is smaller than any GPU
    too_big = (profile.capability or (0, 0)) > (device.capability or (0, 0)) or (profile.memory_gb or 0) > (
        device.memory_gb or 0
    ) + 1
    if too_big:
        raise PlanError(
            f"hardware={requested} (sm{_sm(profile.capability)}, {profile.memory_gb:g} GB) is larger than this "
            f"device ({device.name}, sm{_sm(device.capability)}, {device.memory_gb:.0f} GB) and cannot be emulated; "
            f"use hardware=auto or a smaller profile"
        )
    return profile, True


def resolve(cfg: Config, device: DetectedDevice, cwd: Path | None = None, world: WorldInfo | None = None) -> Plan:
    """Check the requested combination against the device and fill every ``auto``/None from the profile.

    cwd: where relative data paths are taken from (the directory `python -m run` started in). world: the
    processes of the run as this one's environment tells (speedrun.distributed.world.current; None: a single process)."""
    profile, emulated = choose_profile(str(cfg.hardware.name), device)
    on_cuda = profile.device_type == "cuda"
    precision, matmul_dtype = _resolve_precision(cfg, profile)
    model_name, model = resolve_model(cfg, profile)
    model_arch, model_options = resolve_arch(cfg)
    lengths = cfg.schedule.stages()
    if lengths:
        # RoPE tables (and eval) are sized for the longest length.
        model = dataclasses.replace(model, seq_len=max(length for length, _ in lengths))
    attn, attn_options, attn_kernel = resolve_attention(cfg, profile, precision, model)
    batch = resolve_batch(cfg, profile, model_name, model, world, lengths)
    check_scores_memory(attn, attn_options, batch.micro_batch, model, profile, precision)
    micro_tokens = batch.micro_batch * model.seq_len
    stages = stages_of(lengths, micro_tokens) if lengths else (Stage(model.seq_len, 1.0, batch.micro_batch),)
    budget = resolve_budget(cfg, profile)
    eval_plan = resolve_eval(cfg, profile, attn, model, batch.micro_batch, batch.search)
    hooks = tuple(getattr(model_class(cfg.model.arch), "ttt_hooks", ())) if cfg.ttt.name != TTTName.off else ()
    ttt = resolve_ttt(cfg.ttt, model, eval_plan.batch_size, batch.dist.world_size, on_cuda, hooks)
    _check_code_rule(cfg.artifact, cfg.quant)
    _check_quant(cfg.quant)
    # a contest's rules (conf/track/): what the run cannot comply with whatever happens on the way
    cfg.track.check_plan(eval_plan.tokens, budget.seconds, ttt.name != TTTName.off, ttt.max_seconds)
    compile_on = cfg.hardware.compile if cfg.hardware.compile is not None else on_cuda
    kernel, attn_options, warmup_steps = _resolve_kernel(
        cfg, profile, precision, model, attn, attn_options, batch, compile_on
    )
    return Plan(
        name=cfg.name,
        seed=cfg.seed,
        device=profile.device_type,
        hardware=profile.name,
        device_name=device.name,
        emulated=emulated,
        memory_cap_gb=cfg.hardware.memory_cap_gb or (profile.memory_gb if emulated else None),
        **_precision_fields(profile, device, emulated, precision, matmul_dtype),
        attn=attn,
        attn_options=tuple(sorted(attn_options.items())),
        attn_kernel=attn_kernel,
        document_mask=cfg.attn.document_mask,
        model_name=model_name,
        model=model,
        model_arch=model_arch,
        model_options=model_options,
        micro_batch=batch.micro_batch,
        stages=stages,
        stage_progress=str(cfg.schedule.progress),
        schedule=cfg.schedule,
        grad_accum=batch.grad_accum,
        tokens_per_step=batch.tokens_per_step,
        budget=budget,
        warmup_steps=warmup_steps,
        eval=eval_plan,
        compile=compile_on,
        memory_estimate_gb=_memory_estimate_gb(
            attn, attn_options, batch.micro_batch, model, precision, kernel.fused_ce_chunk
        ),
        memory_snapshot=bool(cfg.hardware.memory_snapshot) and on_cuda,
        optim=cfg.optim,
        quant=cfg.quant,
        ttt=ttt,
        data=_resolve_data(cfg.data, cwd or Path.cwd()),
        logger=cfg.logger,
        checkpoint=cfg.checkpoint,
        micro_batch_search=batch.search,
        dist=batch.dist,
        kernel=kernel,
        ema=EMAConfig(decay=cfg.ema.decay or None, horizon=cfg.ema.horizon),  # 0 is off too: plan.json says null
        artifact=cfg.artifact,
        target_metric=cfg.budget.target[0] if cfg.budget.target else None,
        target_value=cfg.budget.target[1] if cfg.budget.target else None,
        track=cfg.track,
        threads=cfg.hardware.threads,
    )


def _precision_fields(
    profile: HardwareProfile, device: DetectedDevice, emulated: bool, precision: str, matmul_dtype: str
) -> dict[str, Any]:
    """The Plan's dtypes and the peaks MFU divides by (the card that runs, and the emulated profile's)."""
    on_cuda = profile.device_type == "cuda"
    card = card_for(device.name) if on_cuda else None
    return {
        "precision": precision,
        "autocast": {"bf16": "bf16", "fp8": "bf16", "fp16": "fp16"}.get(precision),
        "grad_scaler": precision == "fp16",
        "matmul_dtype": matmul_dtype,
        "card": card.name if card else None,
        "peak_flops": card.peak_flops(matmul_dtype) if card else None,
        "profile_peak_flops": profile.peak_flops(matmul_dtype) if emulated else None,
        "ns_dtype": "bf16" if on_cuda and profile.has_bf16 else "fp32",
    }


def _resolve_precision(cfg: Config, profile: HardwareProfile) -> tuple[str, str]:
    """The precision that runs and the dtype whose peak MFU divides by."""
    precision = profile.precision if cfg.precision.name == PrecisionName.auto else str(cfg.precision.name)
    _check_precision(precision, profile)
    if precision == "fp32" and profile.device_type == "cuda" and "tf32" in profile.peak_tflops:
        return precision, "tf32"  # we enable TF32 matmuls for fp32 on sm80+, so that is the peak to divide by
    # fp8: the block linears run in fp8 (forward and backward), lm_head and attention in bf16. Dividing all
    # FLOPs by the fp8 peak understates MFU a little rather than flattering it.
    return precision, precision


def _resolve_kernel(
    cfg: Config,
    profile: HardwareProfile,
    precision: str,
    model: ModelShape,
    attn: str,
    attn_options: dict[str, Any],
    batch: StepSplit,
    compile_on: bool,
) -> tuple[KernelPlan, dict[str, Any], int]:
    """The kernel group resolved, the attention options it sets, and the untimed warm-up steps it needs."""
    # micro-batch search may raise the micro-batch after resolve: check CUDA graphs' warm-up for one per step
    kernel, attn_options = resolve_kernel(
        cfg,
        profile,
        precision,
        model,
        attn,
        attn_options,
        settings=batch.settings,
        source=batch.kernel_source,
        micro_batch=batch.kernel_micro,
        compile_on=compile_on,
        grad_accum=batch.micro_steps,
        warmup_steps=cfg.budget.warmup_steps,
    )
    if kernel.cuda_graphs and model.loop.on and model.loop.enable_at > 0:
        # GraphedMicroStep keys its graphs by the batch's shape: a loop switched on mid-run would replay the graph
        # captured without it
        raise PlanError(
            f"kernel.cuda_graphs captures one graph per batch shape and cannot follow model.loop switching on at "
            f"model.loop.enable_at={model.loop.enable_at}; drop kernel.cuda_graphs or set model.loop.enable_at=0"
        )
    warmup_steps = cfg.budget.warmup_steps
    if kernel.cuda_graphs:  # enough untimed steps to capture (the search may end at one micro-batch per step)
        warmup_steps = max(warmup_steps, graph_warmup_steps(batch.micro_steps))
    return kernel, attn_options, warmup_steps


def _memory_estimate_gb(
    attn: str, options: dict[str, Any], micro_batch: int, model: ModelShape, precision: str, logit_rows: int = 0
) -> float:

    scores = scores_bytes(attn, options, micro_batch, model, precision)
    return round(training_memory_bytes(model, micro_batch, precision, scores, param_count(model), logit_rows) / 1e9, 2)


def _sm(capability: tuple[int, int] | None) -> str:
    return "" if capability is None else f"{capability[0]}{capability[1]}"


def _check_precision(precision: str, profile: HardwareProfile) -> None:
    if profile.device_type == "cpu":
        if precision in ("fp16", "fp8"):
            raise PlanError(f"precision={precision} needs a CUDA GPU; on CPU use precision=fp32 or bf16")
        return
    if precision == "fp8" and (profile.capability or (0, 0)) < (8, 9):
        raise PlanError(
            f"precision=fp8 needs compute capability >= 8.9 (torch._scaled_mm); {profile.name} is "
            f"sm{_sm(profile.capability)} - use precision=bf16"
            # a card without bf16 (a T4) is offered only what its own precision check accepts
            if profile.has_bf16
            else f"precision=fp8 needs compute capability >= 8.9 (torch._scaled_mm) and {profile.name} is "
            f"sm{_sm(profile.capability)}, which has no bf16 either - use precision=fp16 (autocast + GradScaler) or fp32"
        )
    if precision == "bf16" and not profile.has_bf16:
        raise PlanError(
            f"precision=bf16 needs compute capability >= 8.0; {profile.name} is sm{_sm(profile.capability)} "
            f"(bf16 would be emulated, slowly) - use precision=fp16 (autocast + GradScaler) or fp32"
        )


def _check_quant(quant: QuantConfig) -> None:
    """brotli and zstd come from an optional extra: refuse before training, not at export time (GPTQ's reserve is
    the budget's: speedrun.plan.budget)."""
    if quant.name == QuantName.off:
        return

    try:
        check_compressor(str(quant.compressor), quant.level, str(quant.pergroup_codec))
    except ValueError as err:
        raise PlanError(str(err)) from None


def _check_code_rule(artifact: ArtifactConfig, quant: QuantConfig) -> None:
    """The wrapped rule needs python-minifier: refuse before training, not at export time (a run without an
    artifact counts no code)."""
    if quant.name == QuantName.off:
        return

    try:
        check_code_rule(artifact)
    except ValueError as err:
        raise PlanError(str(err)) from None


def _resolve_data(data: DataConfig, cwd: Path) -> DataPlan:
    if is_tiktoken(data.tokenizer):  # a missing optional dependency fails here, before any work
        require_tiktoken()

    def absolute(value: str | None) -> str | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else cwd / path)

    return DataPlan(
        path=absolute(data.path),
        # "gpt2" names tiktoken's encoding, not a file under the working directory.
        tokenizer=data.tokenizer if data.tokenizer == GPT2 else absolute(data.tokenizer),
        vocab_size=data.vocab_size,
        cache_dir=str(absolute(data.cache_dir)),
        name=data.name,
        tokenizer_kind="tiktoken" if is_tiktoken(data.tokenizer) else "sentencepiece",
    )
