"""speedrun.data.caseops: the CaseOps transform parameter-golf's CaseOps records use, its inverse, and the original
bytes of each token of a transformed text (the val byte sidecar).

The expected encodings below were worked out by hand from parameter-golf's canonical transform,
``encode_lossless_caps_v2`` with its default operators (``lossless_caps_caseops_v1``), in lossless_caps.py beside
prepare_caseops_data.py in the CaseOps records of github.com/openai/parameter-golf (e.g.
records/track_10min_16mb/2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611), following its rules:
over each maximal run of ASCII letters, lowercase stays, a word of >= 2 letters all uppercase is ALLCAPS + lowercase,
a word whose first letter is uppercase and whose rest is lowercase is TITLE + lowercase, any other word is its
lowercase letters with TITLE before an uppercase first letter and CAPNEXT before each later uppercase one; an
operator character already in the text is ESC + itself. The decodings follow its ``decode_lossless_caps_v2`` (which
reads some sequences encode never writes, and refuses an operator with nothing to apply to). The byte counts follow
its ``surface_piece_original_byte_counts``: operators 0, a letter 1, an escaped operator its 3 bytes, anything else
its UTF-8 length.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from speedrun.data import caseops
from speedrun.data.caseops import ALLCAPS, CAPNEXT, ESC, TITLE, CaseOpsError, decode, encode

T, A, C, E = "\ue001", "\ue002", "\ue003", "\ue004"

CANONICAL = [
    ("", ""),
    ("plain lowercase words", "plain lowercase words"),
    ("Hello WORLD. NASA launched A/B tests.", f"{T}hello {A}world. {A}nasa launched {T}a/{T}b tests."),
    ("iPhone McDonald ABc aBC", f"i{C}phone {T}mc{C}donald {T}a{C}bc a{C}b{C}c"),
    ("A I a", f"{T}a {T}i a"),  # a one-letter capital is TITLE, never ALLCAPS (that needs two letters)
    ("HTTPServer x86_64 CONST_NAME", f"{T}h{C}t{C}t{C}p{C}server x86_64 {A}const_{A}name"),
    # non-ASCII letters are not letters of a word: they stay, and split the ASCII runs around them
    ("é Éa ÀB naïVE", f"é Éa À{T}b naï{A}ve"),
    # operator characters already in the text are escaped, and end the word before them
    (f"{T}x{E}{A}Y", f"{E}{T}x{E}{E}{E}{A}{T}y"),
    (f"ab{C}Cd", f"ab{E}{C}{T}cd"),
    ("\ue000 and \ue005 are not operators", "\ue000 and \ue005 are not operators"),
]


def test_the_operators_are_the_records_private_use_characters():
    assert (TITLE, ALLCAPS, CAPNEXT, ESC) == (T, A, C, E)
    assert caseops.NAME == "lossless_caps_caseops_v1"


@pytest.mark.parametrize(("text", "encoded"), CANONICAL)
def test_encode_matches_the_canonical_transform(text, encoded):
    assert encode(text) == encoded
    assert decode(encoded) == text


def _random_text(rng: random.Random) -> str:
    # weighted toward what the transform treats specially: letters of both cases in runs, the operators, the
    # private-use neighbours, non-ASCII letters, multi-byte characters and separators
    alphabet = ["a", "b", "z", "A", "B", "Z", "ab", "AB", "Ab", "aB", T, A, C, E, "\ue000", "\ue005", "é", "É", "😀"]
    alphabet += [" ", "\n", "_", "1", ".", "\u2581"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))


def test_random_text_round_trips_and_encodes_to_a_fixed_point():
    rng = random.Random(57)
    for _ in range(20_000):
        text = _random_text(rng)
        encoded = encode(text)
        assert decode(encoded) == text, text
        assert not any("A" <= ch <= "Z" for ch in encoded), encoded  # no ASCII capital survives
        # the encoded text's own encoding only escapes its operators
        assert decode(decode(encode(encoded))) == text


def test_arbitrary_code_points_round_trip():
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randint(0, 16)))
        assert decode(encode(text)) == text


@pytest.mark.parametrize(
    ("text", "original"),
    [
        # what encode never writes but parameter-golf's decoder reads (a model's samples may hold it)
        ("A", "A"),  # a letter already uppercase stays
        (f"{A}a", "A"),  # ALLCAPS on a one-letter word (encode writes TITLE)
        (f"{T}a{C}b", "AB"),  # TITLE then CAPNEXT (encode writes ALLCAPS "ab")
        (f"{C}ab", "Ab"),  # CAPNEXT on a word's first letter (encode writes TITLE)
        (f"{A}ab{C}c d", "ABC d"),  # CAPNEXT inside an all-caps word changes nothing
        (f"{E}x", "x"),  # ESC keeps any character (encode escapes only operators)
    ],
)
def test_decode_reads_what_the_canonical_decoder_reads(text, original):
    assert decode(text) == original


@pytest.mark.parametrize(
    "bad",
    [
        T,  # an operator at the end, with nothing to apply to
        E,
        f"a{C}",
        f"{T} a",  # an operator before a character that is not a letter
        f"{C}1",
        f"ab{T}cd",  # a word operator inside a word
        f"{T}{A}a",  # a word operator after another operator
        f"{C}{T}a",
        f"{C}{C}a",  # CAPNEXT twice
        f"{T}{E}{T}",  # a word operator meeting an escaped operator, not a letter
        f"{T}{E}a",  # an escaped letter is kept as it is: the word operator before it is left with nothing
    ],
)
def test_decode_refuses_what_the_canonical_decoder_refuses(bad):
    with pytest.raises(CaseOpsError, match="not a CaseOps text"):
        decode(bad)


def test_token_original_bytes_counts_each_span_as_the_canonical_counter():
    text = f"{T}Hello {E}{A}x é"
    encoded = encode(text)
    assert encoded == f"{E}{T}{T}hello {E}{E}{E}{A}x é"
    raw = encoded.encode("utf-8")
    spans, at = [], 0
    for piece in [f"{E}{T}", T, "hel", "lo", " ", E, E, E + A, "x", " é"]:  # a split SentencePiece could make
        n = len(piece.encode("utf-8"))
        spans.append((at, at + n))
        at += n
    assert at == len(raw)
    # ESC + TITLE: the escaped TITLE is the original's own 3 bytes; the bare TITLE of "Hello" 0; an ESC alone 0 and
    # the ESC it escapes, in the next piece, 3; ESC + ALLCAPS 3; " é" 1 + 2
    counts = caseops.token_original_bytes(encoded, spans)
    assert counts.tolist() == [3, 0, 3, 2, 1, 0, 3, 3, 1, 3]
    assert counts.dtype == np.uint16
    assert int(counts.sum()) == len(text.encode("utf-8"))
    with pytest.raises(CaseOpsError, match="past the"):
        caseops.token_original_bytes(encoded, [(0, len(raw) + 1)])


@pytest.fixture(scope="module")
def caseops_tokenizer(tmp_path_factory):
    from speedrun.core.data import load_tokenizer
    from speedrun.data.corpus import load_embedded_documents
    from speedrun.data.tokenizer import train_tokenizer

    docs = [encode(d) for d in load_embedded_documents()[:60]]
    settings = {"user_defined_symbols": list(caseops.OPERATORS)}
    path = train_tokenizer(docs, tmp_path_factory.mktemp("tok") / "tokenizer", 512, extra_settings=settings)
    return load_tokenizer(path)


def test_val_byte_sidecar_sums_to_each_documents_utf8_bytes(caseops_tokenizer):
    sp = caseops_tokenizer
    assert all(sp.piece_to_id(op) != sp.unk_id() for op in caseops.OPERATORS)  # reserved pieces of their own
    rng = random.Random(1)
    docs = ["Hello WORLD, iPhone", f"{A}literal operators{E}", " leading space and é😀 bytes", "x"]
    docs += [_random_text(rng) for _ in range(200)]
    docs = [d for d in docs if d]
    ids, counts = caseops.val_byte_sidecar(sp, [encode(d) for d in docs], batch_docs=7)
    assert ids.shape == counts.shape
    starts = np.flatnonzero(ids == sp.bos_id()).tolist()
    assert len(starts) == len(docs) and counts[starts].tolist() == [0] * len(docs)  # BOS counts no byte
    ends = [*starts[1:], ids.size]
    for doc, a, b in zip(docs, starts, ends, strict=True):
        assert ids[a + 1 : b].tolist() == sp.encode(encode(doc), out_type=int)
        assert int(counts[a:b].sum()) == len(doc.encode("utf-8")), doc
    first = counts[starts[0] : ends[0]].tolist()  # BOS, "▁", TITLE, h, e, ...: operators and the dummy space 0
    pieces = [sp.id_to_piece(int(i)) for i in ids[starts[0] : ends[0]]]
    assert [c for c, p in zip(first, pieces, strict=True) if p in caseops.OPERATORS] == [0, 0, 0]
