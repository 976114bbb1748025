"""A prepared dataset's layout on disk (speedrun.data.prepare builds one, speedrun.data.existing opens one made
elsewhere): its file names, its paths, and where the embedded corpus is built. Apart from prepare so that a run that
opens a dataset made elsewhere never imports the builder.
"""

from __future__ import annotations

from pathlib import Path

from speedrun.errors import DataError

TOKENIZER_FILE = "tokenizer.model"
INFO_FILE = "dataset.json"


class DataNotFoundError(DataError, FileNotFoundError):
    """A dataset or tokenizer path is missing; the message says what was expected and how to get it."""


def embedded_dir(cache_dir: Path, vocab_size: int) -> Path:
    """Where ensure_embedded_dataset builds the embedded corpus of ``vocab_size`` (an exported train_gpt.py, which
    does not carry the corpus, trains on the built directory: speedrun.artifact.wrap.frozen_settings)."""
    return Path(cache_dir).expanduser() / f"embedded_pydoc311_sp{vocab_size}"
