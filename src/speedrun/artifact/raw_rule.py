"""The raw rule's source (artifact.code_rule=raw), as data in one place.

CODE_FILES is src/run.py and every speedrun module the run's path imports (resolve, build, the model and its
attention backends, training, evaluation, TTT, quantization and the artifact's loader, the record keeping the entry
point cannot run without). NOT_COUNTED names the modules that path imports but a submission would not need, each
with the reason. tests/artifact/test_artifact_code.py walks the imports from src/run.py and fails when a module on
the path is in neither list or a listed file is no longer on it, so the list cannot rot. Not counted either, because
nothing on the path imports them: report/, sweep.py, stats.py, the Hydra plugins, scripts/ (data preparation,
benchmarks) and the embedded corpus (data, not code). The Hydra YAML under conf/ is configuration, not source, and
is not counted (the wrapped file carries the run's frozen settings instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2]
"""src/: CODE_FILES are relative to it."""

CODE_FILES: tuple[str, ...] = (
    "run.py",
    "speedrun/__init__.py",
    "speedrun/artifact/__init__.py",
    "speedrun/artifact/code_count.py",
    "speedrun/artifact/link.py",
    "speedrun/artifact/minify.py",
    "speedrun/artifact/raw_rule.py",
    "speedrun/artifact/unwrap.py",
    "speedrun/artifact/wrap.py",
    "speedrun/config/__init__.py",
    "speedrun/config/code_rule.py",
    "speedrun/config/checkpointing.py",
    "speedrun/config/choices.py",
    "speedrun/config/distributed.py",
    "speedrun/config/finishing.py",
    "speedrun/config/kernel.py",
    "speedrun/config/quoting.py",
    "speedrun/config/model.py",
    "speedrun/config/quant.py",
    "speedrun/config/specs.py",
    "speedrun/config/track.py",
    "speedrun/config/training.py",
    "speedrun/config/tree.py",
    "speedrun/core/__init__.py",
    "speedrun/core/attention.py",
    "speedrun/core/compile.py",
    "speedrun/core/data.py",
    "speedrun/core/dist.py",
    "speedrun/core/evaluate.py",
    "speedrun/core/fp8.py",
    "speedrun/core/fused_ce.py",
    "speedrun/core/gptq.py",
    "speedrun/core/model.py",
    "speedrun/core/optim.py",
    "speedrun/core/pergroup.py",
    "speedrun/core/pipeline.py",
    "speedrun/core/quant.py",
    "speedrun/core/train.py",
    "speedrun/core/ttt_docs.py",
    "speedrun/core/ttt_global.py",
    "speedrun/core/ttt_graphs.py",
    "speedrun/core/ttt_lora.py",
    "speedrun/core/ttt_score.py",
    "speedrun/core/ttt_scorers.py",
    "speedrun/data/__init__.py",
    "speedrun/data/bpb.py",
    "speedrun/data/caseops.py",
    "speedrun/data/corpus.py",
    "speedrun/data/encoding.py",
    "speedrun/data/existing.py",
    "speedrun/data/layout.py",
    "speedrun/data/prepare.py",
    "speedrun/data/shards.py",
    "speedrun/data/staging.py",
    "speedrun/data/tokenizer.py",
    "speedrun/distributed/__init__.py",
    "speedrun/distributed/environment.py",
    "speedrun/distributed/guard.py",
    "speedrun/distributed/launch.py",
    "speedrun/distributed/world.py",
    "speedrun/errors.py",
    "speedrun/hardware/__init__.py",
    "speedrun/hardware/cards.py",
    "speedrun/hardware/profiles.py",
    "speedrun/hardware/threads.py",
    "speedrun/kernels/__init__.py",
    "speedrun/kernels/cache.py",
    "speedrun/kernels/profile.py",
    "speedrun/kernels/tiles.py",
    "speedrun/kernels/tuned.py",
    "speedrun/paths.py",
    "speedrun/plan/__init__.py",
    "speedrun/plan/attention.py",
    "speedrun/plan/batch.py",
    "speedrun/plan/budget.py",
    "speedrun/plan/dist_choice.py",
    "speedrun/plan/kernel_choice.py",
    "speedrun/plan/memory.py",
    "speedrun/plan/model_choice.py",
    "speedrun/plan/scoring.py",
    "speedrun/plan/settings.py",
    "speedrun/plan/types.py",
    "speedrun/progress.py",
    "speedrun/records/__init__.py",
    "speedrun/records/atomic.py",
    "speedrun/records/identity.py",
    "speedrun/records/keys.py",
    "speedrun/records/lock.py",
    "speedrun/records/quant_report.py",
    "speedrun/records/rundir.py",
    "speedrun/records/store.py",
    "speedrun/run/__init__.py",
    "speedrun/run/finish.py",
    "speedrun/run/finish_ttt.py",
    "speedrun/run/heartbeat.py",
    "speedrun/run/job.py",
    "speedrun/run/oom.py",
    "speedrun/run/job_record.py",
    "speedrun/run/quant_phase.py",
    "speedrun/run/runner.py",
    "speedrun/run/signals.py",
    "speedrun/run/track_verdict.py",
    "speedrun/tables.py",
    "speedrun/run/batch_search.py",
    "speedrun/run/build.py",
    "speedrun/run/checkpoint.py",
    "speedrun/run/loop_setup.py",
    "speedrun/run/mfu.py",
    "speedrun/run/peak_memory.py",
    "speedrun/run/periodic.py",
    "speedrun/run/preempt.py",
    "speedrun/run/resume.py",
    "speedrun/run/run_steps.py",
    "speedrun/version.py",
)

NOT_COUNTED: dict[str, str] = {
    "speedrun/driver.py": "the exported train_gpt.py's entry point, linked into that file by the wrapped rule; a run "
    "counted raw trains, evaluates and dequantizes through src/run.py",
    "speedrun/task.py": "Hydra's task function around speedrun.main, returning the run's objective to the "
    "sweeper; training, evaluation and dequantization never reach it",
    "speedrun/cli.py": "`python -m run --version` and `--hydra-help` alone (src/run.py's command line): they print "
    "and exit before any training, evaluation or dequantization",
    "speedrun/run/loggers.py": "reporting only (console progress lines); training, evaluation and dequantization "
    "run the same without it",
    "speedrun/run/wandb_logger.py": "reporting only (logger=wandb's Weights & Biases run, made by the job's "
    "make_logger); training, evaluation and dequantization run the same without it",
    "speedrun/run/cli_step.py": "`python -m run`'s own steps before a run (the command line's keys and options, "
    "`--plan`, the run dir can be made); training, evaluation and dequantization never reach it",
    "speedrun/run/hooks.py": "a wait before timed training that only SPEEDRUN_START_GATE (set by "
    "speedrun.bench beside a peer script) turns on; training, evaluation and dequantization run the same without it",
}


def code_manifest() -> list[dict[str, Any]]:
    """[{"path": "speedrun/core/model.py", "raw_bytes": 10568, "minified_bytes": None}, ...]: raw UTF-8 bytes of
    each counted file, as on disk."""
    return [{"path": rel, "raw_bytes": len((SRC / rel).read_bytes()), "minified_bytes": None} for rel in CODE_FILES]


def code_bytes() -> int:
    """The raw rule's count of the source as it is on disk."""
    return sum(f["raw_bytes"] for f in code_manifest())
