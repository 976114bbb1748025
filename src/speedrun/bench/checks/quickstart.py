"""The README's quickstart: `python -m run` with no arguments, on a CPU and on a GPU."""

from __future__ import annotations

from speedrun.bench.spec import Check, RunArm, Value

CPU_DEFAULT = Check(
    name="cpu_default",
    measures=(
        "`python -m run` with no arguments on a CPU: the tiny model trained on the embedded corpus for 60 s, its "
        "training tokens/s and the val_bpb it reaches."
    ),
    arms=(RunArm("default", ()),),
    bars=(Value("default", "val_bpb", "<=", 3.35),),
    metrics=("tokens_per_s", "steps", "train_seconds", "compile_seconds", "eval_seconds", "val_bpb", "epochs"),
    cards=("cpu",),
    notes=(
        "The bar is the embedded corpus's unigram baseline, 3.35 bits per byte: below it the model learned more "
        "than token frequencies. Speed depends on the CPU's cores and on what else runs beside it; each run's "
        "`seconds` in the result file is the whole job, start-up and evaluation included."
    ),
)

GPU_DEFAULT = Check(
    name="gpu_default",
    measures=(
        "`python -m run` with no arguments on a GPU: parameter-golf's baseline model (17 M parameters, bf16, "
        "compiled) trained on the embedded corpus for the card's default budget, its training tokens/s and the "
        "val_bpb it reaches."
    ),
    arms=(RunArm("default", ()),),
    bars=(Value("default", "val_bpb", "<=", 3.35),),
    metrics=("tokens_per_s", "mfu", "steps", "train_seconds", "compile_seconds", "peak_mem_mb", "val_bpb", "epochs"),
    notes=(
        "The bar is the embedded corpus's unigram baseline, 3.35 bits per byte. The corpus is 4.1 M training "
        "tokens, which a GPU passes over many times in its budget: val_bpb here checks that training works, not "
        "the recipe (baseline_vs_pgolf trains the same model on a corpus it does not repeat)."
    ),
)

CHECKS = (CPU_DEFAULT, GPU_DEFAULT)
