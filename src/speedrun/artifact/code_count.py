"""The code side of the artifact, by parameter-golf's rule: the source a submission needs to train, evaluate and
dequantize the model, plus the compressed model bytes. How the code is counted is ``artifact.code_rule``:

- ``wrapped`` (the default): the length of the self-extracting train_gpt.py the run writes into its run dir
  (speedrun.artifact.wrap: the modules the run's re-run imports, computed from its Plan by
  speedrun.artifact.closure, minified and compressed with the run's resolved config), the way parameter-golf's
  records ship their code. The number and the file cannot disagree.
- ``raw``: the raw UTF-8 bytes of the files below, uncompressed.

CODE_FILES is the raw rule's source, as data in one place: src/run.py and every speedrun module the run's path imports
(resolve, build, the model and its attention backends, training, evaluation, TTT, quantization and the
artifact's loader, the record keeping the entry point cannot run without). NOT_COUNTED names the modules that path
imports but a submission would not need, each with the reason. tests/artifact/test_artifact_code.py walks the imports
from src/run.py and fails when a module on the path is in neither list or a listed file is no longer on it, so
the list cannot rot. Not counted either, because nothing on the path imports them: report/, sweep.py, stats.py,
the Hydra plugins, scripts/ (data preparation, benchmarks) and the embedded corpus (data, not code).
The Hydra YAML under conf/ is configuration, not source, and is not counted (the wrapped file carries the
resolved config instead).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedrun.records.store import write_json

if TYPE_CHECKING:
    from speedrun.artifact.wrap import CodeSource
    from speedrun.config.code_rule import ArtifactConfig

SRC = Path(__file__).resolve().parents[2]
"""src/: CODE_FILES are relative to it."""

CODE_FILES: tuple[str, ...] = (
    "run.py",
    "speedrun/__init__.py",
    "speedrun/artifact/__init__.py",
    "speedrun/artifact/closure.py",
    "speedrun/artifact/code_count.py",
    "speedrun/artifact/minify.py",
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
    "speedrun/config/model.py",
    "speedrun/config/quant.py",
    "speedrun/config/specs.py",
    "speedrun/config/track.py",
    "speedrun/config/training.py",
    "speedrun/config/tree.py",
    "speedrun/data/__init__.py",
    "speedrun/data/bpb.py",
    "speedrun/data/corpus.py",
    "speedrun/data/encoding.py",
    "speedrun/data/existing.py",
    "speedrun/data/layout.py",
    "speedrun/data/loader.py",
    "speedrun/data/prepare.py",
    "speedrun/data/shards.py",
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
    "speedrun/records/identity.py",
    "speedrun/records/lock.py",
    "speedrun/records/result_block.py",
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
    "speedrun/run/loggers.py": "reporting only (console progress lines); training, evaluation and dequantization "
    "run the same without it",
    "speedrun/run/plan_only.py": "`python -m run ... --plan` alone: prints the resolved Plan and exits before any "
    "training, evaluation or dequantization",
    "speedrun/run/preflight.py": "`python -m run`'s check that the run dir can be made, before Hydra makes it; "
    "training, evaluation and dequantization never reach it",
}

WRAPPED_FILE = "train_gpt.py"
"""The self-extracting file in the run dir (the wrapped rule), under parameter-golf's name for a submission's code."""

MANIFEST = "artifact_code.json"
"""The run-dir file saying how the code was counted, with each packed file's raw and minified bytes."""


def code_manifest() -> list[dict[str, Any]]:
    """[{"path": "speedrun/model/gpt.py", "raw_bytes": 10568, "minified_bytes": None}, ...]: raw UTF-8 bytes of
    each counted file, as on disk."""
    return [{"path": rel, "raw_bytes": len((SRC / rel).read_bytes()), "minified_bytes": None} for rel in CODE_FILES]


def code_bytes() -> int:
    """The raw rule's count of the source as it is on disk."""
    return sum(f["raw_bytes"] for f in code_manifest())


def write_manifest(
    run_dir: Path, model_bytes: int, cap_bytes: int, rule: ArtifactConfig, code: CodeSource | None = None
) -> dict[str, Any]:
    """Count the code by ``rule`` (wrapped: write train_gpt.py into the run dir first; ``code`` is the source the
    job read when it started, or now when None), write artifact_code.json; returns the result keys
    (artifact_model_bytes, artifact_code_bytes, artifact_code_sha256, artifact_bytes, artifact_ok,
    artifact_code_rule, artifact_code_compressor)."""
    wrapped = rule.code_rule == "wrapped"
    if wrapped:
        data, files, extra = _wrapped(run_dir, rule, code)
        counted, sha256 = len(data), hashlib.sha256(data).hexdigest()
    else:
        counted, files, extra, sha256 = code_bytes(), code_manifest(), {}, None
    keys = {
        "artifact_model_bytes": model_bytes,
        "artifact_code_bytes": counted,
        # the export checks the train_gpt.py it ships against this: a file edited after the run is not the run's
        "artifact_code_sha256": sha256,
        "artifact_bytes": model_bytes + counted,
        "artifact_ok": model_bytes + counted <= cap_bytes,
        "artifact_code_rule": str(rule.code_rule),
        "artifact_code_compressor": extra.get("compressor"),  # the wrapped file's: lzma, brotli or zlib
    }
    how = (
        f"code counted as the bytes of the self-extracting {WRAPPED_FILE} (the modules the run reaches, minified, "
        "compressed, with the config)"
        if wrapped
        else "code counted as raw UTF-8 bytes of each file"
    )
    write_json(
        run_dir / MANIFEST,
        {
            "rule": f"{how} + the compressed model (parameter-golf)",
            **keys,
            "cap_bytes": cap_bytes,
            **extra,
            "files": files,
            "not_counted": NOT_COUNTED,
        },
    )
    return keys


def _wrapped(run_dir: Path, rule: ArtifactConfig, code: CodeSource | None) -> tuple[bytes, list, dict[str, Any]]:
    """The self-extracting file in the run dir: built from ``code``, or, on a re-run of an exported file
    (artifact.code_file), that file itself. (its bytes, the files it packs, manifest keys)."""
    from speedrun.artifact.unwrap import compressor_of, read_wrapper  # here: a raw count reads no file

    if rule.code_file is not None:
        data = Path(rule.code_file).read_bytes()
        packed, _ = read_wrapper(data)
        files = [{"path": p, "raw_bytes": None, "minified_bytes": len(s.encode())} for p, s in packed.items()]
        extra: dict[str, Any] = {
            "code_file": WRAPPED_FILE,
            "copied_from": str(rule.code_file),
            "compressor": compressor_of(data),
        }
    else:
        from speedrun.artifact.wrap import CodeSource, build_wrapper  # making a file: never in a re-run (code_file)

        code = code or CodeSource.snapshot()
        data, minified = build_wrapper(code)
        files = [
            {"path": p, "raw_bytes": len(code.files[p].encode()), "minified_bytes": len(minified[p].encode())}
            for p in code.files  # paths in the repository: src/... and the conf/ files the resolver reads
        ]
        from speedrun.artifact.minify import minifier_version  # a file is made here, so the minifier ran

        extra = {
            "code_file": WRAPPED_FILE,
            "minifier": f"python-minifier {minifier_version()}",
            "compressor": compressor_of(data),
        }
    tmp = run_dir / f".{WRAPPED_FILE}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, run_dir / WRAPPED_FILE)
    return data, files, extra
