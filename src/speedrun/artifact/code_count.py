"""The code side of the artifact, by parameter-golf's rule: the source a submission needs to train, evaluate and
dequantize the model, plus the compressed model bytes. How the code is counted is ``artifact.code_rule``:

- ``wrapped`` (the default): the length of the self-extracting train_gpt.py the run writes into its run dir
  (speedrun.artifact.wrap: the driver and the core it reaches for the run's Plan, linked into one module with the
  run's frozen settings, minified and compressed), the way parameter-golf's records ship their code, with
  train_gpt_human.py, the same module to read. The number and the file cannot disagree.
- ``raw``: the raw UTF-8 bytes of the files speedrun.artifact.raw_rule lists, uncompressed (imported only by a run
  that counts that way, so a wrapped file does not carry the list).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedrun.records.atomic import atomic_write
from speedrun.records.store import write_json

if TYPE_CHECKING:
    from speedrun.artifact.wrap import CodeSource
    from speedrun.config.code_rule import ArtifactConfig

WRAPPED_FILE = "train_gpt.py"
"""The self-extracting file in the run dir (the wrapped rule), under parameter-golf's name for a submission's code."""
HUMAN_FILE = "train_gpt_human.py"
"""Beside it, the same code to read (parameter-golf's records ship a *_human.py the same way): not counted."""

MANIFEST = "artifact_code.json"
"""The run-dir file saying how the code was counted, with each packed file's raw and minified bytes."""


def write_manifest(
    run_dir: Path, model_bytes: int, cap_bytes: int, rule: ArtifactConfig, code: CodeSource | None = None
) -> dict[str, Any]:
    """Count the code by ``rule`` (wrapped: link train_gpt.py into the run dir first from ``code``, the source the
    job read when it started with the run's settings), write artifact_code.json; returns the result keys
    (artifact_model_bytes, artifact_code_bytes, artifact_code_sha256, artifact_bytes, artifact_ok,
    artifact_code_rule, artifact_code_compressor)."""
    wrapped = rule.code_rule == "wrapped"
    if wrapped:
        if code is None:
            raise ValueError("the wrapped rule links the run's code for its Plan: pass its CodeSource")
        data, files, extra = _wrapped(run_dir, code)
        counted, sha256 = len(data), hashlib.sha256(data).hexdigest()
    else:
        from speedrun.artifact.raw_rule import NOT_COUNTED, code_bytes, code_manifest  # code_rule=raw, a Plan's choice

        counted, files, sha256 = code_bytes(), code_manifest(), None
        extra = {"not_counted": NOT_COUNTED}
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
        f"code counted as the bytes of the self-extracting {WRAPPED_FILE} (the core the run reaches, linked into one "
        "module with its settings, minified, compressed)"
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
        },
    )
    return keys


def _wrapped(run_dir: Path, code: CodeSource) -> tuple[bytes, list, dict[str, Any]]:
    """Link train_gpt.py and train_gpt_human.py from ``code`` into the run dir: (the file's bytes, the modules it
    links with each one's raw bytes, manifest keys)."""
    from speedrun.artifact.minify import minifier_version  # making a file: the minifier runs
    from speedrun.artifact.unwrap import compressor_of
    from speedrun.artifact.wrap import build_wrapper

    data, human = build_wrapper(code)
    atomic_write(run_dir / HUMAN_FILE, human.encode("utf-8"))
    linked = sorted(set(re.findall(r"^# ---- (speedrun/\S+\.py) ----$", human, re.M)))
    files = [{"path": f"src/{p}", "raw_bytes": len(code.files[f"src/{p}"].encode())} for p in linked]
    extra = {
        "code_file": WRAPPED_FILE,
        "readable_file": HUMAN_FILE,
        "minifier": f"python-minifier {minifier_version()}",
        "compressor": compressor_of(data),
    }
    atomic_write(run_dir / WRAPPED_FILE, data)
    return data, files, extra
