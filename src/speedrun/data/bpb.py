"""Bits per byte, with parameter-golf's byte accounting, so numbers compare across tokenizers.

For a target token y whose previous token is x:

    bytes(y) = base_bytes[y] + (has_leading_space[y] and not is_boundary[x])
    bpb      = (sum of nats / ln 2) / sum of bytes          (float64 / int64 sums)

Why this is exact for SentencePiece: a space is written as "▁" glued to the front of the next
piece, and decode() drops the "▁" at the very start of a text (the dummy prefix it added when
encoding). Every document in a shard starts after BOS, a boundary, so the rule above drops exactly
the space that decode drops. tests/data/test_bpb.py checks this byte-for-byte over the val split.

Per id:
- control, unknown and unused ids (BOS, EOS, PAD, <unk>): boundaries, 0 bytes;
- byte-fallback ids <0xNN>: 1 byte;
- other pieces: the UTF-8 length of the piece without its leading "▁", with any further "▁"
  counted as the one-byte space it decodes to. Only whitespace-only pieces such as "▁▁▁▁"
  (allow_whitespace_only_pieces) have such interior "▁"; for every other piece, and so for all
  of parameter-golf's tokenizers, this is the plain UTF-8 length of the piece minus its "▁".
- the standalone piece "▁" therefore has base 0 and a leading space: 1 byte inside a document,
  0 right after BOS, where decode() drops it. Both match the decoded text.

Hazard (build_byte_luts warns): with byte fallback but no "▁" piece in the vocabulary, a space
that cannot merge with the following piece is encoded as the three bytes of U+2581, which decode
to the literal "▁" (3 bytes) rather than a space. The count then matches the decoded text but
over-counts the original by 2 bytes per such space, which flatters BPB.

A byte sidecar replaces the rule: CaseOps data (speedrun.data.caseops) is tokenized from a transformed text whose
case operators stand for no byte of the original, so the pieces' own bytes over-count it. Its val split carries each
token's bytes of the original text (fineweb_val_bytes_*.bin, BOS 0), and ``ByteLUTs.sidecar`` holds them per stream
position; ``token_bytes`` then reads a target's bytes at its position instead of from its id.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from speedrun.core.data import SPACE_SYMBOL, ByteLUTs, token_bytes


def stream_bytes(tokens: torch.Tensor, luts: ByteLUTs) -> int:
    """Total bytes of the targets tokens[1:] of a 1-D token stream (documents start with BOS); with a byte
    sidecar, the stream is the val stream from its start."""
    tokens = torch.as_tensor(tokens).reshape(-1)
    if tokens.numel() < 2:
        return 0
    positions = torch.arange(1, tokens.numel(), device=tokens.device) if luts.sidecar is not None else None
    return int(token_bytes(tokens[:-1], tokens[1:], luts, positions).sum().item())


def warn_if_inexact(sp) -> None:
    """Warn where this SentencePiece tokenizer's byte counts can differ from the original text's (the hazard in the
    module doc); a dataset opened or built with it says so once."""
    space_id = sp.piece_to_id(SPACE_SYMBOL)
    plain_space = not (sp.is_unknown(space_id) or sp.is_control(space_id) or sp.is_unused(space_id))
    has_bytes = any(sp.is_byte(i) for i in range(int(sp.get_piece_size())))
    if has_bytes and not plain_space:
        warnings.warn(
            "tokenizer has byte fallback but no standalone '\u2581' piece: spaces that do not merge with the "
            "next piece are encoded as the 3 bytes of U+2581 and decode to '\u2581', so byte counts (and BPB) "
            "match the decoded text but over-count the original by 2 bytes per such space",
            stacklevel=2,
        )
    if plain_space and sp.decode([space_id]) != "":
        warnings.warn(
            "tokenizer keeps the leading space of a text when decoding (no dummy prefix, no whitespace "
            "removal): a document that starts with a space is under-counted by 1 byte",
            stacklevel=2,
        )


def bits_per_byte(sum_nats: float, sum_bytes: int) -> float:
    """(sum_nats / ln 2) / sum_bytes; both sums over the same target tokens."""
    sum_bytes = int(sum_bytes)
    if sum_bytes <= 0:
        raise ValueError(f"sum_bytes must be positive, got {sum_bytes}")
    return float(sum_nats) / math.log(2) / sum_bytes


def unigram_bits_per_byte(
    train_counts, val_tokens, luts: ByteLUTs, smoothing: float = 1.0, val_bytes: int | None = None
) -> float:
    """BPB of a unigram model (train token counts, add-``smoothing``) scored on a val stream.

    ``train_counts[i]`` is how often id i occurs in train (e.g. np.bincount of the train tokens).
    Scores every target val_tokens[1:] (BOS targets included, as a model is scored): the bar a
    trained model must clear to have learned anything beyond token frequencies. ``val_bytes``: the targets'
    bytes where the ids do not give them (a byte sidecar's sum); None: counted with ``luts``.
    """
    counts = np.zeros(luts.vocab_size, dtype=np.float64)
    train_counts = np.asarray(train_counts, dtype=np.float64).reshape(-1)
    counts[: train_counts.size] = train_counts[: luts.vocab_size]
    counts += smoothing
    log_p = np.log(counts) - np.log(counts.sum())
    val = np.asarray(val_tokens).reshape(-1).astype(np.int64)
    nats = float(-log_p[val[1:]].sum())
    if val_bytes is None:
        val_bytes = stream_bytes(torch.from_numpy(val), luts.to("cpu"))
    return bits_per_byte(nats, val_bytes)
