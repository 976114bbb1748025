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

from speedrun.core.data import HEADER_INTS, SHARD_MAGIC, SHARD_VERSION, TOKEN_DTYPE, read_shard
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


def validate_shard(path: Path, vocab_size: int | None = None) -> int:
    """Validate header, size and (with ``vocab_size``) token ids; return n_tokens."""
    return int(read_shard(path, vocab_size).size)
