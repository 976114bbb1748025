"""The raw rule's source (artifact.code_rule=raw), as data in one place.

CODE_FILES is src/run.py and every speedrun module the run's path imports (resolve, build, the model and its
attention backends, training, evaluation, TTT, quantization and the artifact's loader, the record keeping the entry
point cannot run without). NOT_COUNTED names the modules that path imports but a submission would not need, each
with the reason. tests/artifact/test_artifact_code.py walks the imports from src/run.py and fails when a module on
the path is in neither list or a listed file is no longer on it, so the list cannot rot. Not counted either, because
nothing on the path imports them: report/, sweep.py, stats.py, the Hydra plugins, scripts/ (data preparation,
benchmarks) and the embedded corpus (data, not code). The Hydra YAML under conf/ is configuration, not source, and
is not counted (the wrapped file carries the resolved config instead).
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
    "speedrun/artifact/closure.py",
    "speedrun/artifact/code_count.py",
    "speedrun/artifact/minify.py",
    "speedrun/artifact/raw_rule.py",
    "speedrun/artifact/unwrap.py",
    "speedrun/artifact/wrap.py",
    "speedrun/config/__init__.py",
    "speedrun/config/code_rule.py",
    "speedrun/config/checkpointing.py",
    "speedrun/config/choices.py",
    "speedrun/config/compressors.py",
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
    "speedrun/data/__init__.py",
    "speedrun/data/bpb.py",
    "speedrun/data/caseops.py",
    "speedrun/data/corpus.py",
    "speedrun/data/encoding.py",
    "speedrun/data/existing.py",
    "speedrun/data/layout.py",
    "speedrun/data/loader.py",
    "speedrun/data/prepare.py",
    "speedrun/data/shards.py",
    "speedrun/data/staging.py",
    "speedrun/data/tiktoken_bpe.py",
    "speedrun/data/tokenizer.py",
    "speedrun/distributed/__init__.py",
    "speedrun/distributed/environment.py",
    "speedrun/distributed/guard.py",
    "speedrun/distributed/launch.py",
    "speedrun/distributed/world.py",
    "speedrun/errors.py",
    "speedrun/evaluation/__init__.py",
    "speedrun/evaluation/evaluate.py",
    "speedrun/hardware/__init__.py",
    "speedrun/hardware/cards.py",
    "speedrun/hardware/profiles.py",
    "speedrun/hardware/threads.py",
    "speedrun/kernels/__init__.py",
    "speedrun/kernels/cache.py",
    "speedrun/kernels/compile.py",
    "speedrun/kernels/graphs.py",
    "speedrun/kernels/profile.py",
    "speedrun/kernels/tiles.py",
    "speedrun/kernels/tuned.py",
    "speedrun/model/__init__.py",
    "speedrun/model/attention/__init__.py",
    "speedrun/model/attention/base.py",
    "speedrun/model/attention/fa3.py",
    "speedrun/model/attention/flex.py",
    "speedrun/model/attention/math.py",
    "speedrun/model/attention/sdpa.py",
    "speedrun/model/blocks.py",
    "speedrun/model/fp8.py",
    "speedrun/model/gpt.py",
    "speedrun/model/layers.py",
    "speedrun/model/optim.py",
    "speedrun/model/protocol.py",
    "speedrun/model/registry.py",
    "speedrun/model/shape.py",
    "speedrun/paths.py",
    "speedrun/plan/__init__.py",
    "speedrun/plan/attention.py",
    "speedrun/plan/batch.py",
    "speedrun/plan/budget.py",
    "speedrun/plan/dist_choice.py",
    "speedrun/plan/dtypes.py",
    "speedrun/plan/kernel_choice.py",
    "speedrun/plan/memory.py",
    "speedrun/plan/model_choice.py",
    "speedrun/plan/options.py",
    "speedrun/plan/scoring.py",
    "speedrun/plan/track.py",
    "speedrun/plan/types.py",
    "speedrun/progress.py",
    "speedrun/quant/__init__.py",
    "speedrun/quant/calibration.py",
    "speedrun/quant/classes.py",
    "speedrun/quant/compression.py",
    "speedrun/quant/gptq.py",
    "speedrun/quant/lqer.py",
    "speedrun/quant/model_export.py",
    "speedrun/quant/pergroup.py",
    "speedrun/quant/quantize.py",
    "speedrun/quant/report.py",
    "speedrun/records/__init__.py",
    "speedrun/records/atomic.py",
    "speedrun/records/identity.py",
    "speedrun/records/lock.py",
    "speedrun/records/result_block.py",
    "speedrun/records/rundir.py",
    "speedrun/records/store.py",
    "speedrun/run/__init__.py",
    "speedrun/run/finish.py",
    "speedrun/run/finish_ttt.py",
    "speedrun/run/heartbeat.py",
    "speedrun/run/job.py",
    "speedrun/run/oom.py",
    "speedrun/run/job_record.py",
    "speedrun/run/runner.py",
    "speedrun/run/signals.py",
    "speedrun/run/track_verdict.py",
    "speedrun/tables.py",
    "speedrun/training/__init__.py",
    "speedrun/training/batch_search.py",
    "speedrun/training/budget.py",
    "speedrun/training/build.py",
    "speedrun/training/checkpoint.py",
    "speedrun/training/dense_metrics.py",
    "speedrun/training/loop.py",
    "speedrun/training/loop_setup.py",
    "speedrun/training/mfu.py",
    "speedrun/training/peak_memory.py",
    "speedrun/training/periodic.py",
    "speedrun/training/preempt.py",
    "speedrun/training/resume.py",
    "speedrun/training/run_steps.py",
    "speedrun/training/stepper.py",
    "speedrun/ttt/__init__.py",
    "speedrun/ttt/adapt.py",
    "speedrun/ttt/base_scores.py",
    "speedrun/ttt/documents.py",
    "speedrun/ttt/global_phases.py",
    "speedrun/ttt/graphs.py",
    "speedrun/ttt/lora.py",
    "speedrun/ttt/optim.py",
    "speedrun/ttt/result.py",
    "speedrun/ttt/schedule.py",
    "speedrun/ttt/score_first.py",
    "speedrun/ttt/scorers.py",
    "speedrun/ttt/settings.py",
    "speedrun/ttt/steps.py",
    "speedrun/version.py",
)

NOT_COUNTED: dict[str, str] = {
    "speedrun/config/did_you_mean.py": "`python -m run`'s check of the command line's keys and options, before "
    "Hydra composes; training, evaluation and dequantization never reach it",
    "speedrun/task.py": "Hydra's task function around speedrun.main, returning the run's objective to the "
    "sweeper; training, evaluation and dequantization never reach it",
    "speedrun/cli.py": "`python -m run --version` and `--hydra-help` alone (src/run.py's command line): they print "
    "and exit before any training, evaluation or dequantization",
    "speedrun/run/loggers.py": "reporting only (console progress lines); training, evaluation and dequantization "
    "run the same without it",
    "speedrun/run/plan_only.py": "`python -m run ... --plan` alone: prints the resolved Plan and exits before any "
    "training, evaluation or dequantization",
    "speedrun/run/preflight.py": "`python -m run`'s check that the run dir can be made, before Hydra makes it; "
    "training, evaluation and dequantization never reach it",
    "speedrun/training/start_gate.py": "a wait before timed training that only SPEEDRUN_START_GATE (set by "
    "speedrun.bench beside a peer script) turns on; training, evaluation and dequantization run the same without it",
}


def code_manifest() -> list[dict[str, Any]]:
    """[{"path": "speedrun/model/gpt.py", "raw_bytes": 10568, "minified_bytes": None}, ...]: raw UTF-8 bytes of
    each counted file, as on disk."""
    return [{"path": rel, "raw_bytes": len((SRC / rel).read_bytes()), "minified_bytes": None} for rel in CODE_FILES]


def code_bytes() -> int:
    """The raw rule's count of the source as it is on disk."""
    return sum(f["raw_bytes"] for f in code_manifest())
