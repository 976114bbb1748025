"""CaseOps: parameter-golf's lossless case transform (``lossless_caps_caseops_v1``), and the original bytes of each
token of a transformed text.

The transform moves the case of ASCII letters into four private-use operator characters, so that a tokenizer sees
"the", "The" and "THE" as one word. Over each maximal run of ASCII letters (a word):

- an all-lowercase word is unchanged;
- a word of two or more letters, all uppercase, becomes ALLCAPS + the word in lowercase;
- any other word is written in lowercase, with TITLE before it when its first letter is uppercase and CAPNEXT
  before every later uppercase letter ("Hello" -> TITLE "hello", "iPhone" -> "i" CAPNEXT "phone", "A" -> TITLE "a");
- an operator character already in the text is escaped as ESC + the character;
- every other character is unchanged.

The operators are U+E001 (TITLE), U+E002 (ALLCAPS), U+E003 (CAPNEXT) and U+E004 (ESC): those of the records' CaseOps
data and their tokenizer (which reserves the four as pieces of their own). ``decode(encode(t)) == t`` for every
string ``t``; decode reads any string parameter-golf's decoder reads, to the same text, and refuses (CaseOpsError)
those it refuses.

BPB on such data must count the bytes of the original text: an operator stands for no byte (the case it carries is
part of its letter's byte), a letter is its one byte whatever its case, an escaped operator is its own 3 bytes.
``token_original_bytes`` gives each token of a transformed text those bytes; summed over a document they are the
UTF-8 length of the original document. scripts/prepare_data.py --caseops writes them beside the val shards
(speedrun.data.shards.sidecar_name), as the records' prep does.
"""

from __future__ import annotations

import re

import numpy as np

from speedrun.errors import DataError

NAME = "lossless_caps_caseops_v1"
"""The transform's name in parameter-golf (dataset.json's text_transform)."""
TITLE, ALLCAPS, CAPNEXT, ESC = "\ue001", "\ue002", "\ue003", "\ue004"
OPERATORS = (TITLE, ALLCAPS, CAPNEXT, ESC)
"""The reserved characters, in the order the records' tokenizer lists them as user-defined pieces."""

_WORD_OR_OPERATOR = re.compile("[A-Za-z]+|[\ue001-\ue004]")
# In a transformed text: an escaped operator (kept, 3 bytes) or a bare operator (0 bytes), as UTF-8 bytes. UTF-8 is
# self-synchronizing, so a match can only start at a character's first byte.
_ESCAPED = re.compile(b"\xee\x80\x84\xee\x80[\x81-\x84]")
_BARE = re.compile(b"\xee\x80[\x81-\x84]")


class CaseOpsError(DataError, ValueError):
    """A string is not a CaseOps encoding (decode), or its tokens do not cover it (token_original_bytes)."""


def _encode_match(m: re.Match[str]) -> str:
    word = m.group()
    if word in OPERATORS:
        return ESC + word
    if word.islower():
        return word
    if len(word) >= 2 and word.isupper():
        return ALLCAPS + word.lower()
    head = (TITLE if word[0].isupper() else "") + word[0].lower()
    return head + "".join(CAPNEXT + c.lower() if c.isupper() else c for c in word[1:])


def encode(text: str) -> str:
    """``text`` with its ASCII case moved into the CaseOps operators (see the module doc)."""
    return _WORD_OR_OPERATOR.sub(_encode_match, text)


def decode(text: str) -> str:
    """The original of a CaseOps text, as parameter-golf's decoder reads it (``decode(encode(t)) == t``).

    A case operator applies to the ASCII letters after it: TITLE and ALLCAPS open a word (the first letter, or every
    letter of the word, uppercase), CAPNEXT uppercases the next letter; ESC keeps the next character as it is. Like
    that decoder it also reads operator sequences encode never writes (CAPNEXT on a word's first letter, TITLE then
    CAPNEXTs for an all-caps word, a letter already uppercase), as a model's samples may hold them, and refuses
    (CaseOpsError, naming the position) an operator with nothing to apply to: TITLE or ALLCAPS inside a word or after
    another operator, CAPNEXT twice, an operator before a character that is not an ASCII letter, or at the end.
    """
    out: list[str] = []
    word_mode: str | None = None  # TITLE or ALLCAPS, waiting for its word's first letter
    capnext = escaped = in_word = all_caps = False
    for i, ch in enumerate(text):
        letter = _is_letter(ch)
        if escaped:
            if word_mode is not None and not letter:
                raise CaseOpsError(f"not a CaseOps text: the word operator before {i} meets an escaped {ch!r}")
            out.append(ch)
            escaped, in_word = False, letter
            all_caps = all_caps and letter
        elif ch == ESC:
            escaped = True
        elif ch in (TITLE, ALLCAPS):
            if word_mode is not None or in_word or capnext:
                raise CaseOpsError(f"not a CaseOps text: a word operator at {i} inside a word or after an operator")
            word_mode = ch
        elif ch == CAPNEXT:
            if capnext:
                raise CaseOpsError(f"not a CaseOps text: CAPNEXT twice at {i}")
            capnext = True
        elif letter:
            if not in_word:  # a word's first letter takes the word operator before it
                all_caps = word_mode == ALLCAPS
                upper = word_mode is not None or capnext
                word_mode, in_word = None, True
            else:
                upper = all_caps or capnext
            out.append(ch.upper() if upper else ch)
            capnext = False
        else:
            if word_mode is not None or capnext:
                raise CaseOpsError(f"not a CaseOps text: a case operator before {ch!r} at {i}, not a letter")
            out.append(ch)
            in_word = all_caps = False
    if escaped or word_mode is not None or capnext:
        raise CaseOpsError("not a CaseOps text: it ends with an operator that has nothing to apply to")
    return "".join(out)


def _is_letter(ch: str) -> bool:
    return len(ch) == 1 and ("a" <= ch <= "z" or "A" <= ch <= "Z")


def original_byte_weights(transformed: str) -> np.ndarray:
    """Per UTF-8 byte of ``transformed`` (a CaseOps encoding): 1 where the byte is one of the original text's,
    0 where it belongs to an operator that stands for none. Sums to the original's UTF-8 length."""
    raw = transformed.encode("utf-8")
    weights = np.ones(len(raw), dtype=np.int64)
    escaped_at = [m.start() for m in _ESCAPED.finditer(raw)]
    for m in _BARE.finditer(raw):
        weights[m.start() : m.end()] = 0
    for start in escaped_at:  # the kept operator after ESC is the original's own 3 bytes
        weights[start + 3 : start + 6] = 1
    return weights


def token_original_bytes(transformed: str, spans: list[tuple[int, int]]) -> np.ndarray:
    """The original bytes of each token of ``transformed``, given the tokens' [begin, end) byte spans in it (as
    SentencePiece reports them: ``encode_as_immutable_proto(text).pieces``' begin and end). A token that holds
    only operators counts 0; the counts of a document's tokens sum to its original UTF-8 length. uint16, the
    sidecar's type (a token would need 65,536 bytes to overflow it)."""
    cumulative = np.concatenate([[0], np.cumsum(original_byte_weights(transformed))])
    if not spans:
        return np.zeros(0, dtype=np.uint16)
    bounds = np.asarray(spans, dtype=np.int64)
    if bounds.min() < 0 or bounds.max() > cumulative.size - 1:
        raise CaseOpsError(f"token spans reach past the {cumulative.size - 1} bytes of the text they tokenize")
    counts = cumulative[bounds[:, 1]] - cumulative[bounds[:, 0]]
    if counts.max(initial=0) > np.iinfo(np.uint16).max:
        raise CaseOpsError(f"a token stands for {int(counts.max())} original bytes, more than uint16 holds")
    return counts.astype(np.uint16)


def val_byte_sidecar(sp, transformed_docs: list[str], batch_docs: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """For CaseOps-encoded documents, the val stream as the shards hold it ([BOS] + ids per document) and, per
    token, its bytes of the original text (BOS 0): the byte sidecar's payload, and its ids to check it against the
    stream written. ``sp``: the SentencePiece tokenizer of the shards."""
    ids: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    bos = np.asarray([sp.bos_id()], dtype=np.int64)
    for i in range(0, len(transformed_docs), batch_docs):
        batch = transformed_docs[i : i + batch_docs]
        for doc, proto in zip(batch, _pieces(sp, batch), strict=True):
            pieces = proto.pieces
            ids += [bos, np.asarray([p.id for p in pieces], dtype=np.int64)]
            counts += [np.zeros(1, dtype=np.uint16), token_original_bytes(doc, [(p.begin, p.end) for p in pieces])]
    if not ids:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint16)
    return np.concatenate(ids), np.concatenate(counts)


def _pieces(sp, texts: list[str]) -> list:
    """SentencePiece's pieces of each text with their byte spans (its proto output, named differently across
    versions)."""
    try:
        return sp.encode(texts, return_type="proto")
    except TypeError:  # sentencepiece < 0.2.1
        return sp.encode(texts, out_type="immutable_proto")
