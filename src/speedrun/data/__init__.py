"""Data layer: embedded corpus, SentencePiece tokenizers, token shards, BPB byte accounting,
batch loading and dataset preparation. See docs/architecture.md for the formats and the BPB rule."""

from speedrun.data.bpb import ByteLUTs, bits_per_byte, build_byte_luts, stream_bytes, token_bytes, unigram_bits_per_byte
from speedrun.data.corpus import EMBEDDED_CORPUS, iter_documents, load_embedded_documents, split_train_val
from speedrun.data.existing import open_dataset, parameter_golf_help
from speedrun.data.loader import TokenStream, load_val_tokens
from speedrun.data.prepare import (
    DataNotFoundError,
    DatasetPaths,
    ensure_embedded_dataset,
    prepare_dataset,
    read_dataset_info,
)
from speedrun.data.shards import ShardError, list_shards, read_shard, validate_shard, write_shard
from speedrun.data.tokenizer import load_tokenizer, train_tokenizer

__all__ = [
    "EMBEDDED_CORPUS",
    "ByteLUTs",
    "DataNotFoundError",
    "DatasetPaths",
    "ShardError",
    "TokenStream",
    "bits_per_byte",
    "build_byte_luts",
    "ensure_embedded_dataset",
    "iter_documents",
    "list_shards",
    "load_embedded_documents",
    "load_tokenizer",
    "load_val_tokens",
    "open_dataset",
    "parameter_golf_help",
    "prepare_dataset",
    "read_dataset_info",
    "read_shard",
    "split_train_val",
    "stream_bytes",
    "token_bytes",
    "train_tokenizer",
    "unigram_bits_per_byte",
    "validate_shard",
    "write_shard",
]
