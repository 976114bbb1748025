"""Building datasets: the embedded corpus, SentencePiece tokenizers, shard writing, CaseOps data's byte sidecars
(speedrun.data.caseops) and dataset preparation; reading them (shards, streams, byte accounting) is
speedrun.core.data. See docs/architecture.md for the formats and the BPB rule.

The names below are importable from here, each loaded from its module on first use: importing one module of the
package (the loader, say) does not import the others, so a run imports only what its Plan uses."""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "speedrun.core.data": "ByteLUTs DatasetPaths ShardError TokenStream build_byte_luts list_shards list_sidecars "
    "load_tokenizer load_val_bytes load_val_tokens read_shard sidecar_name token_bytes",
    "speedrun.data.bpb": "bits_per_byte stream_bytes unigram_bits_per_byte",
    "speedrun.data.corpus": "EMBEDDED_CORPUS iter_documents load_embedded_documents split_train_val",
    "speedrun.data.existing": "open_dataset parameter_golf_help",
    "speedrun.data.layout": "DataNotFoundError",
    "speedrun.data.prepare": "ensure_embedded_dataset prepare_dataset read_dataset_info",
    "speedrun.data.shards": "validate_shard write_shard",
    "speedrun.data.tokenizer": "train_tokenizer",
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names.split()}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'speedrun.data' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
