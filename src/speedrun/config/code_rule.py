"""Schema of the ``artifact`` node: how the artifact's code side is counted, and the package that rule needs
(checked by the resolver before any work, as config.quant.check_compressor does for the compressors; torch-free)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from speedrun.config.choices import Choice

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
    train_gpt.py the run writes into its run dir (the driver and the core it reaches, linked into one module with the
    run's settings, minified and compressed), the way parameter-golf's records ship their code; needs
    python-minifier. raw: the raw UTF-8 bytes of every file in speedrun.artifact.raw_rule.CODE_FILES, uncompressed
    (several times more)."""


def check_code_rule(artifact: ArtifactConfig) -> None:
    """Raise ValueError naming the fix when the rule cannot be applied here: python-minifier missing for wrapped
    (looked up without importing it)."""
    if artifact.code_rule == CodeRule.wrapped and importlib.util.find_spec(MINIFIER_MODULE) is None:
        raise ValueError(
            "artifact.code_rule=wrapped minifies the code into a self-extracting train_gpt.py and needs the "
            f"'python-minifier' package, which is not installed: pip install '{MINIFIER_REQUIREMENT}' "
            "(or count the source raw with artifact.code_rule=raw)"
        )
