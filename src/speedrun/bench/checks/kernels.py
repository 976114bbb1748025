"""How the same math is done on one GPU: the kernel group, precision and the attention backend (pgolf_baseline)."""

from __future__ import annotations

from speedrun.bench.spec import Check, Ratio, RunArm

SHORT = ("model=pgolf_baseline", "budget.max_steps=60", "budget.train_seconds=0", "eval.tokens=65536", "quant=off")
"""60 timed steps of pgolf_baseline (524,288 tokens each), a short eval and no export: a speed measurement, the
compile kept out of tokens/s."""
SPEED = ("tokens_per_s", "mfu", "peak_mem_mb", "compile_seconds", "attn_kernel")

KERNEL_TUNED = Check(
    name="kernel_tuned",
    measures=(
        "pgolf_baseline's training tokens/s with kernel=tuned (the card's table in conf/kernel/tuned/: a larger "
        "micro-batch and CUDA graphs) against kernel=default, alternated."
    ),
    arms=(RunArm("default", (*SHORT, "kernel=default")), RunArm("tuned", (*SHORT, "kernel=tuned"))),
    bars=(Ratio("tokens_per_s", "tuned", "default", ">=", 1.05),),
    metrics=SPEED,
    cards=("H100", "H200"),
    repeats=2,
    notes=(
        "Under CUDA graphs peak memory is the reserved memory (graph pools are not in the allocated counter). "
        "The tables were tuned with `python -m speedrun.tune` on each card."
    ),
)

KERNEL_FUSED_QKV = Check(
    name="kernel_fused_qkv",
    measures=(
        "pgolf_baseline's training tokens/s with q, k and v as one matmul of their concatenated weights "
        "(kernel.fused_qkv=true) against three linears, alternated: why it stays off."
    ),
    arms=(RunArm("default", SHORT), RunArm("fused", (*SHORT, "kernel.fused_qkv=true"))),
    bars=(Ratio("tokens_per_s", "fused", "default", "<=", 1.0),),
    metrics=SPEED,
    cards=("H100", "H200"),
    repeats=2,
    notes="The bar holds while the fused matmul is not faster: the claim behind its default of off.",
)

PRECISION_FP8 = Check(
    name="precision_fp8",
    measures=(
        "pgolf_baseline's training tokens/s with every block linear in FP8 (precision=fp8) against bf16, "
        "alternated: at d_model 512 the amax scaling costs more than the smaller matmuls save."
    ),
    arms=(RunArm("bf16", (*SHORT, "precision=bf16")), RunArm("fp8", (*SHORT, "precision=fp8"))),
    bars=(Ratio("tokens_per_s", "fp8", "bf16", "<=", 1.0),),
    metrics=SPEED,
    cards=("H100", "H200"),
    repeats=2,
    notes="fp8's MFU divides by the card's FP8 peak, so compare tokens/s, not MFU.",
)

ATTN_BACKENDS = Check(
    name="attn_backends",
    measures=(
        "pgolf_baseline's training tokens/s with SDPA's cuDNN kernel (what attn=auto picks on sm90) against SDPA's "
        "flash kernel and FlexAttention, alternated."
    ),
    arms=(
        RunArm("cudnn", (*SHORT, "attn=sdpa", "attn.kernel=cudnn")),
        RunArm("flash", (*SHORT, "attn=sdpa", "attn.kernel=flash")),
        RunArm("flex", (*SHORT, "attn=flex")),
    ),
    bars=(
        Ratio("tokens_per_s", "cudnn", "flash", ">=", 1.0),
        Ratio("tokens_per_s", "cudnn", "flex", ">=", 1.0),
    ),
    metrics=SPEED,
    cards=("H100", "H200"),
    repeats=2,
    notes="A100 and B200 keep flash under attn=auto: they have not been measured.",
)

CHECKS = (KERNEL_TUNED, KERNEL_FUSED_QKV, PRECISION_FP8, ATTN_BACKENDS)
