"""SentencePiece BPE tokenizers: training (deterministic, fast; loading one is speedrun.core.data.load_tokenizer).

Settings and why:
- byte_fallback: characters outside the vocabulary become <0xNN> byte pieces instead of <unk>.
- identity normalization, no whitespace removal: text is not rewritten (no NFKC, no collapsing of
  spaces or newlines), so indentation in code survives and decode(encode(text)) == text for any
  text without a literal U+2581 (SentencePiece's whitespace symbol, which decodes as a space).
- add_dummy_prefix: a document "foo" is encoded like " foo" and decode drops that first space;
  the BPB accounting models exactly this (a leading-space piece right after BOS counts no space).
  It also guarantees the standalone "▁" piece is in the vocabulary (see bpb.py for why it matters).
- allow_whitespace_only_pieces: runs of spaces (indentation) can be single pieces.
- ids: pad=0, bos=1, eos=2, unk=3, as in parameter-golf's tokenizers. BOS (a control piece that
  decodes to nothing) starts every document in the shards and is the document delimiter.
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import sentencepiece as spm

from speedrun.core.data import is_tiktoken, load_encoding, load_tokenizer
from speedrun.errors import DataError
from speedrun.records.atomic import atomic_write

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

TRAINER_SETTINGS: dict[str, object] = {
    "model_type": "bpe",
    "byte_fallback": True,
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "add_dummy_prefix": True,
    "allow_whitespace_only_pieces": True,
    "split_digits": True,
    "character_coverage": 0.9995,
    "pad_id": PAD_ID,
    "bos_id": BOS_ID,
    "eos_id": EOS_ID,
    "unk_id": UNK_ID,
    "input_sentence_size": 0,  # we subsample ourselves, deterministically
    "max_sentence_length": 1 << 16,  # bytes; our chunks are at most CHUNK_CHARS characters
    # Fixed, because the model file records it: the same text gives the same file on any machine.
    # (The learned pieces do not depend on it.)
    "num_threads": 4,
}
CHUNK_CHARS = 4000


def _chunks(texts: Iterable[str], chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """Split documents into training "sentences" of at most chunk_chars characters at line ends.

    SentencePiece skips sentences longer than max_sentence_length, so long documents must be cut;
    newlines stay inside chunks so that pieces containing "\\n" can be learned.
    """
    for text in texts:
        buf: list[str] = []
        size = 0
        for line in text.splitlines(keepends=True):
            while len(line) > chunk_chars:  # a very long line: cut it hard
                if buf:
                    yield "".join(buf)
                    buf, size = [], 0
                yield line[:chunk_chars]
                line = line[chunk_chars:]
            if size + len(line) > chunk_chars and buf:
                yield "".join(buf)
                buf, size = [], 0
            buf.append(line)
            size += len(line)
        if buf:
            yield "".join(buf)


def sample_training_text(texts: Iterable[str], max_chars: int, seed: int = 0) -> list[str]:
    """Chunks of ``texts`` totalling at most about ``max_chars`` characters, chosen by ``seed``.

    Same texts + same seed -> same sample, in the original order.
    """
    chunks = [c for c in _chunks(texts) if c.strip()]
    total = sum(len(c) for c in chunks)
    if total <= max_chars:
        return chunks
    order = list(range(len(chunks)))
    random.Random(seed).shuffle(order)
    chosen, size = [], 0
    for i in order:
        if size >= max_chars:
            break
        chosen.append(i)
        size += len(chunks[i])
    return [chunks[i] for i in sorted(chosen)]


def train_tokenizer(
    texts: Iterable[str],
    model_prefix: Path,
    vocab_size: int,
    seed: int = 0,
    *,
    max_chars: int = 4_000_000,
    num_threads: int | None = None,
    extra_settings: dict[str, object] | None = None,
) -> Path:
    """Train a SentencePiece BPE model on ``texts``; write ``<model_prefix>.model`` and ``.vocab``.

    Deterministic (byte-identical files): the training text is a seeded sample of at most
    ``max_chars`` characters (4M characters train a 1024-piece model in about 0.5 s on 2 cores).
    ``extra_settings`` override TRAINER_SETTINGS (for experiments and tests); ``num_threads``
    overrides its thread count (recorded in the file). Returns the .model path.
    """
    model_prefix = Path(model_prefix)
    if not 0 < vocab_size <= 65536:
        raise ValueError(f"vocab_size must be in 1..65536 (uint16 shards), got {vocab_size}")
    sample = sample_training_text(texts, max_chars, seed)
    if not sample:
        raise ValueError("cannot train a tokenizer on no text (all documents empty?)")
    settings: dict[str, Any] = {**TRAINER_SETTINGS, **(extra_settings or {})}
    if num_threads is not None:
        settings["num_threads"] = num_threads
    model_path = model_prefix.with_name(model_prefix.name + ".model")
    model = io.BytesIO()  # model_writer: the file records no output path, so it is byte-reproducible
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab_size, minloglevel=2, **settings
        )
    except RuntimeError as e:
        reason = str(e).split("]")[-1].strip()
        if "Vocabulary size too high" in reason:
            raise ValueError(
                f"vocab_size={vocab_size} is too large for this training text "
                f"({sum(len(c) for c in sample):,} characters): {reason}"
            ) from None
        if "Vocabulary size is smaller than required_chars" in reason:
            raise ValueError(
                f"vocab_size={vocab_size} is too small: the 256 byte pieces, 4 special pieces and the "
                f"text's frequent characters need more ({reason})"
            ) from None
        raise
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(model_prefix.with_name(model_prefix.name + ".vocab"), vocab.encode("utf-8"))
    atomic_write(model_path, model.getvalue())
    return model_path


def open_tokenizer(path: Path) -> spm.SentencePieceProcessor:
    """speedrun.core.data.load_tokenizer, with the fix named: FileNotFoundError for a missing file, DataError for one
    that is not a SentencePiece model."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"SentencePiece tokenizer not found: {path} (expected a .model file; "
            "build one with scripts/prepare_data.py or point data.tokenizer at an existing model)"
        )
    try:
        return load_tokenizer(path)
    except (OSError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(
            f"{path}: not a valid SentencePiece model ({first}); restore the .model file the dataset was built with"
        ) from None


def check_recorded_sha256(tokenizer: Path, directory: Path) -> None:
    """Refuse (DataError) a tokenizer whose bytes are not those ``directory``'s dataset.json recorded when its
    shards were made (``tokenizer_sha256``): ids of a swapped tokenizer decode to other bytes, and every val_bpb
    would be wrong. A directory with no such record (parameter-golf's shards) has nothing to check."""
    import json

    try:
        recorded = json.loads((Path(directory) / "dataset.json").read_text()).get("tokenizer_sha256")
    except (OSError, ValueError, AttributeError):
        return
    if not isinstance(recorded, str):
        return
    found = tokenizer_sha256(tokenizer)
    if found != recorded:
        raise DataError(
            f"{tokenizer} is not the tokenizer {directory} was built with (sha256 {found[:16]}..., its dataset.json "
            f"records {recorded[:16]}...); restore that file, or delete {directory} to build the dataset again"
        )


def tokenizer_sha256(spec: str | Path) -> str:
    """The tokenizer's identity, 64 hex digits: sha256 of a SentencePiece .model file's bytes; for a tiktoken
    tokenizer (``gpt2`` or a .tiktoken file), of what each id decodes to (ranks in .tiktoken lines, then the
    special tokens), so ``gpt2`` and a .tiktoken file of the same ranks are one tokenizer. Two tokenizers of one
    vocab size give the same ids different bytes, so a val_bpb means something only beside this."""
    if is_tiktoken(spec):
        return hashlib.sha256(_tiktoken_text(load_encoding(spec))).hexdigest()
    return hashlib.sha256(Path(spec).read_bytes()).hexdigest()


def _tiktoken_text(enc: Any) -> bytes:
    special = {int(enc.encode_single_token(name)): name for name in enc.special_tokens_set}
    lines = []
    for i in range(int(enc.n_vocab)):
        if i in special:
            continue
        try:
            piece = enc.decode_single_token_bytes(i)
        except KeyError:  # an unused rank
            continue
        lines.append(f"{base64.b64encode(piece).decode()} {i}\n")
    lines += [f"{name} {i}\n" for i, name in sorted(special.items())]
    return "".join(lines).encode()
