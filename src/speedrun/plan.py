"""The resolver: requested config + detected device -> a frozen Plan, or a PlanError naming what works.

Every decision about what will run is made here, once, before any data is built or GPU time is spent. After
``resolve`` the Plan is the only description of the run: build, train, evaluate and finalize read it and never
the config, and plan.json (``Plan.to_dict``) is exactly what ran. Checks that need no device live beside their
fields in speedrun.config; this module keeps the ones that need the device, the model or the data.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from .config import (
    CONF_DIR,
    Config,
    DataConfig,
    LoggerConfig,
    ModelConfig,
    OptimConfig,
    QuantConfig,
    ScheduleConfig,
    TTTConfig,
)
from .errors import PlanError
from .hardware import PROFILES, DetectedDevice, HardwareProfile
from .shape import ModelShape

__all__ = ["Plan", "PlanError", "Stage", "EvalPlan", "DataPlan", "resolve", "load_option", "plan_json"]


@dataclass(frozen=True)
class Stage:
    """One context length of the training schedule."""
    seq_len: int
    until: float
    """Train at this length until this fraction of the budget (time or steps, per Plan.stage_progress)."""
    micro_batch: int
    """Sequences per micro-batch at this length (micro-batch tokens stay constant across stages)."""


@dataclass(frozen=True)
class EvalPlan:
    mode: str
    """standard or sliding."""
    stride: Optional[int]
    """sliding: tokens each window advances."""
    document_isolated: bool
    """Score with the document mask on (no attention across BOS)."""
    tokens: Optional[int]
    """Validation tokens to score; None: the whole split."""
    batch_size: int
    """Windows per eval forward."""
    label: str
    """What the scores mean, recorded as eval_mode: e.g. standard, sliding:64+doc."""


@dataclass(frozen=True)
class DataPlan:
    path: Optional[str]
    """Absolute shard directory; None for the embedded corpus."""
    tokenizer: Optional[str]
    """Absolute SentencePiece model; None for the embedded corpus."""
    vocab_size: int
    cache_dir: str
    """Absolute directory where the embedded dataset is built."""


@dataclass(frozen=True)
class Plan:
    name: str
    seed: int
    device: str
    """torch device: cuda or cpu."""
    hardware: str
    """The profile that sets dtypes, kernels and peaks (requested or detected)."""
    device_name: str
    emulated: bool
    """True when a smaller profile runs on a bigger device (its recipe, capped memory)."""
    memory_cap_gb: Optional[float]
    precision: str
    """fp32, bf16, fp16 or fp8."""
    autocast: Optional[str]
    """Autocast dtype (bf16 or fp16; fp8 runs its block linears in fp8 inside bf16 autocast); None for fp32."""
    grad_scaler: bool
    matmul_dtype: str
    """The dtype whose peak MFU divides by (tf32 for fp32 on sm80+)."""
    peak_flops: Optional[float]
    """Peak FLOP/s of matmul_dtype on the profile (the emulated one when emulating): MFU's denominator."""
    device_peak_flops: Optional[float]
    """The same peak on the device that actually runs (differs from peak_flops only when emulating)."""
    ns_dtype: str
    """Dtype of Muon's Newton-Schulz iterations."""
    attn: str
    attn_options: tuple[tuple[str, Any], ...]
    """Constructor options of the attention backend (speedrun.attention.get_backend)."""
    attn_kernel: str
    """The kernel that will run, e.g. sdpa:flash."""
    document_mask: bool
    """Train (and evaluate) with attention confined to each BOS-delimited document."""
    model_name: str
    model: ModelShape
    micro_batch: int
    """Sequences per micro-batch at model.seq_len (the longest length)."""
    stages: tuple[Stage, ...]
    """Context-length stages; one for a constant schedule. Tokens per micro-batch and per step are the same in all."""
    stage_progress: str
    """time or step: what Stage.until measures."""
    schedule: ScheduleConfig
    """LR warm-up / warm-down fractions and the re-warm-up after a stage switch."""
    grad_accum: int
    tokens_per_step: int
    train_seconds: float
    max_steps: Optional[int]
    warmup_steps: int
    """Untimed compile/autotune steps, undone before training."""
    eval: EvalPlan
    compile: bool
    optim: OptimConfig
    quant: QuantConfig
    ttt: TTTConfig
    """TTT settings; batch_size resolved."""
    data: DataPlan
    logger: LoggerConfig

    @property
    def eval_tokens(self) -> Optional[int]:
        return self.eval.tokens

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["attn_options"] = dict(self.attn_options)
        return json.loads(json.dumps(d, default=str))  # Choice enums -> their strings

    def describe(self) -> str:
        m = self.model
        stages = ", ".join(f"{st.seq_len} x {st.micro_batch} until {st.until:g}" for st in self.stages)
        lines = [
            f"hardware    {self.hardware}{' (emulated)' if self.emulated else ''} on {self.device_name}"
            + (f", memory cap {self.memory_cap_gb:g} GB" if self.memory_cap_gb else ""),
            f"precision   {self.precision}{' + GradScaler' if self.grad_scaler else ''} (MFU peak: {self.matmul_dtype})",
            f"attention   {self.attn_kernel}{' + document mask' if self.document_mask else ''}",
            f"model       {self.model_name}: {m.n_layer}x{m.d_model}, {m.n_head}/{m.n_kv_head} heads, "
            f"mlp {m.mlp_mult}x, vocab {m.vocab_size}, seq {m.seq_len}",
            f"batch       {self.tokens_per_step} tokens/step = {self.micro_batch} seqs x {m.seq_len} x "
            f"{self.grad_accum} accum",
            *([f"stages      {stages} (of {self.stage_progress})"] if len(self.stages) > 1 else []),
            f"budget      {self.train_seconds:g} s" + (f" or {self.max_steps} steps" if self.max_steps else "")
            + f", eval {self.eval.label} on {self.eval.tokens if self.eval.tokens is not None else 'all'} tokens, "
            f"compile {'on' if self.compile else 'off'}",
        ]
        return "\n".join(lines)


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2)


def load_option(group: str, option: str) -> dict[str, Any]:
    """Read conf/<group>/<option>.yaml (without its defaults list): used to resolve ``auto`` presets."""
    path = CONF_DIR / group / f"{option}.yaml"
    if not path.exists():
        raise PlanError(f"{group}={option}: no such option ({path} missing)")
    data = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(data, dict)
    data.pop("defaults", None)
    return data


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
        # Same chip family (an H200 asked to be an h100): run natively, cap memory if the profile is smaller.
        return profile, profile.memory_gb < device.memory_gb - 1
    too_big = profile.capability > device.capability or profile.memory_gb > device.memory_gb + 1
    if too_big:
        raise PlanError(
            f"hardware={requested} (sm{_sm(profile.capability)}, {profile.memory_gb:g} GB) is larger than this "
            f"device ({device.name}, sm{_sm(device.capability)}, {device.memory_gb:.0f} GB) and cannot be emulated; "
            f"use hardware=auto or a smaller profile"
        )
    return profile, True


def resolve(cfg: Config, device: DetectedDevice, cwd: Optional[Path] = None) -> Plan:
    """Check the requested combination against the device and fill every ``auto``/None from the profile.

    cwd: where relative data paths are taken from (the directory `python -m run` started in)."""
    profile, emulated = choose_profile(str(cfg.hardware.name), device)
    on_cuda = profile.device_type == "cuda"

    precision = profile.precision if cfg.precision.name == "auto" else str(cfg.precision.name)
    _check_precision(precision, profile)
    matmul_dtype = precision
    if precision == "fp32" and on_cuda and "tf32" in profile.peak_tflops:
        matmul_dtype = "tf32"  # we enable TF32 matmuls for fp32 on sm80+, so that is the peak to divide by
    # fp8: the block linears run in fp8 (forward and backward), lm_head and attention in bf16. Dividing all
    # FLOPs by the fp8 peak understates MFU a little rather than flattering it.

    model_name, model = _resolve_model(cfg, profile)
    lengths = cfg.schedule.stages()
    if lengths:
        # RoPE tables (and eval) are sized for the longest length.
        model = dataclasses.replace(model, seq_len=max(length for length, _ in lengths))
    attn, attn_options, attn_kernel = _resolve_attention(cfg, profile, precision, model)

    seq_len = model.seq_len
    micro_batch = cfg.hardware.micro_batch or max(1, profile.micro_batch_tokens // seq_len)
    tokens_per_step = cfg.budget.tokens_per_step or profile.tokens_per_step
    micro_tokens = micro_batch * seq_len
    if tokens_per_step % micro_tokens:
        raise PlanError(
            f"budget.tokens_per_step={tokens_per_step} is not a multiple of micro-batch tokens "
            f"({micro_batch} seqs x {seq_len} = {micro_tokens}); set budget.tokens_per_step to a multiple of "
            f"{micro_tokens} or change hardware.micro_batch"
        )
    _check_scores_memory(attn, attn_options, micro_batch, model, profile, precision)
    stages = _stages(lengths, micro_tokens) if lengths else (Stage(seq_len, 1.0, micro_batch),)
    if cfg.schedule.progress == "step" and not cfg.budget.max_steps:
        raise PlanError("schedule.progress=step measures stages in steps: set budget.max_steps, or use "
                        "schedule.progress=time")

    eval_plan = _resolve_eval(cfg, profile, attn, model, micro_batch)
    ttt = _resolve_ttt(cfg.ttt, model, eval_plan.batch_size)
    _check_compressor(cfg.quant)
    train_seconds = cfg.budget.train_seconds if cfg.budget.train_seconds is not None else profile.train_seconds

    return Plan(
        name=cfg.name,
        seed=cfg.seed,
        device=profile.device_type,
        hardware=profile.name,
        device_name=device.name,
        emulated=emulated,
        memory_cap_gb=cfg.hardware.memory_cap_gb or (profile.memory_gb if emulated else None),
        precision=precision,
        autocast={"bf16": "bf16", "fp8": "bf16", "fp16": "fp16"}.get(precision),
        grad_scaler=precision == "fp16",
        matmul_dtype=matmul_dtype,
        peak_flops=profile.peak_flops(matmul_dtype),
        device_peak_flops=device.profile.peak_flops(matmul_dtype) if on_cuda else None,
        ns_dtype="bf16" if on_cuda and profile.has_bf16 else "fp32",
        attn=attn,
        attn_options=tuple(sorted(attn_options.items())),
        attn_kernel=attn_kernel,
        document_mask=cfg.attn.document_mask,
        model_name=model_name,
        model=model,
        micro_batch=micro_batch,
        stages=stages,
        stage_progress=str(cfg.schedule.progress),
        schedule=cfg.schedule,
        grad_accum=tokens_per_step // micro_tokens,
        tokens_per_step=tokens_per_step,
        train_seconds=float(train_seconds) if train_seconds > 0 else math.inf,
        max_steps=cfg.budget.max_steps,
        warmup_steps=cfg.budget.warmup_steps,
        eval=eval_plan,
        compile=cfg.hardware.compile if cfg.hardware.compile is not None else on_cuda,
        optim=cfg.optim,
        quant=cfg.quant,
        ttt=ttt,
        data=_resolve_data(cfg.data, cwd or Path.cwd()),
        logger=cfg.logger,
    )


def _stages(lengths: list[tuple[int, float]], micro_tokens: int) -> tuple[Stage, ...]:
    bad = [length for length, _ in lengths if micro_tokens % length]
    if bad:
        raise PlanError(
            f"schedule.seq_len: lengths {bad} do not divide the micro-batch tokens ({micro_tokens} = "
            f"hardware.micro_batch x the longest length); tokens per micro-batch stay constant across stages, so "
            f"pick lengths that divide {micro_tokens} or change hardware.micro_batch"
        )
    return tuple(Stage(length, until, micro_tokens // length) for length, until in lengths)


def _sm(capability: Optional[tuple[int, int]]) -> str:
    return "" if capability is None else f"{capability[0]}{capability[1]}"


def _check_precision(precision: str, profile: HardwareProfile) -> None:
    if profile.device_type == "cpu":
        if precision in ("fp16", "fp8"):
            raise PlanError(f"precision={precision} needs a CUDA GPU; on CPU use precision=fp32 or bf16")
        return
    if precision == "fp8" and profile.capability < (8, 9):
        raise PlanError(
            f"precision=fp8 needs compute capability >= 8.9 (torch._scaled_mm); {profile.name} is "
            f"sm{_sm(profile.capability)} - use precision=bf16" + ("" if profile.has_bf16 else " or fp16")
        )
    if precision == "bf16" and not profile.has_bf16:
        raise PlanError(
            f"precision=bf16 needs compute capability >= 8.0; {profile.name} is sm{_sm(profile.capability)} "
            f"(bf16 would be emulated, slowly) - use precision=fp16 (autocast + GradScaler) or fp32"
        )


def _resolve_model(cfg: Config, profile: HardwareProfile) -> tuple[str, ModelShape]:
    name = cfg.model.name
    model_cfg = cfg.model
    if name == "auto":
        # The profile's preset, with whatever the user set explicitly on top (set fields are not None).
        name = profile.model
        preset = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), load_option("model", name)))
        explicit = {f.name: getattr(cfg.model, f.name) for f in dataclasses.fields(ModelConfig)
                    if f.name != "name" and getattr(cfg.model, f.name) is not None}
        model_cfg = dataclasses.replace(preset, **explicit)  # type: ignore[type-var]
    missing = [f for f in ("n_layer", "d_model", "n_head", "n_kv_head", "mlp_mult", "seq_len", "tie_embeddings")
               if getattr(model_cfg, f) is None]
    if missing:
        raise PlanError(f"model={name} leaves {', '.join(missing)} unset; set model.<field>=... or use a preset "
                        f"(model=tiny, pgolf_baseline, ...)")
    vocab = model_cfg.vocab_size or cfg.data.vocab_size
    if vocab != cfg.data.vocab_size:
        raise PlanError(
            f"model.vocab_size={vocab} differs from data.vocab_size={cfg.data.vocab_size}; leave model.vocab_size "
            f"unset to take the data's"
        )
    shared = {f.name for f in dataclasses.fields(ModelShape)} & {f.name for f in dataclasses.fields(ModelConfig)}
    values = {k: getattr(model_cfg, k) for k in shared if k != "vocab_size"}
    return name, ModelShape(vocab_size=vocab, **values)


def _resolve_attention(cfg: Config, profile: HardwareProfile, precision: str,
                       model: ModelShape) -> tuple[str, dict[str, Any], str]:
    """Ask the requested backend whether it can run here (its capabilities), then for its options."""
    from .attention import REGISTRY, backend_class

    request = cfg.attn
    name = profile.attn if request.name == "auto" else request.name
    if name not in REGISTRY:
        raise PlanError(f"attn={name}: no such backend; registered: {', '.join(sorted(REGISTRY))}")
    wants = dict(document_mask=request.document_mask, window=request.window is not None)
    problems = backend_class(name).capabilities.problems(profile, precision, model, **wants)
    if problems:
        fits = [other for other in sorted(REGISTRY)
                if other != name and not backend_class(other).capabilities.problems(profile, precision, model, **wants)]
        why = backend_class(name).capabilities.why
        raise PlanError(f"attn={name} {'; '.join(problems)}{f' ({why})' if why else ''} - "
                        + (f"use attn={' or attn='.join(fits)}" if fits else "no backend fits; change the request"))
    options, kernel = backend_class(name).plan_options(request, profile, precision, model)
    return name, options, kernel


def _check_scores_memory(attn: str, options: dict[str, Any], micro_batch: int, model: ModelShape,
                         profile: HardwareProfile, precision: str) -> None:
    """A kernel that materialises B x H x T x T scores is refused before an OOM, not after."""
    from .attention import backend_class

    if profile.device_type != "cuda":
        return
    need_gb = backend_class(attn).scores_bytes(options, micro_batch, model, precision) / 1e9
    if need_gb > 0.6 * profile.memory_gb:
        raise PlanError(
            f"the math attention kernel would hold ~{need_gb:.0f} GB of B x H x T x T scores "
            f"({micro_batch} x {model.n_head} x {model.seq_len}^2 x {model.n_layer} layers) on a "
            f"{profile.memory_gb:g} GB {profile.name}; use attn=flex or attn=sdpa, or lower hardware.micro_batch"
        )


def _resolve_eval(cfg: Config, profile: HardwareProfile, attn: str, model: ModelShape,
                  micro_batch: int) -> EvalPlan:
    from .attention import backend_class

    e = cfg.eval
    if e.name == "sliding" and e.stride > model.seq_len:
        raise PlanError(f"eval=sliding needs eval.stride <= model.seq_len={model.seq_len}, got {e.stride}; "
                        f"use e.g. eval.stride=64")
    if e.document_isolated and not backend_class(attn).capabilities.document_mask:
        raise PlanError(f"eval.document_isolated=true needs an attention backend with a document mask; attn={attn} "
                        f"has none: use attn=flex (CUDA) or attn=math, or eval.document_isolated=false")
    tokens = e.tokens if e.tokens is not None else profile.eval_tokens
    label = str(e.name) if e.name != "sliding" else f"sliding:{e.stride}"
    # a model trained with attn.document_mask keeps masking documents at eval too
    label += "+doc" if e.document_isolated or cfg.attn.document_mask else ""
    return EvalPlan(mode=str(e.name), stride=e.stride, document_isolated=e.document_isolated, tokens=tokens or None,
                    batch_size=e.batch_size or micro_batch, label=label)


def _resolve_ttt(ttt: TTTConfig, model: ModelShape, eval_batch: int) -> TTTConfig:
    if ttt.name == "off":
        return ttt
    chunks = ttt.chunk_sizes()
    if any(c > model.seq_len for c in chunks):
        raise PlanError(f"ttt chunk sizes {chunks} (ttt.chunk_size, ttt.short_chunks) must be in "
                        f"1..model.seq_len={model.seq_len}; use smaller chunks")
    return dataclasses.replace(ttt, batch_size=ttt.batch_size or eval_batch)


def _check_compressor(quant: QuantConfig) -> None:
    """brotli and zstd come from an optional extra: refuse before training, not at export time."""
    if quant.name == "off":
        return
    from .quantize import check_compressor

    try:
        check_compressor(str(quant.compressor), quant.level)
    except ValueError as err:
        raise PlanError(str(err)) from None


def _resolve_data(data: DataConfig, cwd: Path) -> DataPlan:
    def absolute(value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else cwd / path)

    return DataPlan(path=absolute(data.path), tokenizer=absolute(data.tokenizer), vocab_size=data.vocab_size,
                    cache_dir=str(absolute(data.cache_dir)))
