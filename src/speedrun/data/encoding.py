"""Documents into token shards: the fixed-size shard writer and the encoders ([BOS] + ids per document), in
process with the tokenizer's threads, in a pool of worker processes for a large corpus, or with a tiktoken
vocabulary. speedrun.data.prepare builds datasets with them."""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speedrun.core.data import boundary_id, shard_name
from speedrun.data.shards import write_shard

ENCODE_BATCH_DOCS = 256


class ShardWriter:
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


def encode_docs(sp, docs: list[str], num_threads: int) -> Iterator[np.ndarray]:
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


def encode_docs_pool(pool, docs: list[str]) -> Iterator[np.ndarray]:
    """As encode_docs, the batches encoded by ``pool``'s workers and yielded in document order. Worker processes
    rather than the tokenizer's threads: turning ids into Python lists and arrays holds the GIL, which caps
    threads at about twice one core's rate."""
    yield from pool.imap(_pool_encode, _pool_tasks(docs))


def process_pool(model: Path, processes: int):
    # fork where it is safe, so workers start at once without re-importing torch
    method = "fork" if sys.platform == "linux" else None
    return multiprocessing.get_context(method).Pool(processes, initializer=_pool_init, initargs=(model.read_bytes(),))


def decoded_bytes(sp, val_stream: np.ndarray) -> int:
    """UTF-8 bytes of the decoded val documents (split at BOS)."""
    bos_positions = np.flatnonzero(val_stream == sp.bos_id()).tolist() + [val_stream.size]
    docs = [val_stream[a + 1 : b].tolist() for a, b in zip(bos_positions[:-1], bos_positions[1:])]
    return sum(len(text.encode("utf-8")) for text in sp.decode(docs))


def encode_tiktoken_docs(enc, docs: list[str], num_threads: int) -> Iterator[np.ndarray]:
    """As encode_docs for a tiktoken encoding: [<|endoftext|>] + ids per document, as modded-nanogpt's
    fineweb.py writes them. encode_ordinary: a literal "<|endoftext|>" inside a document is text, not a boundary."""
    eot = boundary_id(enc)
    for i in range(0, len(docs), ENCODE_BATCH_DOCS):
        encoded = enc.encode_ordinary_batch(docs[i : i + ENCODE_BATCH_DOCS], num_threads=num_threads)
        yield np.concatenate([np.asarray([eot, *ids], dtype=np.uint16) for ids in encoded])


@dataclass(frozen=True)
class ShardTarget:
    """Where a build writes its shards and how: the directory, tokens per shard, the vocabulary's size."""

    directory: Path
    shard_tokens: int
    vocab_size: int


@dataclass
class WrittenSplits:
    """What a build wrote: both splits' shard writers, the train token counts (the unigram baseline's), the val
    token stream and its counted bytes."""

    train: ShardWriter
    val: ShardWriter
    counts: np.ndarray
    val_stream: np.ndarray
    val_bytes: int = 0


def write_splits(
    encode: Callable[[list[str]], Iterator[np.ndarray]], train_docs: list[str], val_docs: list[str], to: ShardTarget
) -> WrittenSplits:
    """Encode both splits into shards, counting the train tokens on the way."""
    counts = np.zeros(to.vocab_size, dtype=np.int64)
    train = ShardWriter(to.directory, "train", to.shard_tokens)
    for chunk in encode(train_docs):
        counts += np.bincount(chunk, minlength=to.vocab_size)
        train.add(chunk)
    train.flush()
    val_stream = np.concatenate(list(encode(val_docs)))
    val = ShardWriter(to.directory, "val", to.shard_tokens)
    val.add(val_stream)
    val.flush()
    return WrittenSplits(train, val, counts, val_stream)
