"""The resolver: requested config + detected device -> a frozen Plan, or a PlanError naming what works.

Every decision about what will run is made here, once, before any data is built or GPU time is spent.
Nothing below this module picks a backend, a dtype or a batch size on its own.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import OmegaConf

from .config import CONF_DIR, Config, ModelConfig
from .hardware import PROFILES, SELECTABLE, DetectedDevice, HardwareProfile

SDPA_KERNELS = ("flash", "cudnn", "efficient", "math")
ATTN_BACKENDS = ("sdpa", "math", "flex", "fa3")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
FA3_REPOS = {"sm90": "varunneal/flash-attention-3", "sm80": "kernels-community/flash-attn3"}


class PlanError(ValueError):
    """A requested combination that cannot run here; the message names the conflict and what works."""


@dataclass(frozen=True)
class ModelPlan:
    vocab_size: int
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    mlp_mult: int
    seq_len: int
    tie_embeddings: bool
    logit_softcap: float
    rope_base: float
    qk_norm: bool


@dataclass(frozen=True)
class Stage:
    """One context length of the training schedule."""
    seq_len: int
    until: float
    """Train at this length until this fraction of the budget (time or steps, per schedule.progress)."""
    micro_batch: int
    """Sequences per micro-batch at this length (micro-batch tokens stay constant across stages)."""


@dataclass(frozen=True)
class Plan:
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
    attn_kernel: str
    """The kernel that will run, e.g. sdpa:flash."""
    model_name: str
    model: ModelPlan
    micro_batch: int
    """Sequences per micro-batch at model.seq_len (the longest length)."""
    stages: tuple[Stage, ...]
    """Context-length stages; one for a constant schedule. Tokens per micro-batch and per step are the same in all."""
    stage_progress: str
    """time or step: what Stage.until measures."""
    grad_accum: int
    tokens_per_step: int
    train_seconds: float
    max_steps: Optional[int]
    eval_tokens: Optional[int]
    """None: the whole validation split."""
    eval_batch: int
    compile: bool

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["attn_options"] = dict(self.attn_options)
        return d

    def describe(self) -> str:
        m = self.model
        lines = [
            f"hardware    {self.hardware}{' (emulated)' if self.emulated else ''} on {self.device_name}"
            + (f", memory cap {self.memory_cap_gb:g} GB" if self.memory_cap_gb else ""),
            f"precision   {self.precision}{' + GradScaler' if self.grad_scaler else ''} (MFU peak: {self.matmul_dtype})",
            f"attention   {self.attn_kernel}",
            f"model       {self.model_name}: {m.n_layer}x{m.d_model}, {m.n_head}/{m.n_kv_head} heads, "
            f"mlp {m.mlp_mult}x, vocab {m.vocab_size}, seq {m.seq_len}",
            f"batch       {self.tokens_per_step} tokens/step = {self.micro_batch} seqs x {m.seq_len} x "
            f"{self.grad_accum} accum",
            *(["stages      " + ", ".join(f"{st.seq_len} x {st.micro_batch} until {st.until:g}" for st in
                                          self.stages) + f" (of {self.stage_progress})"] if len(self.stages) > 1 else []),
            f"budget      {self.train_seconds:g} s" + (f" or {self.max_steps} steps" if self.max_steps else "")
            + f", eval {self.eval_tokens if self.eval_tokens is not None else 'all'} tokens, "
            f"compile {'on' if self.compile else 'off'}",
        ]
        return "\n".join(lines)


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
    if requested not in SELECTABLE:
        raise PlanError(f"hardware={requested}: unknown; choose one of {', '.join(SELECTABLE)}")
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


def resolve(cfg: Config, device: DetectedDevice) -> Plan:
    """Check the requested combination against the device and fill every ``auto``/None from the profile."""
    profile, emulated = choose_profile(cfg.hardware.name, device)
    on_cuda = profile.device_type == "cuda"

    precision = profile.precision if cfg.precision.name == "auto" else cfg.precision.name
    _check_precision(precision, profile)
    matmul_dtype = precision
    if precision == "fp32" and on_cuda and "tf32" in profile.peak_tflops:
        matmul_dtype = "tf32"  # we enable TF32 matmuls for fp32 on sm80+, so that is the peak to divide by
    # fp8: the block linears run in fp8 (forward and backward), lm_head and attention in bf16. Dividing all
    # FLOPs by the fp8 peak understates MFU a little rather than flattering it.
    ns_dtype = "bf16" if on_cuda and profile.has_bf16 else "fp32"

    model_name, model = _resolve_model(cfg, profile)
    if cfg.schedule.name not in ("constant", "progressive"):
        raise PlanError(f"schedule={cfg.schedule.name}: unknown; choose one of constant, progressive")
    if cfg.schedule.name == "constant" and cfg.schedule.seq_len is not None:
        raise PlanError("schedule.seq_len is for schedule=progressive; add schedule=progressive or drop it")
    lengths = parse_stages(cfg.schedule) if cfg.schedule.name == "progressive" else None
    if lengths:
        # RoPE tables (and eval) are sized for the longest length.
        model = dataclasses.replace(model, seq_len=max(length for length, _ in lengths))
    attn, attn_options, attn_kernel = _resolve_attention(cfg, profile, precision, model)
    _check_eval_ttt_quant(cfg, attn, model)

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
    _check_math_memory(attn, attn_options, micro_batch, model, profile, precision)
    stages = _stages(lengths, micro_tokens) if lengths else (Stage(seq_len, 1.0, micro_batch),)
    if cfg.schedule.progress not in ("time", "step"):
        raise PlanError(f"schedule.progress={cfg.schedule.progress}: choose time or step")
    if cfg.schedule.progress == "step" and not cfg.budget.max_steps:
        raise PlanError("schedule.progress=step measures stages in steps: set budget.max_steps, or use "
                        "schedule.progress=time")

    eval_tokens = cfg.eval.tokens if cfg.eval.tokens is not None else profile.eval_tokens
    memory_cap = cfg.hardware.memory_cap_gb or (profile.memory_gb if emulated else None)
    compile_model = cfg.hardware.compile if cfg.hardware.compile is not None else on_cuda
    train_seconds = cfg.budget.train_seconds if cfg.budget.train_seconds is not None else profile.train_seconds
    if train_seconds <= 0 and not cfg.budget.max_steps:
        raise PlanError("budget.train_seconds must be > 0 unless budget.max_steps is set")

    return Plan(
        device=profile.device_type,
        hardware=profile.name,
        device_name=device.name,
        emulated=emulated,
        memory_cap_gb=memory_cap,
        precision=precision,
        autocast={"bf16": "bf16", "fp8": "bf16", "fp16": "fp16"}.get(precision),
        grad_scaler=precision == "fp16",
        matmul_dtype=matmul_dtype,
        peak_flops=profile.peak_flops(matmul_dtype),
        device_peak_flops=device.profile.peak_flops(matmul_dtype) if on_cuda else None,
        ns_dtype=ns_dtype,
        attn=attn,
        attn_options=tuple(sorted(attn_options.items())),
        attn_kernel=attn_kernel,
        model_name=model_name,
        model=model,
        micro_batch=micro_batch,
        stages=stages,
        stage_progress=cfg.schedule.progress,
        grad_accum=tokens_per_step // micro_tokens,
        tokens_per_step=tokens_per_step,
        train_seconds=float(train_seconds) if train_seconds > 0 else math.inf,
        max_steps=cfg.budget.max_steps,
        eval_tokens=eval_tokens or None,
        eval_batch=cfg.eval.batch_size or micro_batch,
        compile=compile_model,
    )


def parse_stages(schedule: Any) -> list[tuple[int, float]]:
    """schedule.seq_len "1024@0.1,2048@0.7,3072@1.0" (or a list of "L@f") -> [(1024, 0.1), ...], checked."""
    spec = schedule.seq_len
    if spec is None:
        raise PlanError('schedule=progressive needs schedule.seq_len, e.g. \'schedule.seq_len="1024@0.5,2048@1.0"\'')
    items = [str(x).strip() for x in (spec if isinstance(spec, (list, tuple)) else str(spec).split(","))]
    stages = []
    for item in items:
        try:
            length, until = item.split("@")
            stages.append((int(length), float(until)))
        except ValueError:
            raise PlanError(f"schedule.seq_len: cannot read {item!r}; write LENGTH@FRACTION, e.g. 1024@0.5") from None
    lengths, fractions = [s[0] for s in stages], [s[1] for s in stages]
    if any(b <= a for a, b in zip(lengths, lengths[1:])) or lengths[0] < 1:
        raise PlanError(f"schedule.seq_len: lengths must be positive and strictly increasing, got {lengths}")
    if any(b <= a for a, b in zip(fractions, fractions[1:])) or fractions[0] <= 0:
        raise PlanError(f"schedule.seq_len: fractions must be positive and strictly increasing, got {fractions}")
    if fractions[-1] != 1.0:
        raise PlanError(f"schedule.seq_len: the last stage must run to 1.0 of the budget, got {fractions[-1]}")
    return stages


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
    if precision not in PRECISIONS:
        raise PlanError(f"precision={precision}: unknown; choose one of auto, {', '.join(PRECISIONS)}")
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


def _resolve_model(cfg: Config, profile: HardwareProfile) -> tuple[str, ModelPlan]:
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
    if model_cfg.n_head % model_cfg.n_kv_head:
        raise PlanError(f"model.n_kv_head={model_cfg.n_kv_head} must divide model.n_head={model_cfg.n_head}")
    if model_cfg.d_model % model_cfg.n_head or (model_cfg.d_model // model_cfg.n_head) % 2:
        raise PlanError(
            f"model.d_model={model_cfg.d_model} must split into n_head={model_cfg.n_head} heads of even size (RoPE)"
        )
    if vocab != cfg.data.vocab_size:
        raise PlanError(
            f"model.vocab_size={vocab} differs from data.vocab_size={cfg.data.vocab_size}; leave model.vocab_size "
            f"unset to take the data's"
        )
    fields = {f.name for f in dataclasses.fields(ModelPlan)}
    values = {k: getattr(model_cfg, k) for k in fields if k != "vocab_size"}
    return name, ModelPlan(vocab_size=vocab, **values)


def _resolve_attention(
    cfg: Config, profile: HardwareProfile, precision: str, model: ModelPlan
) -> tuple[str, dict[str, Any], str]:
    a = cfg.attn
    name = profile.attn if a.name == "auto" else a.name
    if name not in ATTN_BACKENDS:
        raise PlanError(f"attn={name}: unknown; choose one of auto, {', '.join(ATTN_BACKENDS)}")
    if a.document_mask and name in ("sdpa", "fa3"):
        raise PlanError(f"attn.document_mask=true is not supported by attn={name}; use attn=flex (or attn=math)")
    if a.window is not None and name != "flex":
        raise PlanError(f"attn.window needs attn=flex (attn={name} has no sliding window)")
    if name == "sdpa":
        kernel = profile.sdpa_kernel if a.kernel == "auto" else a.kernel
        if a.kernel == "auto" and precision == "fp32" and profile.device_type == "cuda" and kernel in ("flash", "cudnn"):
            kernel = "efficient"  # flash and cuDNN take 16-bit inputs only; efficient runs fp32
        if kernel not in SDPA_KERNELS:
            raise PlanError(f"attn.kernel={kernel}: unknown; choose one of auto, {', '.join(SDPA_KERNELS)}")
        _check_sdpa_kernel(kernel, profile, precision, model)
        return name, {"kernel": kernel}, f"sdpa:{kernel}"
    if name == "flex":
        if profile.device_type != "cuda":
            raise PlanError(
                "attn=flex compiles Triton kernels and has no backward on CPU; on CPU use attn=sdpa or attn=math"
            )
        block_m, block_n = profile.flex_blocks
        kernel_options = {
            "BLOCK_M": a.block_m or block_m,
            "BLOCK_N": a.block_n or block_n,
            **({"num_warps": a.num_warps} if a.num_warps else {}),
            **({"num_stages": a.num_stages} if a.num_stages else {}),
        }
        options = {"window": a.window, "document_mask": a.document_mask, "kernel_options": kernel_options}
        return name, options, "flex"
    if name == "fa3":
        return _resolve_fa3(a, profile, precision)
    return name, {"document_mask": a.document_mask}, "math"


def _resolve_fa3(a: Any, profile: HardwareProfile, precision: str) -> tuple[str, dict[str, Any], str]:
    """FA3 runs bf16 only, on sm80-sm90 builds; the kernel repo follows the capability unless given."""
    cap = profile.capability
    if profile.device_type != "cuda" or cap is None or not ((8, 0) <= cap < (10, 0)):
        where = "CPU" if cap is None else f"{profile.name} (sm{_sm(cap)})"
        raise PlanError(
            f"attn=fa3 needs compute capability 8.0-9.0 (FA3 builds exist for sm80 and sm90); {where} has none - "
            f"use attn=flex or attn=sdpa"
        )
    if precision not in ("bf16", "fp8"):
        raise PlanError(f"attn=fa3 runs bf16 only; precision={precision} - use precision=bf16, or attn=flex/sdpa")
    repo = a.fa3_repo or FA3_REPOS["sm90" if cap >= (9, 0) else "sm80"]
    version, revision = (None, a.fa3_revision) if a.fa3_revision else (a.fa3_version, None)
    if version is None and revision is None:
        raise PlanError("attn=fa3 needs a pin: set attn.fa3_version=<int> or attn.fa3_revision=<rev>")
    pin = revision if revision is not None else version
    return "fa3", {"repo": repo, "version": version, "revision": revision}, f"fa3:{repo}@{pin}"


def _check_sdpa_kernel(kernel: str, profile: HardwareProfile, precision: str, model: ModelPlan) -> None:
    if profile.device_type == "cpu":
        if kernel in ("cudnn", "efficient"):
            raise PlanError(f"attn.kernel={kernel} needs a CUDA GPU; on CPU use attn.kernel=flash or math")
        return
    if kernel in ("flash", "cudnn"):
        if profile.capability < (8, 0):
            raise PlanError(
                f"attn.kernel={kernel} needs compute capability >= 8.0; {profile.name} is sm{_sm(profile.capability)}"
                f" - use attn.kernel=efficient (K/V expanded for GQA) or attn=flex"
            )
        if precision == "fp32":
            raise PlanError(
                f"attn.kernel={kernel} needs fp16 or bf16 inputs; with precision=fp32 use attn.kernel=efficient or math"
            )


def _check_math_memory(
    attn: str, options: dict[str, Any], micro_batch: int, model: ModelPlan, profile: HardwareProfile, precision: str
) -> None:
    """The math kernels materialise B x H x T x T scores per layer; refuse before an OOM, not after."""
    if profile.device_type != "cuda" or not (attn == "math" or options.get("kernel") == "math"):
        return
    bytes_per = 4 if precision == "fp32" else 2
    # scores + softmax probabilities are kept for backward in every layer (fp32 softmax: 4 bytes).
    per_layer = micro_batch * model.n_head * model.seq_len**2 * (bytes_per + 4)
    need_gb = per_layer * model.n_layer / 1e9
    if need_gb > 0.6 * profile.memory_gb:
        raise PlanError(
            f"the math attention kernel would hold ~{need_gb:.0f} GB of B x H x T x T scores "
            f"({micro_batch} x {model.n_head} x {model.seq_len}^2 x {model.n_layer} layers) on a "
            f"{profile.memory_gb:g} GB {profile.name}; use attn=flex or attn=sdpa, or lower hardware.micro_batch"
        )


def _check_eval_ttt_quant(cfg: Config, attn: str, model: ModelPlan) -> None:
    """The eval, ttt and quant groups: refuse what cannot run before any data is built (each names a way out)."""
    e, t, q = cfg.eval, cfg.ttt, cfg.quant
    if e.name not in ("standard", "sliding"):
        raise PlanError(f"eval={e.name}: unknown; choose one of standard, sliding")
    if e.name == "sliding" and (e.stride is None or not 1 <= e.stride <= model.seq_len):
        raise PlanError(f"eval=sliding needs 1 <= eval.stride <= model.seq_len={model.seq_len}, got {e.stride}; "
                        f"use e.g. eval.stride=64")
    if e.name == "standard" and e.stride is not None:
        raise PlanError("eval.stride is for eval=sliding; use eval=sliding eval.stride=N, or drop eval.stride")
    if e.document_isolated and attn not in ("flex", "math"):
        raise PlanError(f"eval.document_isolated=true needs an attention backend with a document mask; attn={attn} "
                        f"has none: use attn=flex (CUDA) or attn=math, or eval.document_isolated=false")
    if t.name not in ("off", "lora"):
        raise PlanError(f"ttt={t.name}: unknown; choose one of off, lora")
    if t.name == "lora":
        from .ttt import parse_short_chunks, parse_targets

        try:
            parse_targets(t.targets)
            chunks = [t.chunk_size] + [c for _, c in parse_short_chunks(t.short_chunks)]
        except ValueError as err:
            raise PlanError(str(err)) from None
        if any(not 1 <= c <= model.seq_len for c in chunks):
            raise PlanError(f"ttt chunk sizes {chunks} (ttt.chunk_size, ttt.short_chunks) must be in "
                            f"1..model.seq_len={model.seq_len}; use smaller chunks")
        if t.rank < 1 or t.lr <= 0 or (t.batch_size is not None and t.batch_size < 1):
            raise PlanError(f"ttt.rank ({t.rank}) and ttt.batch_size ({t.batch_size}) must be >= 1 and ttt.lr "
                            f"({t.lr}) > 0; use e.g. ttt.rank=8 ttt.lr=0.01")
        if t.max_seconds is not None and t.max_seconds <= 0:
            raise PlanError(f"ttt.max_seconds={t.max_seconds} must be > 0; use null for no limit")
    if q.name not in ("off", "int8", "int6"):
        raise PlanError(f"quant={q.name}: unknown; choose one of off, int8, int6")
    if q.name == "off":
        return
    from .quantize import check_compressor

    try:
        check_compressor(q.compressor, q.level)
    except ValueError as err:
        raise PlanError(str(err)) from None
    if q.name == "int6":
        if not (2 <= q.bits <= 8 and 2 <= q.embed_bits <= 8):
            raise PlanError(f"quant.bits={q.bits} and quant.embed_bits={q.embed_bits} must be in 2..8 (one int8 "
                            f"byte per value); use e.g. quant.bits=6 quant.embed_bits=8")
        if q.calib_batches < 1 or q.block_size < 1 or q.damp < 0:
            raise PlanError(f"quant.calib_batches ({q.calib_batches}) and quant.block_size ({q.block_size}) must be "
                            f">= 1 and quant.damp ({q.damp}) >= 0; use the int6 defaults (8, 128, 0.01)")
        if not q.clip_ratios or any(not 0 < r <= 1 for r in q.clip_ratios):
            raise PlanError(f"quant.clip_ratios={list(q.clip_ratios)} must be fractions in (0, 1]; use e.g. [1.0,0.9,0.8]")


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2, default=str)
