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

SRC = Path(__file__).resolve().parents[1]
"""src/: CODE_FILES are relative to it."""

CODE_FILES: tuple[str, ...] = (
    "run.py",
    "speedrun/__init__.py",
    "speedrun/artifact.py",
    "speedrun/attention/__init__.py",
    "speedrun/attention/base.py",
    "speedrun/attention/fa3.py",
    "speedrun/attention/flex.py",
    "speedrun/attention/math.py",
    "speedrun/attention/sdpa.py",
    "speedrun/batch_search.py",
    "speedrun/budget.py",
    "speedrun/build.py",
    "speedrun/cards.py",
    "speedrun/checkpoint.py",
    "speedrun/config/__init__.py",
    "speedrun/config/checkpointing.py",
    "speedrun/config/choices.py",
    "speedrun/config/distributed.py",
    "speedrun/config/finishing.py",
    "speedrun/config/kernel.py",
    "speedrun/config/training.py",
    "speedrun/data/__init__.py",
    "speedrun/data/bpb.py",
    "speedrun/data/corpus.py",
    "speedrun/data/loader.py",
    "speedrun/data/prepare.py",
    "speedrun/data/shards.py",
    "speedrun/data/tokenizer.py",
    "speedrun/dist.py",
    "speedrun/dist_guard.py",
    "speedrun/errors.py",
    "speedrun/evaluate.py",
    "speedrun/finalize.py",
    "speedrun/fp8.py",
    "speedrun/hardware.py",
    "speedrun/identity.py",
    "speedrun/kernels/__init__.py",
    "speedrun/kernels/cache.py",
    "speedrun/kernels/compile.py",
    "speedrun/kernels/graphs.py",
    "speedrun/kernels/profile.py",
    "speedrun/kernels/tiles.py",
    "speedrun/kernels/tuned.py",
    "speedrun/launch.py",
    "speedrun/loop_setup.py",
    "speedrun/memory.py",
    "speedrun/metrics.py",
    "speedrun/mfu.py",
    "speedrun/model.py",
    "speedrun/oom.py",
    "speedrun/optim.py",
    "speedrun/paths.py",
    "speedrun/periodic.py",
    "speedrun/plan/__init__.py",
    "speedrun/plan/attention.py",
    "speedrun/plan/distributed.py",
    "speedrun/plan/kernel.py",
    "speedrun/plan/memory.py",
    "speedrun/plan/types.py",
    "speedrun/preempt.py",
    "speedrun/quantize.py",
    "speedrun/records.py",
    "speedrun/result_block.py",
    "speedrun/resume.py",
    "speedrun/runner.py",
    "speedrun/shape.py",
    "speedrun/signals.py",
    "speedrun/specs.py",
    "speedrun/tables.py",
    "speedrun/train.py",
    "speedrun/ttt.py",
)

NOT_COUNTED: dict[str, str] = {
    "speedrun/loggers.py": "reporting only (console progress lines, Weights & Biases); training, evaluation and "
    "dequantization run the same without it",
    "speedrun/plan_only.py": "`python -m run ... --plan` alone: prints the resolved Plan and exits before any "
    "training, evaluation or dequantization",
}

MANIFEST = "artifact_code.json"
"""The run-dir file listing the counted files and their bytes."""


def code_manifest() -> list[dict[str, Any]]:
    """[{"path": "speedrun/model.py", "bytes": 10568}, ...]: raw UTF-8 bytes of each counted file, as on disk."""
    return [{"path": rel, "bytes": len((SRC / rel).read_bytes())} for rel in CODE_FILES]


def code_bytes() -> int:
    return sum(f["bytes"] for f in code_manifest())


def write_manifest(run_dir: Path, model_bytes: int, cap_bytes: int) -> dict[str, Any]:
    """artifact_code.json in the run dir; returns the result keys (artifact_model_bytes, artifact_code_bytes,
    artifact_bytes, artifact_ok)."""
    from .records import write_json

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
