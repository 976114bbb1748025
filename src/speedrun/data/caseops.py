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
string ``t``; decode refuses (CaseOpsError) a string encode cannot produce.

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
    """The original of a CaseOps-encoded ``text``; CaseOpsError (naming the position) for a string encode does
    not write, so that ``encode(decode(s)) == s`` whenever decode returns."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == ESC:
            if i + 1 >= n or text[i + 1] not in OPERATORS:
                raise CaseOpsError(f"not a CaseOps text: ESC at {i} is not followed by an operator character")
            out.append(text[i + 1])
            i += 2
        elif ch in OPERATORS or "a" <= ch <= "z":
            i = _decode_word(text, i, out)
        elif "A" <= ch <= "Z":
            raise CaseOpsError(f"not a CaseOps text: uppercase ASCII letter {ch!r} at {i} (encode lowercases them)")
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _decode_word(text: str, start: int, out: list[str]) -> int:
    """Append the word whose encoding starts at ``start``; return where its encoding ends."""
    i, n = start, len(text)
    upper_all = text[i] == ALLCAPS
    upper_next = text[i] == TITLE or upper_all
    i += text[i] in (TITLE, ALLCAPS)
    letters: list[str] = []
    while i < n:
        if text[i] == CAPNEXT:
            upper_next, i = True, i + 1
        if i < n and "a" <= text[i] <= "z":
            letters.append(text[i].upper() if upper_next or upper_all else text[i])
            upper_next, i = False, i + 1
        elif upper_next:
            raise CaseOpsError(f"not a CaseOps text: the case operator before {i} has no lowercase ASCII letter")
        else:
            break
    word = "".join(letters)
    # the one encoding of this word, not just one that decodes to it (TITLE "a" CAPNEXT "b" is ALLCAPS "ab"),
    # and a word that does not run on from letters before it (those would be one word)
    if encode(word) != text[start:i] or (out and _is_letter(out[-1][-1:])):
        raise CaseOpsError(f"not a CaseOps text: {text[start:i]!r} at {start} is not how encode writes a word")
    out.append(word)
    return i


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
