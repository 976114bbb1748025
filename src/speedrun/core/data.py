"""The data a run reads: token shards, the training stream and the val tokens, and the byte accounting that turns
nats into bits per byte (SentencePiece's rule, a byte-level BPE's, or a byte sidecar's).

Building datasets (the embedded corpus, tokenizer training, shard writing, CaseOps) is speedrun.data's, outside the
core; a run only opens what is there (``TOKENIZERS``, the ``data.tokenizer_kind`` choice, loads the tokenizer).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import torch

from speedrun.core import choice
from speedrun.errors import DataError

# ---- shards -----------------------------------------------------------------------------------------------------------
# Token shards in the llm.c / modded-nanogpt / parameter-golf format.
#
# A shard is a 256-entry little-endian int32 header (magic 20240520, version 1, n_tokens, then
# zeros) followed by n_tokens little-endian uint16 token ids. Names: fineweb_{train,val}_%06d.bin.
#
# A byte sidecar (CaseOps data, speedrun.data.caseops) has the same header and a uint16 payload: per token of the
# val shard of the same index, its bytes of the original text (BOS 0). Names: fineweb_val_bytes_%06d.bin.


SHARD_MAGIC = 20240520

SHARD_VERSION = 1

HEADER_INTS = 256

HEADER_BYTES = HEADER_INTS * 4

TOKEN_DTYPE = np.dtype("<u2")

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


def read_header(path: Path) -> int:
    """The shard's token count, its header and size checked (speedrun.data.shards.validate_shard says more)."""
    h = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    n = int(h[2]) if h.size == HEADER_INTS else -1
    if n < 0 or h[0] != SHARD_MAGIC or h[1] != SHARD_VERSION or Path(path).stat().st_size != HEADER_BYTES + 2 * n:
        raise ShardError(f"{path}: not a token shard (header or size); rebuild or re-download it")
    return n


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


# ---- a dataset's files ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetPaths:
    """Shards and tokenizer of one dataset."""

    train: list[Path]
    val: list[Path]
    tokenizer: Path
    vocab_size: int
    val_bytes: list[Path] = field(default_factory=list)
    """The val shards' byte sidecars (CaseOps data: sidecar_name), one per val shard; [] for
    data whose tokens count their own bytes."""

    @property
    def directory(self) -> Path:
        return self.train[0].parent


def dataset_paths(directory: Path, tokenizer: str | Path, vocab_size: int) -> DatasetPaths:
    """The shards (and byte sidecars) in ``directory`` with their tokenizer, as a run that was handed its data reads
    them (speedrun.data.existing.open_dataset checks them first, with the fix for each problem named)."""
    d = Path(directory)
    return DatasetPaths(list_shards(d, "train"), list_shards(d, "val"), Path(tokenizer), vocab_size, list_sidecars(d))


# ---- streams ----------------------------------------------------------------------------------------------------------
# Batches from token shards: a deterministic infinite training stream, the val tokens and their byte sidecar.


class TokenStream:
    """Infinite, deterministic (x, y) batches from the concatenation of ``paths``.

    Each step consumes ``world_size * batch_size * seq_len`` tokens of the stream; rank r reads
    its own contiguous ``batch_size * seq_len + 1`` tokens at offset ``r * batch_size * seq_len``
    of that step's span, so y is x shifted by one. At the end of the last shard the stream wraps
    around to the first (spans may cross shard boundaries). x and y are int64 CPU tensors of shape
    (batch_size, seq_len), pinned if ``pin_memory`` (and CUDA is available).

    Shards are memory-mapped; headers and sizes are validated on open. With ``vocab_size``, each
    batch's ids are checked (cheap), so a wrong tokenizer fails with the shard's name instead of
    an embedding index error on the GPU.
    """

    def __init__(
        self,
        paths: list[Path],
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        vocab_size: int | None = None,
        pin_memory: bool = False,
    ) -> None:
        if not paths:
            raise ValueError("TokenStream needs at least one shard path")
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.paths = [Path(p) for p in paths]
        self.seq_len, self.batch_size = seq_len, batch_size
        self.rank, self.world_size = rank, world_size
        self.vocab_size = vocab_size
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self._shards = [read_shard(p) for p in self.paths]  # validates header and size
        self._starts = np.cumsum([0] + [s.size for s in self._shards])
        self.total_tokens = int(self._starts[-1])
        self.tokens_per_step = world_size * batch_size * seq_len
        if self.total_tokens < self.tokens_per_step + 1:
            raise DataError(
                f"the shards hold {self.total_tokens} tokens but one step needs {self.tokens_per_step + 1} "
                f"(world_size {world_size} x batch_size {batch_size} x seq_len {seq_len} + 1); "
                "use a smaller batch/sequence or more data"
            )
        self.position = 0  # offset in the concatenated stream of the current step's span

    def _take(self, start: int, n: int) -> np.ndarray:
        """n tokens from stream offset ``start`` (mod total), crossing shard ends and wrapping."""
        parts, start = [], start % self.total_tokens
        while n > 0:
            k = int(np.searchsorted(self._starts, start, side="right")) - 1
            shard = self._shards[k]
            lo = start - int(self._starts[k])
            piece = shard[lo : lo + n]
            if self.vocab_size is not None and piece.size and int(piece.max()) >= self.vocab_size:
                bad = lo + int(np.argmax(piece >= self.vocab_size))
                raise ShardError(
                    f"{self.paths[k]}: token id {int(piece.max())} >= vocab_size {self.vocab_size} "
                    f"(at token {bad}); the shard was made with a different tokenizer or vocab size"
                )
            parts.append(piece)
            n -= piece.size
            start = (start + piece.size) % self.total_tokens
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.batch_size * self.seq_len
        buf = torch.from_numpy(self._take(self.position + self.rank * n, n + 1).astype(np.int64))
        if self.pin_memory:
            buf = buf.pin_memory()  # one copy; x and y are views of it, so pinned too
        self.position = (self.position + self.tokens_per_step) % self.total_tokens
        x = buf[:-1].view(self.batch_size, self.seq_len)
        y = buf[1:].view(self.batch_size, self.seq_len)
        return x, y

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next_batch()

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"]) % self.total_tokens


def load_val_tokens(
    paths: list[Path],
    max_tokens: int | None,
    seq_len: int,
    vocab_size: int | None = None,
    include_tail: bool = False,
) -> torch.Tensor:
    """The first N val tokens as a 1-D int64 tensor, N = min(max_tokens, available), truncated to
    k * seq_len + 1 tokens so that it splits into k (x, y) windows of seq_len; with ``include_tail`` (eval.include_tail)
    not truncated: the last N - 1 - k * seq_len targets are scored too."""
    if not paths:
        raise ValueError("load_val_tokens needs at least one shard path")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    parts, have = [], 0
    for path in paths:
        if max_tokens is not None and have >= max_tokens:
            break
        tokens = read_shard(Path(path), vocab_size)
        if max_tokens is not None:
            tokens = tokens[: max_tokens - have]
        parts.append(np.asarray(tokens))
        have += tokens.size
    n = have
    if n < seq_len + 1:
        raise DataError(
            f"only {n} val tokens available{'' if max_tokens is None else f' (max_tokens={max_tokens})'} "
            f"in {len(paths)} shard(s) starting at {paths[0]}; need at least seq_len + 1 = {seq_len + 1}"
        )
    usable = n if include_tail else (n - 1) // seq_len * seq_len + 1
    out = np.concatenate(parts)[:usable].astype(np.int64)
    return torch.from_numpy(out)


def load_val_bytes(paths: DatasetPaths, n_tokens: int) -> torch.Tensor | None:
    """The byte sidecar of the first ``n_tokens`` val tokens as an int32 tensor (byte accounting below: BPB counts
    these bytes), or None for data without one (speedrun.data.existing checks a sidecar against its shards)."""
    if not paths.val_bytes:
        return None
    parts = [np.asarray(read_shard(p)) for p in paths.val_bytes]
    return torch.from_numpy(np.concatenate(parts)[:n_tokens].astype(np.int32))


# ---- byte accounting --------------------------------------------------------------------------------------------------
# Bits per byte, with parameter-golf's byte accounting, so numbers compare across tokenizers.
#
# For a target token y whose previous token is x:
#
#     bytes(y) = base_bytes[y] + (has_leading_space[y] and not is_boundary[x])
#     bpb      = (sum of nats / ln 2) / sum of bytes          (float64 / int64 sums)
#
# Why this is exact for SentencePiece: a space is written as "▁" glued to the front of the next
# piece, and decode() drops the "▁" at the very start of a text (the dummy prefix it added when
# encoding). Every document in a shard starts after BOS, a boundary, so the rule above drops exactly
# the space that decode drops. tests/data/test_bpb.py checks this byte-for-byte over the val split.
#
# Per id:
# - control, unknown and unused ids (BOS, EOS, PAD, <unk>): boundaries, 0 bytes;
# - byte-fallback ids <0xNN>: 1 byte;
# - other pieces: the UTF-8 length of the piece without its leading "▁", with any further "▁"
#   counted as the one-byte space it decodes to. Only whitespace-only pieces such as "▁▁▁▁"
#   (allow_whitespace_only_pieces) have such interior "▁"; for every other piece, and so for all
#   of parameter-golf's tokenizers, this is the plain UTF-8 length of the piece minus its "▁".
# - the standalone piece "▁" therefore has base 0 and a leading space: 1 byte inside a document,
#   0 right after BOS, where decode() drops it. Both match the decoded text.
#
# Hazard (build_byte_luts warns): with byte fallback but no "▁" piece in the vocabulary, a space
# that cannot merge with the following piece is encoded as the three bytes of U+2581, which decode
# to the literal "▁" (3 bytes) rather than a space. The count then matches the decoded text but
# over-counts the original by 2 bytes per such space, which flatters BPB.
#
# A byte sidecar replaces the rule: CaseOps data (speedrun.data.caseops) is tokenized from a transformed text whose
# case operators stand for no byte of the original, so the pieces' own bytes over-count it. Its val split carries each
# token's bytes of the original text (fineweb_val_bytes_*.bin, BOS 0), and ``ByteLUTs.sidecar`` holds them per stream
# position; ``token_bytes`` then reads a target's bytes at its position instead of from its id.


SPACE_SYMBOL = "\u2581"


@dataclass(frozen=True)
class ByteLUTs:
    """Per-token-id tables for byte accounting (index with token ids)."""

    base_bytes: torch.Tensor  # int16: bytes of the piece, not counting its leading-space marker
    has_leading_space: torch.Tensor  # bool: piece starts with "▁"
    is_boundary: torch.Tensor  # bool: control/unknown/unused ids (BOS, EOS, PAD, <unk>)
    sidecar: torch.Tensor | None = None
    """int32: the original bytes of the token at each position of the val stream (a byte sidecar); None: the
    bytes follow from the ids by the rule above."""

    @property
    def vocab_size(self) -> int:
        return int(self.base_bytes.numel())

    def to(self, device: torch.device | str) -> ByteLUTs:
        sidecar = None if self.sidecar is None else self.sidecar.to(device)
        return ByteLUTs(
            self.base_bytes.to(device), self.has_leading_space.to(device), self.is_boundary.to(device), sidecar
        )


def build_byte_luts(sp, vocab_size: int | None = None) -> ByteLUTs:
    """Tables for a SentencePiece processor. Ids in [sp size, vocab_size) (a padded model vocab)
    are boundaries with 0 bytes."""
    n_sp = int(sp.get_piece_size())
    size = max(n_sp, vocab_size or 0)
    base = np.zeros(size, dtype=np.int16)
    lead = np.zeros(size, dtype=np.bool_)
    boundary = np.ones(size, dtype=np.bool_)
    for i in range(n_sp):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
            continue
        boundary[i] = False
        if sp.is_byte(i):
            base[i] = 1
            continue
        piece = sp.id_to_piece(i)
        if piece.startswith(SPACE_SYMBOL):
            lead[i] = True
            piece = piece[1:]
        base[i] = len(piece.replace(SPACE_SYMBOL, " ").encode("utf-8"))
    return ByteLUTs(torch.from_numpy(base), torch.from_numpy(lead), torch.from_numpy(boundary))


def token_bytes(
    prev_ids: torch.Tensor, ids: torch.Tensor, luts: ByteLUTs, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Bytes of each target token ``ids`` given its predecessor ``prev_ids`` (same shape), int64. With a byte
    sidecar (``luts.sidecar``) they are the sidecar's at ``positions``, the targets' positions in the val stream
    (same shape), which a caller must then give."""
    if prev_ids.shape != ids.shape:
        raise ValueError(f"prev_ids shape {tuple(prev_ids.shape)} != ids shape {tuple(ids.shape)}")
    if luts.base_bytes.device != ids.device:
        raise ValueError(f"LUTs are on {luts.base_bytes.device} but ids on {ids.device}; call luts.to(device) once")
    if luts.sidecar is not None:
        if positions is None or positions.shape != ids.shape:
            raise ValueError("the byte sidecar counts bytes by stream position: pass the targets' positions")
        return luts.sidecar[positions.long()].to(torch.int64)
    ids, prev_ids = ids.long(), prev_ids.long()
    space = luts.has_leading_space[ids] & ~luts.is_boundary[prev_ids]
    return luts.base_bytes[ids].to(torch.int64) + space.to(torch.int64)


# ---- tokenizers -------------------------------------------------------------------------------------------------------
# SentencePiece BPE tokenizers: loading (training one is speedrun.data.tokenizer's).


def load_tokenizer(path: Path) -> spm.SentencePieceProcessor:
    """A SentencePiece model file (speedrun.data.tokenizer.open_tokenizer says what is wrong with a bad one)."""
    return spm.SentencePieceProcessor(model_file=str(path))


# ---- byte-level BPE (tiktoken) ----------------------------------------------------------------------------------------
# Byte-level BPE tokenizers through tiktoken (GPT-2's, as in modded-nanogpt's FineWeb shards).
#
# Which kind a dataset uses is deduced from data.tokenizer, so no extra config field can disagree with it:
# ``gpt2`` (tiktoken's named encoding) or a path ending in ``.tiktoken`` (a local GPT-2 vocabulary, e.g.
# r50k_base.tiktoken, which holds the same 50,256 ranks as gpt2) is tiktoken; anything else is a SentencePiece
# .model file.
#
# Byte accounting is simpler than SentencePiece's (bpb.py): a byte-level BPE token decodes to exactly its byte
# string, with no leading-space rule, so each ordinary token counts len(decode_single_token_bytes(id)) bytes and
# a special token (<|endoftext|>, the document separator at the start of every document) counts 0 and is a
# boundary. The sum over a document's tokens is then the UTF-8 length of the document (tests/data/test_tiktoken_bpb.py).
#
# tiktoken is optional (the ``gpt2`` extra); it is imported only when a tiktoken tokenizer is asked for, and its
# absence is reported before any work is done.


GPT2 = "gpt2"
"""data.tokenizer value naming tiktoken's GPT-2 encoding."""
GPT2_EOT_ID = 50256
"""<|endoftext|>: modded-nanogpt puts it at the start of every document; speedrun's BOS / document boundary."""
GPT2_VOCAB = 50257
TIKTOKEN_SUFFIX = ".tiktoken"
INSTALL_HINT = "pip install 'speedrun[gpt2]'"
ENDOFTEXT = "<|endoftext|>"


class DataNotFound(DataError, FileNotFoundError):
    """A .tiktoken file is missing."""


def is_tiktoken(spec: str | Path | None) -> bool:
    """Whether data.tokenizer ``spec`` names a tiktoken tokenizer (``gpt2`` or a ``*.tiktoken`` file)."""
    return spec is not None and (str(spec) == GPT2 or str(spec).endswith(TIKTOKEN_SUFFIX))


def require_tiktoken() -> Any:
    """The tiktoken module, or a DataError naming the extra that installs it."""
    try:
        import tiktoken
    except ImportError:
        raise DataError(f"a GPT-2 (tiktoken) tokenizer needs the tiktoken package: {INSTALL_HINT}") from None
    return tiktoken


def _offline_help() -> str:
    return (
        "tiktoken downloads the GPT-2 vocabulary on first use and caches it in TIKTOKEN_CACHE_DIR. Offline, "
        "either set TIKTOKEN_CACHE_DIR to a directory where tiktoken already cached it (run "
        "`python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\"` once on a machine with network and copy "
        "that directory), or download https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken "
        "(the same 50,257-token vocabulary) and set data.tokenizer=<path>/r50k_base.tiktoken"
    )


def load_encoding(spec: str | Path) -> Any:
    """tiktoken.Encoding for ``gpt2`` or a local ``*.tiktoken`` file (GPT-2's split pattern and <|endoftext|>
    after the last rank). DataError with the fix when tiktoken or the vocabulary is missing."""
    tiktoken = require_tiktoken()
    if str(spec) == GPT2:
        try:
            return tiktoken.get_encoding(GPT2)
        except Exception as e:  # network errors surface as requests/urllib/OSError subclasses
            raise DataError(
                f"cannot load tiktoken's gpt2 vocabulary ({type(e).__name__}: {e}).\n{_offline_help()}"
            ) from None
    path = Path(spec).expanduser()
    if not path.is_file():
        raise DataNotFound(f"tiktoken vocabulary not found: {path}.\n{_offline_help()}")
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    try:
        ranks = load_tiktoken_bpe(str(path))
    except Exception as e:
        raise DataError(f"{path}: not a .tiktoken vocabulary (lines '<base64 token> <rank>'): {e}") from None
    return tiktoken.Encoding(
        name=path.stem, pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: len(ranks)}
    )


def boundary_id(enc: Any) -> int:
    """The document separator: <|endoftext|> (50256 for GPT-2)."""
    return int(enc.encode_single_token(ENDOFTEXT))


def build_tiktoken_luts(enc: Any, vocab_size: int | None = None) -> ByteLUTs:
    """Byte tables for a byte-level BPE: ordinary tokens count their byte string's length, special tokens and
    ids without a token (gaps, or a padded vocabulary up to ``vocab_size``) count 0 and are boundaries."""
    size = max(int(enc.n_vocab), vocab_size or 0)
    base = np.zeros(size, dtype=np.int16)
    boundary = np.ones(size, dtype=np.bool_)
    special = {int(enc.encode_single_token(s)) for s in enc.special_tokens_set}
    for i in range(int(enc.n_vocab)):
        if i in special:
            continue
        try:
            piece = enc.decode_single_token_bytes(i)
        except KeyError:  # an unused rank
            continue
        base[i] = len(piece)
        boundary[i] = False
    lead = np.zeros(size, dtype=np.bool_)  # no leading-space rule: a space is an ordinary byte of its token
    return ByteLUTs(torch.from_numpy(base), torch.from_numpy(lead), torch.from_numpy(boundary))


def sentencepiece_luts(paths: DatasetPaths, spec: str | None) -> tuple[ByteLUTs, int]:
    """(byte tables, BOS id) of a dataset's SentencePiece tokenizer."""
    sp = load_tokenizer(paths.tokenizer)
    return build_byte_luts(sp), sp.bos_id()


def tiktoken_luts(paths: DatasetPaths, spec: str | None) -> tuple[ByteLUTs, int]:
    """(byte tables, <|endoftext|>'s id) of a byte-level BPE named by data.tokenizer ``spec``."""
    enc = load_encoding(str(spec))
    return build_tiktoken_luts(enc), boundary_id(enc)


TOKENIZERS: dict[str, Callable[[DatasetPaths, str | None], tuple[ByteLUTs, int]]] = choice(
    "data.tokenizer_kind", {"sentencepiece": sentencepiece_luts, "tiktoken": tiktoken_luts}
)
"""data.tokenizer_kind -> (paths, data.tokenizer) -> (byte tables, the id that starts each document)."""
