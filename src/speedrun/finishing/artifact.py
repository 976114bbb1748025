"""The code side of the artifact, by parameter-golf's rule: the source a submission needs to train, evaluate and
dequantize the model, counted as raw UTF-8 bytes (uncompressed), plus the compressed model bytes.

CODE_FILES is that source, as data in one place: src/run.py and every speedrun module the run's path imports
(resolve, build, the model and its attention backends, training, evaluation, TTT, quantization and the
artifact's loader, the record keeping the entry point cannot run without). NOT_COUNTED names the modules that path
imports but a submission would not need, each with the reason. tests/test_artifact_code.py walks the imports
from src/run.py and fails when a module on the path is in neither list or a listed file is no longer on it, so
the list cannot rot. Not counted either, because nothing on the path imports them: report/, sweep.py, stats.py,
the Hydra plugins, scripts/ (data preparation, benchmarks) and the embedded corpus (data, not code).
The Hydra YAML under conf/ is configuration, not source, and is not counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2]
"""src/: CODE_FILES are relative to it."""

CODE_FILES: tuple[str, ...] = (
    "run.py",
    "speedrun/__init__.py",
    "speedrun/config/__init__.py",
    "speedrun/config/checkpointing.py",
    "speedrun/config/choices.py",
    "speedrun/config/compressors.py",
    "speedrun/config/distributed.py",
    "speedrun/config/finishing.py",
    "speedrun/config/kernel.py",
    "speedrun/config/model.py",
    "speedrun/config/quant.py",
    "speedrun/config/specs.py",
    "speedrun/config/training.py",
    "speedrun/data/__init__.py",
    "speedrun/data/bpb.py",
    "speedrun/data/corpus.py",
    "speedrun/data/loader.py",
    "speedrun/data/prepare.py",
    "speedrun/data/shards.py",
    "speedrun/data/tokenizer.py",
    "speedrun/distributed/__init__.py",
    "speedrun/distributed/guard.py",
    "speedrun/distributed/launch.py",
    "speedrun/distributed/world.py",
    "speedrun/errors.py",
    "speedrun/finishing/__init__.py",
    "speedrun/finishing/artifact.py",
    "speedrun/finishing/classes.py",
    "speedrun/finishing/compression.py",
    "speedrun/finishing/evaluate.py",
    "speedrun/finishing/finalize.py",
    "speedrun/finishing/gptq.py",
    "speedrun/finishing/lqer.py",
    "speedrun/finishing/pergroup.py",
    "speedrun/finishing/quant_report.py",
    "speedrun/finishing/quantize.py",
    "speedrun/finishing/ttt.py",
    "speedrun/hardware/__init__.py",
    "speedrun/hardware/cards.py",
    "speedrun/hardware/profiles.py",
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
    "speedrun/plan/distributed.py",
    "speedrun/plan/dtypes.py",
    "speedrun/plan/kernel.py",
    "speedrun/plan/memory.py",
    "speedrun/plan/model.py",
    "speedrun/plan/options.py",
    "speedrun/plan/types.py",
    "speedrun/progress.py",
    "speedrun/records/__init__.py",
    "speedrun/records/identity.py",
    "speedrun/records/result_block.py",
    "speedrun/records/store.py",
    "speedrun/run/__init__.py",
    "speedrun/run/job.py",
    "speedrun/run/oom.py",
    "speedrun/run/record.py",
    "speedrun/run/runner.py",
    "speedrun/run/signals.py",
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
)

NOT_COUNTED: dict[str, str] = {
    "speedrun/run/loggers.py": "reporting only (console progress lines, Weights & Biases); training, evaluation and "
    "dequantization run the same without it",
    "speedrun/run/plan_only.py": "`python -m run ... --plan` alone: prints the resolved Plan and exits before any "
    "training, evaluation or dequantization",
}

MANIFEST = "artifact_code.json"
"""The run-dir file listing the counted files and their bytes."""


def code_manifest() -> list[dict[str, Any]]:
    """[{"path": "speedrun/model/gpt.py", "bytes": 10568}, ...]: raw UTF-8 bytes of each counted file, as on disk."""
    return [{"path": rel, "bytes": len((SRC / rel).read_bytes())} for rel in CODE_FILES]


def code_bytes() -> int:
    return sum(f["bytes"] for f in code_manifest())


def write_manifest(run_dir: Path, model_bytes: int, cap_bytes: int) -> dict[str, Any]:
    """artifact_code.json in the run dir; returns the result keys (artifact_model_bytes, artifact_code_bytes,
    artifact_bytes, artifact_ok)."""
    from speedrun.records.store import write_json

    files = code_manifest()
    code = sum(f["bytes"] for f in files)
    keys = {
        "artifact_model_bytes": model_bytes,
        "artifact_code_bytes": code,
        "artifact_bytes": model_bytes + code,
        "artifact_ok": model_bytes + code <= cap_bytes,
    }
    write_json(
        run_dir / MANIFEST,
        {
            "rule": "code counted as raw UTF-8 bytes (parameter-golf), model compressed",
            **keys,
            "cap_bytes": cap_bytes,
            "files": files,
            "not_counted": NOT_COUNTED,
        },
    )
    return keys
