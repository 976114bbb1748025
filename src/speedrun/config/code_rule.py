"""Schema of the ``artifact`` node: how the artifact's code side is counted, and the package that rule needs
(checked by the resolver before any work, as config.quant.check_compressor does for the compressors; torch-free)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from speedrun.config.choices import Choice, _require

MINIFIER_MODULE = "python_minifier"
MINIFIER_REQUIREMENT = "python-minifier>=3.4,<4"
"""The pip requirement (pyproject.toml's dependency): the minifier's output, and so the wrapped file's bytes, may
change with its major version."""


class CodeRule(Choice):
    wrapped = "wrapped"
    raw = "raw"


@dataclass
class ArtifactConfig:
    code_rule: CodeRule = CodeRule.wrapped
    """How artifact_code_bytes counts the code (docs/export.md). wrapped: the length of the self-extracting
    train_gpt.py the run writes into its run dir (its source minified, lzma-compressed, base85-encoded, with the run's
    resolved config), the way parameter-golf's records ship their code; needs python-minifier. raw: the raw UTF-8
    bytes of every file in speedrun.artifact.raw_rule.CODE_FILES, uncompressed (about six times more)."""
    code_file: str | None = None
    """A self-extracting file to count as the code instead of building one: an exported train_gpt.py sets it to
    itself when it re-runs, so the file that ran is the file counted. Leave unset."""

    def __post_init__(self) -> None:
        _require(
            self.code_file is None or self.code_rule == CodeRule.wrapped,
            f"artifact.code_file={self.code_file} is a wrapped file: it needs artifact.code_rule=wrapped",
        )


def check_code_rule(artifact: ArtifactConfig) -> None:
    """Raise ValueError naming the fix when the rule cannot be applied here: python-minifier missing for wrapped
    (looked up without importing it), or artifact.code_file not a file."""
    if artifact.code_file is not None:
        if not Path(artifact.code_file).is_file():
            raise ValueError(f"artifact.code_file={artifact.code_file} does not exist; leave artifact.code_file unset")
        return  # the file exists: nothing is minified
    if artifact.code_rule == CodeRule.wrapped and importlib.util.find_spec(MINIFIER_MODULE) is None:
        raise ValueError(
            "artifact.code_rule=wrapped minifies the code into a self-extracting train_gpt.py and needs the "
            f"'python-minifier' package, which is not installed: pip install '{MINIFIER_REQUIREMENT}' "
            "(or count the source raw with artifact.code_rule=raw)"
        )
