"""One run on several GPUs against the same run on one."""

from __future__ import annotations

from speedrun.bench.spec import Check, Ratio, RunArm

STEPS = ("model=pgolf_baseline", "budget.max_steps=200", "budget.train_seconds=0", "eval.tokens=262144", "quant=off")
"""200 steps of 524,288 tokens, seed for seed the same batches on any number of ranks (gradient accumulation
stands in for missing ranks), so the runs differ only in how the work is spread."""
METRICS = ("tokens_per_s", "mfu", "val_bpb", "epochs", "peak_mem_mb", "world_size")


def scaling(gpus: int, bar: float) -> Check:
    return Check(
        name=f"dist_{gpus}gpu",
        measures=(
            f"pgolf_baseline's training tokens/s on {gpus} GPUs of one host (dist.nproc={gpus}) against one GPU, "
            "200 steps each, alternated."
        ),
        arms=(RunArm("one", STEPS), RunArm(f"gpus{gpus}", (*STEPS, f"dist.nproc={gpus}"), gpus=gpus)),
        bars=(Ratio("tokens_per_s", f"gpus{gpus}", "one", ">=", bar),),
        metrics=METRICS,
        cards=("H100", "H200"),
        repeats=2,
        notes=(
            f"The bar, {bar}x, is {bar / gpus:.3f} of linear. val_bpb of the two should agree within bf16's "
            "run-to-run noise (the same batches, summed in another order)."
        ),
    )


DIST_2GPU = scaling(2, 1.90)
DIST_4GPU = scaling(4, 3.70)

RESUME_SECONDS = 100
RESUME = (
    "experiment=pgolf_record",
    "dist.nproc=2",
    f"budget.train_seconds={RESUME_SECONDS}",
    "checkpoint.every_seconds=60",
    "eval.every_steps=100",
    "quant=off",
    "ttt=off",
)
DIST_RESUME = Check(
    name="dist_resume",
    measures=(
        "A 2-GPU pgolf_record run stopped with SIGTERM halfway and resumed from its checkpoint against the same "
        f"run uninterrupted ({RESUME_SECONDS} s of training each): tokens/s over both parts, and how far the "
        "resumed loss curve strays from the uninterrupted one."
    ),
    arms=(
        RunArm("full", RESUME, gpus=2),
        RunArm("resumed", RESUME, gpus=2, stop_after_s=RESUME_SECONDS / 2, compare_with="full"),
    ),
    bars=(Ratio("tokens_per_s", "resumed", "full", ">=", 0.98),),
    metrics=(
        "tokens_per_s",
        "steps",
        "val_loss",
        "resumed_from_step",
        "max_train_loss_diff",
        "checkpoint_write_s",
        "epochs",
    ),
    cards=("H100", "H200"),
    timeout_s=900.0,
    notes=(
        "With a time budget each run's LR schedule follows its own clock, so the curves are close, not equal; "
        "exact equality under a step budget is what the CPU tests check. The resumed part warms up from the "
        "compile cache the first part filled."
    ),
)

CHECKS = (DIST_2GPU, DIST_4GPU, DIST_RESUME)
