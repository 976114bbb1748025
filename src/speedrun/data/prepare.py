"""Datasets on disk: build (tokenizer + shards) from documents, the cached embedded corpus, and
opening existing shard directories such as parameter-golf's published FineWeb exports.

A prepared directory holds tokenizer.model (+ .vocab), fineweb_{train,val}_%06d.bin and
dataset.json (counts, tokenizer settings, val byte count, unigram baseline). It is assembled in a
temporary sibling directory and renamed into place, so a killed build never leaves half a dataset.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from speedrun.data.bpb import build_byte_luts, stream_bytes, unigram_bits_per_byte
from speedrun.data.corpus import EMBEDDED_CORPUS, load_embedded_documents, split_train_val
from speedrun.data.shards import list_shards, read_header, shard_name, write_shard
from speedrun.data.tiktoken_bpe import GPT2, boundary_id, build_tiktoken_luts, is_tiktoken, load_encoding
from speedrun.data.tokenizer import TRAINER_SETTINGS, load_tokenizer, train_tokenizer
from speedrun.errors import DataError

TOKENIZER_FILE = "tokenizer.model"
INFO_FILE = "dataset.json"
#: Bump when the build changes (tokenizer settings, split, format): cached embedded datasets rebuild.
BUILD_VERSION = 1
EMBEDDED_VAL_EVERY = 20
ENCODE_BATCH_DOCS = 256


class DataNotFoundError(DataError, FileNotFoundError):
    """A dataset or tokenizer path is missing; the message says what was expected and how to get it."""


@dataclass(frozen=True)
class DatasetPaths:
    """Shards and tokenizer of one dataset."""

    train: list[Path]
    val: list[Path]
    tokenizer: Path
    vocab_size: int

    @property
    def directory(self) -> Path:
        return self.train[0].parent


def _log(msg: str) -> None:
    print(f"[speedrun.data] {msg}", file=sys.stderr, flush=True)


class _ShardWriter:
    """Appends documents' tokens to fixed-size shards fineweb_{split}_%06d.bin."""

    def __init__(self, directory: Path, split: str, shard_tokens: int) -> None:
        self.directory, self.split = directory, split
        self.buf = np.empty(shard_tokens, dtype=np.uint16)
        self.fill = 0
        self.paths: list[Path] = []
        self.tokens = 0

    def add(self, tokens: np.ndarray) -> None:
        while tokens.size:
            k = min(self.buf.size - self.fill, tokens.size)
            self.buf[self.fill : self.fill + k] = tokens[:k]
            self.fill += k
            tokens = tokens[k:]
            if self.fill == self.buf.size:
                self.flush()

    def flush(self) -> None:
        if self.fill:
            path = self.directory / shard_name(self.split, len(self.paths))
            write_shard(path, self.buf[: self.fill])
            self.paths.append(path)
            self.tokens += self.fill
            self.fill = 0


def _with_bos(encoded: list[list[int]], bos: int) -> np.ndarray:
    """One uint16 array: [BOS] + ids of each document, concatenated."""
    out = np.empty(sum(len(ids) + 1 for ids in encoded), dtype=np.uint16)
    pos = 0
    for ids in encoded:
        out[pos] = bos
        out[pos + 1 : pos + 1 + len(ids)] = ids
        pos += len(ids) + 1
    return out


def _encode_docs(sp, docs: list[str], num_threads: int) -> Iterator[np.ndarray]:
    """Per batch of documents, one uint16 array: [BOS] + ids of each document, concatenated."""
    for i in range(0, len(docs), ENCODE_BATCH_DOCS):
        yield _with_bos(sp.encode(docs[i : i + ENCODE_BATCH_DOCS], out_type=int, num_threads=num_threads), sp.bos_id())


#: Characters per task of the process pool: small enough to balance the workers, large enough that a task's
#: pickling costs little next to its encoding (~6M characters a second a core).
POOL_TASK_CHARS = 2_000_000
_worker_sp = None  # each pool worker's tokenizer


def _pool_init(model: bytes) -> None:
    global _worker_sp
    import sentencepiece as spm

    _worker_sp = spm.SentencePieceProcessor(model_proto=model)


def _pool_encode(docs: list[str]) -> np.ndarray:
    assert _worker_sp is not None
    return _with_bos(_worker_sp.encode(docs, out_type=int), _worker_sp.bos_id())


def _pool_tasks(docs: list[str]) -> Iterator[list[str]]:
    start, size = 0, 0
    for i, doc in enumerate(docs):
        size += len(doc)
        if size >= POOL_TASK_CHARS:
            yield docs[start : i + 1]
            start, size = i + 1, 0
    if start < len(docs):
        yield docs[start:]


def _encode_docs_pool(pool, docs: list[str]) -> Iterator[np.ndarray]:
    """As _encode_docs, the batches encoded by ``pool``'s workers and yielded in document order. Worker processes
    rather than the tokenizer's threads: turning ids into Python lists and arrays holds the GIL, which caps
    threads at about twice one core's rate."""
    yield from pool.imap(_pool_encode, _pool_tasks(docs))


def _process_pool(model: Path, processes: int):
    # fork where it is safe, so workers start at once without re-importing torch
    method = "fork" if sys.platform == "linux" else None
    return multiprocessing.get_context(method).Pool(processes, initializer=_pool_init, initargs=(model.read_bytes(),))


def _decoded_bytes(sp, val_stream: np.ndarray) -> int:
    """UTF-8 bytes of the decoded val documents (split at BOS)."""
    bos_positions = np.flatnonzero(val_stream == sp.bos_id()).tolist() + [val_stream.size]
    docs = [val_stream[a + 1 : b].tolist() for a, b in zip(bos_positions[:-1], bos_positions[1:])]
    return sum(len(text.encode("utf-8")) for text in sp.decode(docs))


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


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
) -> DatasetPaths:
    """Train a tokenizer on the train documents and write train/val shards into ``out_dir``.

    Each document becomes [BOS] + its ids; documents may span shard boundaries. Everything is
    written to a temporary sibling directory that is renamed to ``out_dir`` at the end.
    The tokenizer is trained on a seeded sample of ``tokenizer_chars`` characters of
    ``tokenizer_texts`` (default: the train documents; pass a subset for a large corpus, since the
    whole of it is cut into chunks before sampling). ``processes`` > 1 encodes in that many worker
    processes (the same ids; for corpora of hundreds of MB). ``info`` is merged into dataset.json;
    a callable is given the record (``tokenizer_sha256`` included) and returns the keys to merge.
    Raises FileExistsError if ``out_dir`` exists (unless ``overwrite``).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists; pass overwrite=True (--overwrite) to replace it")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
    train_docs, val_docs = list(documents_train), list(documents_val)
    if not train_docs or not val_docs:
        raise ValueError(f"need at least one train and one val document (got {len(train_docs)} and {len(val_docs)})")
    threads = num_threads or min(os.cpu_count() or 1, 16)
    t0 = time.perf_counter()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        texts = train_docs if tokenizer_texts is None else list(tokenizer_texts)
        n_chars = sum(len(d) for d in texts)
        _log(f"training tokenizer (vocab {vocab_size}) on {len(texts)} documents, {n_chars:,} characters")
        model = train_tokenizer(texts, tmp / Path(TOKENIZER_FILE).stem, vocab_size, seed, max_chars=tokenizer_chars)
        del texts
        sp = load_tokenizer(model)
        pool = _process_pool(model, processes) if processes and processes > 1 else None
        where = f" in {processes} processes" if pool else ""
        _log(f"tokenizing {len(train_docs)} train + {len(val_docs)} val documents{where}")
        try:

            def encode(docs: list[str]) -> Iterator[np.ndarray]:
                return _encode_docs_pool(pool, docs) if pool else _encode_docs(sp, docs, threads)

            counts = np.zeros(vocab_size, dtype=np.int64)
            train_writer = _ShardWriter(tmp, "train", shard_tokens)
            for chunk in encode(train_docs):
                counts += np.bincount(chunk, minlength=vocab_size)
                train_writer.add(chunk)
            train_writer.flush()
            val_stream = np.concatenate(list(encode(val_docs)))
        finally:
            if pool is not None:
                pool.terminate()
        val_writer = _ShardWriter(tmp, "val", shard_tokens)
        val_writer.add(val_stream)
        val_writer.flush()

        luts = build_byte_luts(sp)
        val_bytes = stream_bytes(torch.from_numpy(val_stream.astype(np.int64)), luts)
        decoded_bytes = _decoded_bytes(sp, val_stream)
        original_bytes = sum(len(d.encode("utf-8")) for d in val_docs)
        if val_bytes != decoded_bytes:
            _log(f"WARNING: counted val bytes {val_bytes} != decoded val bytes {decoded_bytes} (BPB would be off)")
        elif val_bytes != original_bytes:
            _log(
                f"note: the tokenizer does not round-trip all val text ({val_bytes} counted bytes vs "
                f"{original_bytes} in the original; a literal U+2581 decodes to a space)"
            )
        record = {
            "build_version": BUILD_VERSION,
            "vocab_size": vocab_size,
            "tokenizer": TOKENIZER_FILE,
            "tokenizer_settings": {**TRAINER_SETTINGS, "seed": seed},
            "tokenizer_sha256": _sha256(model),
            "shard_tokens": shard_tokens,
            "train": {"documents": len(train_docs), "tokens": train_writer.tokens, "shards": len(train_writer.paths)},
            "val": {
                "documents": len(val_docs),
                "tokens": val_writer.tokens,
                "shards": len(val_writer.paths),
                "bytes": val_bytes,
                "bytes_original_text": original_bytes,
            },
            # -sum log2 p_train(y) / val bytes over val targets, add-one smoothed unigram of train.
            "unigram_val_bpb": unigram_bits_per_byte(counts, val_stream, luts),
        }
        record.update(info(record) if callable(info) else info or {})
        (tmp / INFO_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        _install(tmp, out_dir, overwrite)
    except BaseException:
        _remove_tree(tmp)
        raise
    _log(
        f"wrote {out_dir}: {train_writer.tokens:,} train tokens in {len(train_writer.paths)} shard(s), "
        f"{val_writer.tokens:,} val tokens ({val_bytes:,} bytes) in {time.perf_counter() - t0:.1f}s"
    )
    return _open_prepared(out_dir)


def _encode_tiktoken_docs(enc, docs: list[str], num_threads: int) -> Iterator[np.ndarray]:
    """As _encode_docs for a tiktoken encoding: [<|endoftext|>] + ids per document, as modded-nanogpt's
    fineweb.py writes them. encode_ordinary: a literal "<|endoftext|>" inside a document is text, not a boundary."""
    eot = boundary_id(enc)
    for i in range(0, len(docs), ENCODE_BATCH_DOCS):
        encoded = enc.encode_ordinary_batch(docs[i : i + ENCODE_BATCH_DOCS], num_threads=num_threads)
        yield np.concatenate([np.asarray([eot, *ids], dtype=np.uint16) for ids in encoded])


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
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists; pass overwrite=True (--overwrite) to replace it")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
    train_docs, val_docs = list(documents_train), list(documents_val)
    if not train_docs or not val_docs:
        raise ValueError(f"need at least one train and one val document (got {len(train_docs)} and {len(val_docs)})")
    threads = num_threads or min(os.cpu_count() or 1, 16)
    t0 = time.perf_counter()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _log(f"tokenizing {len(train_docs)} train + {len(val_docs)} val documents with {tokenizer}")
        counts = np.zeros(vocab_size, dtype=np.int64)
        train_writer = _ShardWriter(tmp, "train", shard_tokens)
        for chunk in _encode_tiktoken_docs(enc, train_docs, threads):
            counts += np.bincount(chunk, minlength=vocab_size)
            train_writer.add(chunk)
        train_writer.flush()
        val_stream = np.concatenate(list(_encode_tiktoken_docs(enc, val_docs, threads)))
        val_writer = _ShardWriter(tmp, "val", shard_tokens)
        val_writer.add(val_stream)
        val_writer.flush()
        luts = build_tiktoken_luts(enc)
        val_bytes = stream_bytes(torch.from_numpy(val_stream.astype(np.int64)), luts)
        original_bytes = sum(len(d.encode("utf-8")) for d in val_docs)
        if val_bytes != original_bytes:  # byte-level BPE is lossless: this would be a bug, not a tokenizer quirk
            _log(f"WARNING: counted val bytes {val_bytes} != the val text's {original_bytes} (BPB would be off)")
        record = {
            "build_version": BUILD_VERSION,
            "vocab_size": vocab_size,
            "tokenizer": str(tokenizer),
            "tokenizer_kind": "tiktoken",
            "shard_tokens": shard_tokens,
            "train": {"documents": len(train_docs), "tokens": train_writer.tokens, "shards": len(train_writer.paths)},
            "val": {
                "documents": len(val_docs),
                "tokens": val_writer.tokens,
                "shards": len(val_writer.paths),
                "bytes": val_bytes,
                "bytes_original_text": original_bytes,
            },
            "unigram_val_bpb": unigram_bits_per_byte(counts, val_stream, luts),
            **(info or {}),
        }
        (tmp / INFO_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        _install(tmp, out_dir, overwrite)
    except BaseException:
        _remove_tree(tmp)
        raise
    _log(
        f"wrote {out_dir}: {train_writer.tokens:,} train tokens in {len(train_writer.paths)} shard(s), "
        f"{val_writer.tokens:,} val tokens ({val_bytes:,} bytes) in {time.perf_counter() - t0:.1f}s"
    )
    return DatasetPaths(
        train=list_shards(out_dir, "train"),
        val=list_shards(out_dir, "val"),
        tokenizer=Path(tokenizer),
        vocab_size=vocab_size,
    )


def _install(tmp: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished ``tmp`` to ``out_dir``; with overwrite, swap out an existing one."""
    old = None
    if out_dir.exists() and overwrite:
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except OSError as e:
        if out_dir.exists():
            raise FileExistsError(f"{out_dir} appeared while building (another process?)") from e
        raise
    finally:
        if old is not None:
            _remove_tree(old)


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
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def _exclusive_lock(path: Path):
    """Hold an exclusive fcntl lock on ``path`` (no-op where fcntl does not exist)."""
    try:
        import fcntl
    except ImportError:  # Windows: fall back to the atomic rename alone
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def embedded_dir(cache_dir: Path, vocab_size: int) -> Path:
    """Where ensure_embedded_dataset builds the embedded corpus of ``vocab_size`` (an exported train_gpt.py, which
    does not carry the corpus, trains on the built directory: speedrun.rerun)."""
    return Path(cache_dir).expanduser() / f"embedded_pydoc311_sp{vocab_size}"


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
    with _exclusive_lock(cache_dir / f".{target.name}.lock"):
        info = read_dataset_info(target)
        if info and all(info.get(k) == v for k, v in stamp.items()):
            return _open_prepared(target)
        for stale in cache_dir.glob(f".{target.name}.tmp-*"):  # left by a killed build (we hold the lock)
            _remove_tree(stale)
        train, val = split_train_val(load_embedded_documents(), EMBEDDED_VAL_EVERY)
        _log(f"building the embedded dataset in {target} (once)")
        try:
            return prepare_dataset(train, val, target, vocab_size, overwrite=target.exists(), info=stamp)
        except FileExistsError:
            if read_dataset_info(target).get("corpus_sha256") == stamp["corpus_sha256"]:
                return _open_prepared(target)
            raise


# Published parameter-golf exports: vocab size -> (variant, Hugging Face dataset repo).
_PGOLF_VARIANTS = {
    512: ("sp512", None),
    1024: ("sp1024", None),
    2048: ("sp2048", None),
    4096: ("sp4096", None),
    8192: ("sp8192", "kevclark/parameter-golf"),  # not in the default repo; community export
}


def parameter_golf_help(vocab_size: int) -> str:
    """How to download parameter-golf's FineWeb shards for ``vocab_size`` and point speedrun at them."""
    variant, repo = _PGOLF_VARIANTS.get(vocab_size, ("sp1024", None))
    env = f"MATCHED_FINEWEB_REPO_ID={repo} " if repo else ""
    source = f"{repo}, a community export" if repo else "willdepueoai/parameter-golf"
    n = variant[2:]
    lines = [
        f"To use parameter-golf's published FineWeb shards ({variant}; Hugging Face dataset {source}):",
        "    git clone https://github.com/openai/parameter-golf && cd parameter-golf",
        f"    {env}python3 data/cached_challenge_fineweb.py --variant {variant} --train-shards 10",
        f"  which writes data/datasets/fineweb10B_{variant}/ (fineweb_train_*.bin, fineweb_val_*.bin; 100M tokens per",
        f"  train shard, the full val split always) and data/tokenizers/fineweb_{n}_bpe.model. Then set",
        f"    data.path=<parameter-golf>/data/datasets/fineweb10B_{variant} "
        f"data.tokenizer=<parameter-golf>/data/tokenizers/fineweb_{n}_bpe.model",
        "  or leave data.path unset to train on the embedded corpus (Python 3.11 docs).",
    ]
    if vocab_size not in _PGOLF_VARIANTS:
        lines.insert(
            0,
            f"(parameter-golf publishes no vocab {vocab_size} export; variants: "
            f"{', '.join(v for v, _ in _PGOLF_VARIANTS.values())}.)",
        )
    return "\n".join(lines)


def prepared_help(path: Path, vocab_size: int) -> str:
    """One line: how to build a dataset directory that keeps its tokenizer inside (scripts/prepare_data.py's)."""
    return (
        f"build it with: python scripts/prepare_data.py --source python --out {path} --vocab {vocab_size} "
        "(this machine's Python sources and docs; or --input FILE... in place of --source python, for your own text)"
    )


def open_dataset(path: Path, tokenizer: Path | str, vocab_size: int) -> DatasetPaths:
    """An existing shard directory plus its tokenizer, checked: shards present with valid headers,
    tokenizer present with exactly ``vocab_size`` pieces."""
    if is_tiktoken(tokenizer):
        return _open_tiktoken_dataset(Path(path).expanduser(), str(tokenizer), vocab_size)
    path, tokenizer = Path(path).expanduser(), Path(tokenizer).expanduser()
    if os.path.abspath(tokenizer.parent) == os.path.abspath(path):
        # A directory that holds its own tokenizer is scripts/prepare_data.py's (parameter-golf keeps tokenizers
        # apart from the shards): name the command that builds it, on the same line.
        help_text = f"; {prepared_help(path, vocab_size)}"
    else:
        help_text = f"\n{parameter_golf_help(vocab_size)}"
    if not path.is_dir():
        raise DataNotFoundError(f"dataset directory not found: {path}{help_text}")
    try:
        train, val = list_shards(path, "train"), list_shards(path, "val")
    except FileNotFoundError as e:
        raise DataNotFoundError(f"{e}{help_text}") from None
    if not tokenizer.is_file():
        raise DataNotFoundError(f"tokenizer not found: {tokenizer} (the SentencePiece .model of {path}){help_text}")
    sp = load_tokenizer(tokenizer)
    n = int(sp.get_piece_size())
    if n != vocab_size:
        raise DataError(
            f"tokenizer {tokenizer} has {n} pieces but the configured vocab_size is {vocab_size}; "
            f"use the tokenizer that made {path} and set the vocab size to {n} (or pick the matching variant)"
        )
    for shard in train + val:
        read_header(shard)  # cheap: magic, version, size; token ids are checked as batches are read
    return DatasetPaths(train=train, val=val, tokenizer=tokenizer, vocab_size=vocab_size)


MODDED_NANOGPT_HELP = (
    "To get modded-nanogpt's GPT-2-tokenized FineWeb shards (fineweb_train_%06d.bin, fineweb_val_%06d.bin):\n"
    "    git clone https://github.com/KellerJordan/modded-nanogpt && cd modded-nanogpt\n"
    "    python data/cached_fineweb10B.py 8     # the val shard and 8 train shards of 100M tokens\n"
    "  which writes data/fineweb10B/. Then set data=fineweb10B_gpt2 data.path=<modded-nanogpt>/data/fineweb10B,\n"
    "  or tokenize your own text: python scripts/prepare_data.py --tokenizer gpt2 --input ... --out DIR"
)


def _open_tiktoken_dataset(path: Path, tokenizer: str, vocab_size: int) -> DatasetPaths:
    """Shards tokenized with a tiktoken vocabulary (GPT-2): shards checked, vocabulary size matched."""
    if not path.is_dir():
        raise DataNotFoundError(f"dataset directory not found: {path}\n{MODDED_NANOGPT_HELP}")
    try:
        train, val = list_shards(path, "train"), list_shards(path, "val")
    except FileNotFoundError as e:
        raise DataNotFoundError(f"{e}\n{MODDED_NANOGPT_HELP}") from None
    n = int(load_encoding(tokenizer).n_vocab)
    if n != vocab_size:
        raise DataError(
            f"tokenizer {tokenizer} has {n} tokens but the configured vocab_size is {vocab_size}; "
            f"set data.vocab_size={n}"
        )
    for shard in train + val:
        read_header(shard)
    return DatasetPaths(train=train, val=val, tokenizer=Path(tokenizer), vocab_size=vocab_size)
