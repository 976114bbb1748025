"""Checks that run on a machine without a GPU: the runner end to end, and export levers on a tiny model."""

from __future__ import annotations

from speedrun.bench.spec import Check, Ratio, RunArm, Value

CPU_SMOKE_ATTN = Check(
    name="cpu_smoke_attn",
    measures=(
        "The smoke model's training tokens/s with SDPA attention against the math reference, alternated on one CPU: "
        "the smallest two-arm check, which tests the runner end to end without a GPU."
    ),
    arms=(RunArm("sdpa", ("debug=smoke", "attn=sdpa")), RunArm("math", ("debug=smoke", "attn=math"))),
    bars=(Ratio("tokens_per_s", "sdpa", "math", ">=", 0.9),),
    metrics=("tokens_per_s", "steps", "val_bpb", "epochs"),
    cards=("cpu",),
    repeats=2,
    notes=(
        "Four steps of a 2 x 64 model: the ratio says little about attention kernels, and the bar only asks that "
        "SDPA not be clearly slower than the reference it is tested against."
    ),
)

CPU_QUANT_SIGMA = Check(
    name="cpu_quant_sigma",
    measures=(
        "The int6 export of one tiny model (150 steps, fp32, so both arms train the same weights) with the record's "
        "sigma clip against the absmax clip search: the compressed model's bytes and the quantization gap."
    ),
    arms=(
        RunArm("absmax", ("budget.max_steps=150", "budget.train_seconds=0", "quant=int6", "quant.clip=absmax_search")),
        RunArm("sigma", ("budget.max_steps=150", "budget.train_seconds=0", "quant=int6", "quant.clip=sigma")),
    ),
    bars=(
        Ratio("artifact_model_bytes", "sigma", "absmax", "<=", 0.7),
        Value("sigma", "val_bpb_quant", "<=", 0.01, minus="val_bpb"),
    ),
    metrics=("artifact_model_bytes", "val_bpb", "val_bpb_quant", "steps", "epochs"),
    cards=("cpu",),
    notes=(
        "A model this small and this little trained shows each lever's direction, not the record's bytes: "
        "sigma clipping is what makes pgolf_record's 36 M parameters fit 16 MB (record_export)."
    ),
)

CHECKS = (CPU_SMOKE_ATTN, CPU_QUANT_SIGMA)
