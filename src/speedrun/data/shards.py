"""Token shards in the llm.c / modded-nanogpt / parameter-golf format.

A shard is a 256-entry little-endian int32 header (magic 20240520, version 1, n_tokens, then
zeros) followed by n_tokens little-endian uint16 token ids. Names: fineweb_{train,val}_%06d.bin.

A byte sidecar (CaseOps data, speedrun.data.caseops) has the same header and a uint16 payload: per token of the
val shard of the same index, its bytes of the original text (BOS 0). Names: fineweb_val_bytes_%06d.bin.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import IO

import numpy as np

from speedrun.errors import DataError
from speedrun.records.atomic import atomic_write

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
MAX_TOKEN_ID = 65535
SPLITS = ("train", "val")


class ShardError(DataError):
    """A shard file is malformed; the message names the file and what is wrong."""


def shard_name(split: str, index: int) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return f"fineweb_{split}_{index:06d}.bin"


def sidecar_name(index: int) -> str:
    """The byte sidecar of val shard ``index``."""
    return f"fineweb_val_bytes_{index:06d}.bin"


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
    header[0], header[1], header[2] = MAGIC, VERSION, tokens.size
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f: IO[bytes]) -> None:
        f.write(header.tobytes())
        f.write(tokens.astype(TOKEN_DTYPE, copy=False).tobytes())

    atomic_write(path, write)


def read_header(path: Path) -> int:
    """Check magic, version and file size; return n_tokens. Raises ShardError naming the problem."""
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
    if header[0] != MAGIC:
        raise ShardError(f"{path}: bad magic number: expected {MAGIC}, found {int(header[0])} (not a token shard?)")
    if header[1] != VERSION:
        raise ShardError(f"{path}: bad version: expected {VERSION}, found {int(header[1])}")
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


def _check_ids(path: Path, tokens: np.ndarray, vocab_size: int, offset: int = 0) -> None:
    if tokens.size == 0:
        return
    max_id = int(tokens.max())
    if max_id >= vocab_size:
        where = offset + int(np.argmax(tokens >= vocab_size))
        raise ShardError(
            f"{path}: token id {max_id} >= vocab_size {vocab_size} (first out-of-range id at token {where}); "
            "the shard was made with a different tokenizer or vocab size"
        )


def read_shard(path: Path, vocab_size: int | None = None) -> np.ndarray:
    """The shard's tokens as a read-only, memory-mapped little-endian uint16 array.

    With ``vocab_size``, every id is checked to be < vocab_size (a full scan of the file).
    """
    path = Path(path)
    n_tokens = read_header(path)
    if n_tokens == 0:
        tokens = np.zeros(0, dtype=TOKEN_DTYPE)
    else:
        tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(n_tokens,))
    if vocab_size is not None:
        _check_ids(path, tokens, vocab_size)
    return tokens


def validate_shard(path: Path, vocab_size: int | None = None) -> int:
    """Validate header, size and (with ``vocab_size``) token ids; return n_tokens."""
    return int(read_shard(path, vocab_size).size)


_NAME_RE = {split: re.compile(rf"fineweb_{split}_\d{{6}}\.bin") for split in SPLITS}
_SIDECAR_RE = re.compile(r"fineweb_val_bytes_\d{6}\.bin")


def list_sidecars(directory: Path) -> list[Path]:
    """Sorted byte sidecars ``fineweb_val_bytes_%06d.bin`` in ``directory``; [] if there are none."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _SIDECAR_RE.fullmatch(p.name) and p.is_file())


def list_shards(directory: Path, split: str) -> list[Path]:
    """Sorted shards ``fineweb_{split}_%06d.bin`` in ``directory``; FileNotFoundError if none."""
    directory = Path(directory)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    pattern = f"fineweb_{split}_%06d.bin"
    if not directory.is_dir():
        raise FileNotFoundError(f"shard directory does not exist: {directory} (expected files named {pattern})")
    paths = sorted(p for p in directory.iterdir() if _NAME_RE[split].fullmatch(p.name) and p.is_file())
    if not paths:
        raise FileNotFoundError(
            f"no {split} shards in {directory}: expected files named {pattern} (e.g. {shard_name(split, 0)})"
        )
    return paths
