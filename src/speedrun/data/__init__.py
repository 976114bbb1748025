"""Data layer: embedded corpus, SentencePiece tokenizers, token shards, BPB byte accounting (with CaseOps data's
byte sidecars: speedrun.data.caseops), batch loading and dataset preparation. See docs/architecture.md for the
formats and the BPB rule.

The names below are importable from here, each loaded from its module on first use: importing one module of the
package (the loader, say) does not import the others, so a run's train_gpt.py carries only the ones its Plan
reaches (speedrun.artifact.closure)."""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "bpb": "ByteLUTs bits_per_byte build_byte_luts stream_bytes token_bytes unigram_bits_per_byte",
    "corpus": "EMBEDDED_CORPUS iter_documents load_embedded_documents split_train_val",
    "existing": "open_dataset parameter_golf_help",
    "loader": "TokenStream load_val_bytes load_val_tokens",
    "layout": "DataNotFoundError DatasetPaths",
    "prepare": "ensure_embedded_dataset prepare_dataset read_dataset_info",
    "shards": "ShardError list_shards list_sidecars read_shard sidecar_name validate_shard write_shard",
    "tokenizer": "load_tokenizer train_tokenizer",
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names.split()}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'speedrun.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"speedrun.data.{module}"), name)
