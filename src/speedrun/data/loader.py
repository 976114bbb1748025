"""Batches from token shards: a deterministic infinite training stream, the val tokens and their byte sidecar."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from speedrun.data.layout import DatasetPaths
from speedrun.data.shards import ShardError, read_header, read_shard
from speedrun.errors import DataError


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


def load_val_bytes(paths: DatasetPaths, n_tokens: int, sp=None) -> torch.Tensor | None:
    """The byte sidecar of the first ``n_tokens`` val tokens as an int32 tensor (speedrun.data.bpb: BPB counts
    these bytes), or None for data without one. Each sidecar must hold exactly as many entries as its val shard.
    With ``sp`` (the SentencePiece tokenizer), data whose tokenizer reserves the CaseOps operators must have a
    sidecar: counted from the pieces, an operator's 3 bytes stand for none of the original text."""
    sidecars = paths.val_bytes
    if not sidecars:
        if sp is not None and _reserves_caseops(sp):
            directory = paths.val[0].parent
            raise DataError(
                f"{paths.tokenizer} reserves the CaseOps case operators but {directory} has no byte sidecar "
                "(fineweb_val_bytes_*.bin): val_bpb would count the operators' bytes; download the export with its "
                "sidecar, or build the data with scripts/prepare_data.py --caseops"
            )
        return None
    if len(sidecars) != len(paths.val):
        raise DataError(
            f"{paths.val[0].parent}: {len(sidecars)} byte sidecar(s) (fineweb_val_bytes_*.bin) for {len(paths.val)} "
            "val shard(s); each val shard needs the sidecar of its index (rebuild or re-download the split whole)"
        )
    parts, have = [], 0
    for shard, sidecar in zip(paths.val, sidecars):
        if have >= n_tokens:
            break
        if read_header(sidecar) != read_header(shard):
            raise DataError(
                f"{sidecar} holds {read_header(sidecar)} byte counts but {shard.name} {read_header(shard)} tokens; "
                "the sidecar belongs to other shards (rebuild or re-download the val split whole)"
            )
        counts = read_shard(sidecar)[: n_tokens - have]
        parts.append(np.asarray(counts))
        have += counts.size
    return torch.from_numpy(np.concatenate(parts).astype(np.int32))


CASEOPS_OPERATORS = "\ue001\ue002\ue003\ue004"
"""speedrun.data.caseops.OPERATORS, spelled here so that a run's train_gpt.py, which carries this module, need not
carry the transform too (tests/data/test_caseops.py holds the two equal)."""


def _reserves_caseops(sp) -> bool:
    unknown = sp.unk_id()
    return all(sp.piece_to_id(op) != unknown for op in CASEOPS_OPERATORS)
