"""A small byte-level BPE with GPT-2's rules, for the tiktoken tests (the real GPT-2 vocabulary cannot be downloaded
offline): all 256 single bytes plus a few merges (MERGES), <|endoftext|> after them; documents that exercise it
(DOCS), and the ranks written as a .tiktoken file."""

from __future__ import annotations

import base64
from pathlib import Path

MERGES = [b" t", b"he", b" the", b"in", b" a", b"\xe2\x82", b"\xe2\x82\xac", b"  ", b"    ", b"\n\n"]
DOCS = [
    "the cat in the hat",
    " leading space, then the rest",
    "",
    "\u20ac euro first, and a \u20ac\u20ac pair",
    "\u00fcn\u00efc\u00f6d\u00e9 \u6f22\u5b57 \U0001f642 \u00a0nbsp",
    "code:\n    indented()\n\n\ttab\r\n",
    "a literal <|endoftext|> inside a document is text",
    " " * 9 + "x",
]


def small_ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for piece in MERGES:
        ranks[piece] = len(ranks)
    return ranks


def write_tiktoken_file(path: Path) -> Path:
    lines = [f"{base64.b64encode(tok).decode()} {rank}" for tok, rank in small_ranks().items()]
    path.write_text("\n".join(lines) + "\n")
    return path
