"""Text corpora: the embedded Python-docs corpus and readers for user-supplied documents."""

from __future__ import annotations

import gzip
import json
import lzma
import math
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
#: The Python 3.11 documentation sources, one JSON object per document (see assets/LICENSE-pydoc.txt).
EMBEDDED_CORPUS: Path = ASSETS_DIR / "pydoc311.jsonl.xz"

_JSONL_SUFFIXES: dict[str, Callable[..., IO[str]]] = {".jsonl": open, ".jsonl.xz": lzma.open, ".jsonl.gz": gzip.open}
SUPPORTED_SUFFIXES = (*_JSONL_SUFFIXES, ".txt")


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for suffix in sorted(SUPPORTED_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    raise ValueError(
        f"{path}: unsupported document file type; expected one of {', '.join(SUPPORTED_SUFFIXES)} "
        "(JSON lines with a 'text' field, or plain text where the whole file is one document)"
    )


def iter_documents(path: Path) -> Iterator[str]:
    """Yield the documents of one file.

    ``.jsonl``, ``.jsonl.xz``, ``.jsonl.gz``: one JSON object per line, the document in its
    ``"text"`` field (blank lines are skipped). ``.txt``: the whole file is one document.
    Text is read as UTF-8 without newline translation, so documents are exactly what is stored.
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.is_file():
        raise FileNotFoundError(f"document file not found: {path}")
    if suffix == ".txt":
        with open(path, encoding="utf-8", newline="") as f:
            yield f.read()
        return
    opener = _JSONL_SUFFIXES[suffix]
    # newline="" so that "\r" inside a line is not treated as a line break by the text layer;
    # JSON escapes newlines inside strings, so physical lines end only at "\n".
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise ValueError(f"{path}:{lineno}: expected a JSON object with a string field 'text'")
            yield obj["text"]


def load_embedded_documents() -> list[str]:
    """All documents of the embedded corpus, in their stored (path-sorted) order."""
    if not EMBEDDED_CORPUS.is_file():
        raise FileNotFoundError(
            f"embedded corpus missing: {EMBEDDED_CORPUS}; rebuild it with scripts/build_embedded_corpus.py "
            "or reinstall speedrun (the file is package data)"
        )
    return list(iter_documents(EMBEDDED_CORPUS))


def split_train_val(docs: list[str], val_every: int = 20) -> tuple[list[str], list[str]]:
    """Deterministic split: documents 0, val_every, 2*val_every, ... go to val, the rest to train.

    Starting at document 0 means any non-empty list yields a non-empty val split.
    """
    if val_every < 2:
        raise ValueError(f"val_every must be >= 2 (got {val_every}); 1 would leave no training documents")
    docs = list(docs)
    val = [d for i, d in enumerate(docs) if i % val_every == 0]
    train = [d for i, d in enumerate(docs) if i % val_every != 0]
    return train, val


def cut_at_paragraphs(doc: str, max_chars: int | Callable[[], int]) -> list[str]:
    """One document as pieces of at most ``max_chars`` characters, each a run of whole paragraphs (a paragraph ends
    with its blank lines, which stay with it; \\n or \\r\\n, blank lines may hold spaces); a paragraph longer than
    ``max_chars`` is a piece of its own. The pieces joined give the document back exactly.

    ``max_chars`` is one cap for every piece, or a callable of no arguments giving the next cap (an int >= 1), called
    once as each piece is started: that cap holds for that piece (e.g. :func:`lognormal_caps`, for pieces of a
    heavy-tailed length distribution rather than all near one cap).

    What it is for: a corpus of long documents (the embedded one's validation split is 24 documents of about 10,500
    tokens) cut into documents the length of FineWeb's, so that test-time training, which adapts per document, is
    measured on the shape it meets in parameter-golf (scripts/prepare_data.py --max-doc-chars,
    --doc-chars-lognormal)."""
    if callable(max_chars):
        draw = max_chars
    elif max_chars < 1:
        raise ValueError(f"max_chars must be >= 1 (got {max_chars})")
    else:
        fixed = max_chars

        def draw() -> int:
            return fixed

    def start_cap() -> int:
        cap = draw()
        if not isinstance(cap, int) or cap < 1:
            raise ValueError(f"max_chars() must give an int >= 1 (got {cap!r})")
        return cap

    # a break: a line end followed by one or more blank lines (spaces or tabs allowed, \n or \r\n); it ends right
    # after its last line end, so the next paragraph keeps its indentation
    ends = [m.end() for m in _PARAGRAPH_BREAK.finditer(doc)]
    paragraphs = [doc[a:b] for a, b in zip([0, *ends], [*ends, len(doc)]) if b > a]
    pieces: list[str] = []
    cap = 0  # the cap of the piece being filled, drawn when it was started
    for para in paragraphs:
        # blank lines leading the document join what follows them rather than become a document of their own
        if pieces and (len(pieces[-1]) + len(para) <= cap or not pieces[-1].strip()):
            pieces[-1] += para
        else:
            pieces.append(para)
            cap = start_cap()
    return pieces


def lognormal_caps(median: float, sigma: float, rng: random.Random) -> Callable[[], int]:
    """Caps for :func:`cut_at_paragraphs` drawn one after another from a lognormal distribution of median ``median``
    characters and shape ``sigma`` (the standard deviation of the log), rounded and at least 1; ``sigma`` 0 gives
    ``median`` every time. Its mean is ``median * exp(sigma**2 / 2)``: sigma 1.0 is a web corpus's heavy tail (FineWeb's
    validation documents: median ~567, mean ~944 tokens)."""
    if not median > 0:
        raise ValueError(f"median must be > 0 (got {median})")
    if not sigma >= 0:
        raise ValueError(f"sigma must be >= 0 (got {sigma})")
    mu = math.log(median)
    return lambda: max(1, round(rng.lognormvariate(mu, sigma)))


_PARAGRAPH_BREAK = re.compile(r"\r?\n(?:[ \t]*\r?\n)+")
