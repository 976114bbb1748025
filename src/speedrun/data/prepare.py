"""Datasets on disk: build (tokenizer + shards) from documents, and the cached embedded corpus. The encoding of
documents into shards is speedrun.data.encoding's; opening directories made elsewhere (parameter-golf's published
FineWeb exports, modded-nanogpt's) is speedrun.data.existing's.

A prepared directory holds tokenizer.model (+ .vocab), fineweb_{train,val}_%06d.bin and
dataset.json (counts, tokenizer settings, val byte count, unigram baseline); a CaseOps build
(``caseops=True``, speedrun.data.caseops) adds each val shard's byte sidecar fineweb_val_bytes_%06d.bin. It is
assembled in a temporary sibling directory ``.<name>.tmp-*`` and renamed into place, so a killed build never leaves
half a dataset; the temporary directory of a build that was killed (SIGKILL, a lost machine) is removed by the
next build of the same directory, which knows it is dead because its lock on the directory is gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from speedrun.core.data import (
    GPT2,
    DatasetPaths,
    build_byte_luts,
    build_tiktoken_luts,
    list_shards,
    list_sidecars,
    load_encoding,
    sidecar_name,
)
from speedrun.data import caseops as caseops_transform
from speedrun.data.bpb import stream_bytes, unigram_bits_per_byte, warn_if_inexact
from speedrun.data.corpus import EMBEDDED_CORPUS, load_embedded_documents, split_train_val
from speedrun.data.encoding import (
    ShardTarget,
    WrittenSplits,
    decoded_bytes,
    encode_docs,
    encode_docs_pool,
    encode_tiktoken_docs,
    process_pool,
    write_splits,
)
from speedrun.data.layout import INFO_FILE, TOKENIZER_FILE, DataNotFoundError, embedded_dir
from speedrun.data.shards import check_header, write_shard
from speedrun.data.staging import build_in_temp, exclusive_lock, remove_tree
from speedrun.data.tokenizer import TRAINER_SETTINGS, check_recorded_sha256, open_tokenizer, train_tokenizer
from speedrun.errors import DataError

__all__ = ["INFO_FILE", "TOKENIZER_FILE", "DataNotFoundError", "DatasetPaths", "embedded_dir"]  # from data.layout

#: Bump when the build changes (tokenizer settings, split, format): cached embedded datasets rebuild.
BUILD_VERSION = 1
EMBEDDED_VAL_EVERY = 20


def _log(msg: str) -> None:
    print(f"[speedrun.data] {msg}", file=sys.stderr, flush=True)


def prepare_dataset(
    documents_train: Iterable[str],
    documents_val: Iterable[str],
    out_dir: Path,
    vocab_size: int,
    shard_tokens: int = 100_000_000,
    *,
    seed: int = 0,
    num_threads: int | None = None,
    processes: int | None = None,
    tokenizer_texts: Iterable[str] | None = None,
    tokenizer_chars: int = 4_000_000,
    overwrite: bool = False,
    info: dict | Callable[[dict], dict] | None = None,
    caseops: bool = False,
    tokenizer_model: Path | None = None,
) -> DatasetPaths:
    """Train a tokenizer on the train documents and write train/val shards into ``out_dir`` (built in a temporary
    sibling, speedrun.data.staging). Each document becomes [BOS] + its ids; documents may span shard boundaries.
    The tokenizer is trained on a seeded sample of ``tokenizer_chars`` characters of ``tokenizer_texts`` (default:
    the train documents; pass a subset for a large corpus, since the whole of it is cut into chunks before
    sampling). ``processes`` > 1 encodes in that many worker processes (the same ids). ``info`` is merged into
    dataset.json; a callable is given the record (``tokenizer_sha256`` included) and returns the keys to merge.
    ``caseops``: every text in CaseOps first (speedrun.data.caseops), the operators reserved as pieces, each val
    shard with its byte sidecar, and the val bytes (dataset.json, the unigram baseline) the original text's.
    ``tokenizer_model``: encode with this SentencePiece model (copied in) instead of training one; ``vocab_size``
    must be its size. Raises FileExistsError if ``out_dir`` exists (unless ``overwrite``)."""
    out_dir = Path(out_dir)
    if tokenizer_model is not None:
        _check_given_model(Path(tokenizer_model), vocab_size, caseops)
    train_docs, val_docs = _documents(documents_train, documents_val, out_dir, shard_tokens, overwrite)
    original_bytes = sum(len(d.encode("utf-8")) for d in val_docs)
    settings: dict[str, object] = {}
    if caseops:  # the tokenizer reserves the operators as pieces of their own, as the records' does
        train_docs, val_docs = _in_caseops(train_docs), _in_caseops(val_docs)
        tokenizer_texts = None if tokenizer_texts is None else _in_caseops(tokenizer_texts)
        settings = {"user_defined_symbols": list(caseops_transform.OPERATORS)}
    threads = num_threads or min(os.cpu_count() or 1, 16)
    t0 = time.perf_counter()

    def build(tmp: Path) -> WrittenSplits:
        if tokenizer_model is None:
            texts = train_docs if tokenizer_texts is None else list(tokenizer_texts)
            model = _trained_tokenizer(texts, tmp, vocab_size, seed, tokenizer_chars, settings)
            del texts  # a large corpus's tokenizer sample is not kept through the encoding
        else:
            model = Path(shutil.copyfile(tokenizer_model, tmp / TOKENIZER_FILE))
        sp = open_tokenizer(model)
        pool = process_pool(model, processes) if processes and processes > 1 else None
        where = f" in {processes} processes" if pool else ""
        _log(f"tokenizing {len(train_docs)} train + {len(val_docs)} val documents{where}")
        try:
            written = write_splits(
                lambda docs: encode_docs_pool(pool, docs) if pool else encode_docs(sp, docs, threads),
                train_docs,
                val_docs,
                ShardTarget(tmp, shard_tokens, vocab_size),
            )
        finally:
            if pool is not None:
                pool.terminate()
        warn_if_inexact(sp)
        luts = build_byte_luts(sp)
        if caseops:
            written.val_bytes = _write_sidecars(sp, written, val_docs, tmp, original_bytes)
        else:
            _count_val_bytes(sp, luts, written, original_bytes)
        record = {
            "build_version": BUILD_VERSION,
            "vocab_size": vocab_size,
            "tokenizer": TOKENIZER_FILE,
            "tokenizer_settings": (
                {**TRAINER_SETTINGS, **settings, "seed": seed}
                if tokenizer_model is None
                else {"given": str(tokenizer_model)}
            ),
            "tokenizer_sha256": _sha256(model),
            "shard_tokens": shard_tokens,
            **_splits_record(written, train_docs, val_docs, original_bytes),
            # -sum log2 p_train(y) / val bytes over val targets, add-one smoothed unigram of train.
            "unigram_val_bpb": unigram_bits_per_byte(
                written.counts, written.val_stream, luts, val_bytes=written.val_bytes
            ),
        }
        if caseops:
            record["text_transform"] = caseops_transform.NAME
        record.update(info(record) if callable(info) else info or {})
        _write_info(tmp, record)
        return written

    _log_written(out_dir, build_in_temp(out_dir, overwrite, build), t0)
    return _open_prepared(out_dir)


def prepare_tiktoken_dataset(
    documents_train: Iterable[str],
    documents_val: Iterable[str],
    out_dir: Path,
    tokenizer: str = GPT2,
    shard_tokens: int = 100_000_000,
    *,
    num_threads: int | None = None,
    overwrite: bool = False,
    info: dict | None = None,
) -> DatasetPaths:
    """Tokenize documents with a tiktoken vocabulary (``gpt2`` or a ``*.tiktoken`` file) into train/val shards
    laid out as modded-nanogpt's (each document = [<|endoftext|>] + its ids). Nothing is trained; dataset.json
    records the tokenizer, so the directory opens with data.tokenizer=<the same value>. Atomic as prepare_dataset.
    """
    enc = load_encoding(tokenizer)  # fails here, before any work, without tiktoken or the vocabulary
    vocab_size = int(enc.n_vocab)
    if vocab_size > 65536:
        raise ValueError(f"{tokenizer} has {vocab_size} tokens: uint16 shards hold at most 65536")
    out_dir = Path(out_dir)
    train_docs, val_docs = _documents(documents_train, documents_val, out_dir, shard_tokens, overwrite)
    threads = num_threads or min(os.cpu_count() or 1, 16)
    t0 = time.perf_counter()

    def build(tmp: Path) -> WrittenSplits:
        _log(f"tokenizing {len(train_docs)} train + {len(val_docs)} val documents with {tokenizer}")
        written = write_splits(
            lambda docs: encode_tiktoken_docs(enc, docs, threads),
            train_docs,
            val_docs,
            ShardTarget(tmp, shard_tokens, vocab_size),
        )
        luts = build_tiktoken_luts(enc)
        written.val_bytes = stream_bytes(torch.from_numpy(written.val_stream.astype(np.int64)), luts)
        original_bytes = sum(len(d.encode("utf-8")) for d in val_docs)
        if written.val_bytes != original_bytes:  # byte-level BPE is lossless: this would be a bug, not a quirk
            _log(
                f"WARNING: counted val bytes {written.val_bytes} != the val text's {original_bytes} (BPB would be off)"
            )
        record = {
            "build_version": BUILD_VERSION,
            "vocab_size": vocab_size,
            "tokenizer": str(tokenizer),
            "tokenizer_kind": "tiktoken",
            "shard_tokens": shard_tokens,
            **_splits_record(written, train_docs, val_docs, original_bytes),
            "unigram_val_bpb": unigram_bits_per_byte(written.counts, written.val_stream, luts),
            **(info or {}),
        }
        _write_info(tmp, record)
        return written

    _log_written(out_dir, build_in_temp(out_dir, overwrite, build), t0)
    return DatasetPaths(
        train=list_shards(out_dir, "train"),
        val=list_shards(out_dir, "val"),
        tokenizer=Path(tokenizer),
        vocab_size=vocab_size,
    )


# ---- the phases both builds share ----------------------------------------------------------------------


def _documents(
    documents_train: Iterable[str], documents_val: Iterable[str], out_dir: Path, shard_tokens: int, overwrite: bool
) -> tuple[list[str], list[str]]:
    """Both splits as lists, after the checks a build makes before any work."""
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists; pass overwrite=True (--overwrite) to replace it")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
    train_docs, val_docs = list(documents_train), list(documents_val)
    if not train_docs or not val_docs:
        raise ValueError(f"need at least one train and one val document (got {len(train_docs)} and {len(val_docs)})")
    return train_docs, val_docs


def _trained_tokenizer(
    texts: list[str], tmp: Path, vocab_size: int, seed: int, max_chars: int, settings: dict[str, object]
) -> Path:
    n_chars = sum(len(d) for d in texts)
    _log(f"training tokenizer (vocab {vocab_size}) on {len(texts)} documents, {n_chars:,} characters")
    return train_tokenizer(
        texts, tmp / Path(TOKENIZER_FILE).stem, vocab_size, seed, max_chars=max_chars, extra_settings=settings
    )


def _check_given_model(model: Path, vocab_size: int, caseops: bool) -> None:
    """Refuse, before any work, a given tokenizer that is missing, of another size, or (``caseops``) without the
    case operators as pieces of their own."""
    if not model.is_file():
        raise FileNotFoundError(f"tokenizer {model} not found")
    sp = open_tokenizer(model)
    if int(sp.get_piece_size()) != vocab_size:
        raise ValueError(f"tokenizer {model} has {sp.get_piece_size()} pieces, not vocab_size {vocab_size}")
    if caseops and any(sp.piece_to_id(op) == sp.unk_id() for op in caseops_transform.OPERATORS):
        raise ValueError(
            f"tokenizer {model} does not reserve the CaseOps operators U+E001..U+E004 as pieces; use a CaseOps "
            "tokenizer (the records' *_lossless_caps_caseops_v1_reserved.model) or let --caseops train one"
        )


def _in_caseops(texts: Iterable[str]) -> list[str]:
    return [caseops_transform.encode(t) for t in texts]


def _write_sidecars(sp, written: WrittenSplits, val_docs: list[str], directory: Path, original_bytes: int) -> int:
    """Each val shard's byte sidecar (the original bytes of its tokens, speedrun.data.caseops), written beside it
    in ``directory``; returns their sum, which must be the original val text's UTF-8 bytes."""
    ids, counts = caseops_transform.val_byte_sidecar(sp, val_docs)
    if not np.array_equal(ids, written.val_stream.astype(np.int64)):  # both encode the same text with one model
        raise DataError("the byte sidecar's tokens differ from the val shards' (a bug in the build); nothing written")
    total = int(counts.sum(dtype=np.int64))
    if total != original_bytes:
        raise DataError(f"the byte sidecar sums to {total} bytes but the val text has {original_bytes} (a bug)")
    start = 0
    for index, shard in enumerate(written.val.paths):
        n = check_header(shard)
        write_shard(directory / sidecar_name(index), counts[start : start + n])
        start += n
    return total


def _count_val_bytes(sp, luts, written: WrittenSplits, original_bytes: int) -> None:
    """The val bytes by the tokenizer's rule, into ``written``; a warning when they differ from the decoded text's
    (BPB would be off), a note when they differ only from the original text's (``original_bytes``: the tokenizer
    does not round-trip it)."""
    written.val_bytes = stream_bytes(torch.from_numpy(written.val_stream.astype(np.int64)), luts)
    decoded = decoded_bytes(sp, written.val_stream)
    if written.val_bytes != decoded:
        _log(f"WARNING: counted val bytes {written.val_bytes} != decoded val bytes {decoded} (BPB would be off)")
    elif written.val_bytes != original_bytes:
        _log(
            f"note: the tokenizer does not round-trip all val text ({written.val_bytes} counted bytes vs "
            f"{original_bytes} in the original; a literal U+2581 decodes to a space)"
        )


def _splits_record(written: WrittenSplits, train_docs: list[str], val_docs: list[str], original_bytes: int) -> dict:
    """dataset.json's train and val entries: documents, tokens, shards; for val its counted and original bytes."""
    return {
        "train": {"documents": len(train_docs), "tokens": written.train.tokens, "shards": len(written.train.paths)},
        "val": {
            "documents": len(val_docs),
            "tokens": written.val.tokens,
            "shards": len(written.val.paths),
            "bytes": written.val_bytes,
            "bytes_original_text": original_bytes,
        },
    }


def _write_info(directory: Path, record: dict) -> None:
    (directory / INFO_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _log_written(out_dir: Path, written: WrittenSplits, t0: float) -> None:
    _log(
        f"wrote {out_dir}: {written.train.tokens:,} train tokens in {len(written.train.paths)} shard(s), "
        f"{written.val.tokens:,} val tokens ({written.val_bytes:,} bytes) in {time.perf_counter() - t0:.1f}s"
    )


def read_dataset_info(directory: Path) -> dict:
    """dataset.json of a prepared directory ({} if absent, e.g. parameter-golf's shards)."""
    path = Path(directory) / INFO_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _open_prepared(directory: Path) -> DatasetPaths:
    info = read_dataset_info(directory)
    return DatasetPaths(
        train=list_shards(directory, "train"),
        val=list_shards(directory, "val"),
        tokenizer=directory / TOKENIZER_FILE,
        vocab_size=int(info["vocab_size"]),
        val_bytes=list_sidecars(directory),
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ensure_embedded_dataset(cache_dir: Path, vocab_size: int = 1024) -> DatasetPaths:
    """The embedded Python-docs corpus as a dataset in cache_dir/embedded_pydoc311_sp{vocab}/.

    Built once (a few seconds) and reused while the corpus file and BUILD_VERSION are unchanged.
    Concurrent callers serialize on a lock file; without fcntl, a builder that loses the final
    rename uses the winner's directory.
    """
    cache_dir = Path(cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = embedded_dir(cache_dir, vocab_size)
    stamp = {"corpus": EMBEDDED_CORPUS.name, "corpus_sha256": _sha256(EMBEDDED_CORPUS), "build_version": BUILD_VERSION}
    with exclusive_lock(cache_dir / f".{target.name}.lock"):
        info = read_dataset_info(target)
        if info and all(info.get(k) == v for k, v in stamp.items()):
            check_recorded_sha256(target / TOKENIZER_FILE, target)  # a swapped tokenizer.model is never used
            return _open_prepared(target)
        for stale in cache_dir.glob(f".{target.name}.tmp-*"):  # left by a killed build (we hold the lock)
            remove_tree(stale)
        train, val = split_train_val(load_embedded_documents(), EMBEDDED_VAL_EVERY)
        _log(f"building the embedded dataset in {target} (once)")
        try:
            return prepare_dataset(train, val, target, vocab_size, overwrite=target.exists(), info=stamp)
        except FileExistsError:
            if read_dataset_info(target).get("corpus_sha256") == stamp["corpus_sha256"]:
                return _open_prepared(target)
            raise
