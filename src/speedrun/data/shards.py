"""Writing token shards in the llm.c / modded-nanogpt / parameter-golf format (reading them: speedrun.core.data).

A shard is a 256-entry little-endian int32 header (magic 20240520, version 1, n_tokens, then
zeros) followed by n_tokens little-endian uint16 token ids. Names: fineweb_{train,val}_%06d.bin.

A byte sidecar (CaseOps data, speedrun.data.caseops) has the same header and a uint16 payload: per token of the
val shard of the same index, its bytes of the original text (BOS 0). Names: fineweb_val_bytes_%06d.bin.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

import numpy as np

from speedrun.core.data import (
    HEADER_BYTES,
    HEADER_INTS,
    SHARD_MAGIC,
    SHARD_VERSION,
    TOKEN_DTYPE,
    ShardError,
    read_shard,
)
from speedrun.records.atomic import atomic_write

MAX_TOKEN_ID = 65535


def write_shard(path: Path, tokens: np.ndarray) -> None:
    """Write ``tokens`` (1-D, integer ids in [0, 65535]) as a shard, atomically (speedrun.records.atomic)."""
    path = Path(path)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"{path}: tokens must be 1-D, got shape {tokens.shape}")
    if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"{path}: tokens must be integers, got dtype {tokens.dtype}")
    if tokens.size >= 2**31:
        raise ValueError(f"{path}: {tokens.size} tokens do not fit the int32 token count of the header")
    if tokens.size and tokens.dtype != TOKEN_DTYPE:
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi > MAX_TOKEN_ID:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{path}: token id {bad} cannot be stored as uint16 (ids must be in 0..{MAX_TOKEN_ID})")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, tokens.size
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f: IO[bytes]) -> None:
        f.write(header.tobytes())
        f.write(tokens.astype(TOKEN_DTYPE, copy=False).tobytes())

    atomic_write(path, write)


def check_header(path: Path) -> int:
    """Check magic, version and file size; return n_tokens. Raises ShardError naming the problem (what
    speedrun.core.data.read_header refuses in one line, said in full)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shard not found: {path}")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(
            f"{path}: file is {size} bytes, shorter than the {HEADER_BYTES}-byte header "
            f"({HEADER_INTS} int32); truncated or not a token shard"
        )
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise ShardError(
            f"{path}: bad magic number: expected {SHARD_MAGIC}, found {int(header[0])} (not a token shard?)"
        )
    if header[1] != SHARD_VERSION:
        raise ShardError(f"{path}: bad version: expected {SHARD_VERSION}, found {int(header[1])}")
    n_tokens = int(header[2])
    if n_tokens < 0:
        raise ShardError(f"{path}: header token count is negative ({n_tokens})")
    expected = HEADER_BYTES + TOKEN_DTYPE.itemsize * n_tokens
    if size != expected:
        held = (size - HEADER_BYTES) / TOKEN_DTYPE.itemsize
        raise ShardError(
            f"{path}: file size {size} bytes disagrees with the header's token count {n_tokens} "
            f"(expected {expected} bytes = {HEADER_BYTES} header + 2 x {n_tokens}; the file holds {held:g} tokens); "
            "truncated or corrupted"
        )
    return n_tokens


def validate_shard(path: Path, vocab_size: int | None = None) -> int:
    """Validate header, size and (with ``vocab_size``) token ids; return n_tokens."""
    check_header(path)
    return int(read_shard(path, vocab_size).size)
