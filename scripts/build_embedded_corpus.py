"""Build the embedded training corpus: the Python 3.11 documentation's reST sources.

Reads the ``*.rst.txt`` files that Sphinx ships under ``html/_sources/`` (from Debian's
``python3.11-doc`` package) and writes two files next to the data package:

- ``src/speedrun/data/assets/pydoc311.jsonl.xz``: one JSON object per document,
  ``{"id": <path relative to _sources>, "text": <file contents>}``, sorted by path, xz preset 9.
- ``src/speedrun/data/assets/LICENSE-pydoc.txt``: where the text came from and the PSF license.

The output is byte-identical when rebuilt from the same sources: documents are sorted, JSON is
written with fixed separators, and the xz container stores no timestamps or file names.
If the compressed corpus exceeds ``--max-bytes``, the longest prefix of the sorted document
list that fits is kept (deterministic), and the license file says how many documents were kept.

    python scripts/build_embedded_corpus.py            # defaults point at /work/pydoc
    python scripts/build_embedded_corpus.py --check    # rebuild in memory, compare with the asset
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCES = Path("/work/pydoc/usr/share/doc/python3.11/html/_sources")
DEFAULT_COPYRIGHT = Path("/work/pydoc/usr/share/doc/python3.11-doc/copyright")
DEFAULT_OUT_DIR = REPO_ROOT / "src" / "speedrun" / "data" / "assets"
CORPUS_NAME = "pydoc311.jsonl.xz"
LICENSE_NAME = "LICENSE-pydoc.txt"
DEB_NAME = "python3.11-doc_3.11.2-6+deb12u8_all.deb"


def collect_documents(sources: Path, min_chars: int) -> tuple[list[dict[str, str]], int]:
    """Return ({id, text} sorted by id, number dropped as too short)."""
    files = sorted(sources.rglob("*.rst.txt"), key=lambda p: p.relative_to(sources).as_posix())
    if not files:
        raise FileNotFoundError(f"no *.rst.txt files under {sources}")
    docs, dropped = [], 0
    for path in files:
        # newline="" keeps the bytes as they are on disk (no universal-newline translation).
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        if len(text) < min_chars:
            dropped += 1
            continue
        docs.append({"id": path.relative_to(sources).as_posix(), "text": text})
    return docs, dropped


def encode_jsonl(docs: list[dict[str, str]]) -> bytes:
    lines = (json.dumps({"id": d["id"], "text": d["text"]}, ensure_ascii=False, separators=(",", ":")) for d in docs)
    return ("\n".join(lines) + "\n").encode("utf-8")


def compress(data: bytes) -> bytes:
    # The .xz container has no timestamp or name field, so equal input gives equal output.
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)


def fit_budget(docs: list[dict[str, str]], max_bytes: int) -> tuple[list[dict[str, str]], bytes]:
    """Longest prefix of ``docs`` whose compressed JSONL is at most ``max_bytes`` (binary search)."""
    blob = compress(encode_jsonl(docs))
    if len(blob) <= max_bytes:
        return docs, blob
    lo, hi, best = 1, len(docs) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = compress(encode_jsonl(docs[:mid]))
        if len(candidate) <= max_bytes:
            best, lo = (mid, candidate), mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise ValueError(f"even one document compresses to more than {max_bytes} bytes")
    return docs[: best[0]], best[1]


def python_license_section(copyright_text: str) -> str:
    """The 'Python License' part of Debian's copyright file (history + PSF/BeOpen/CNRI/CWI terms)."""
    start = copyright_text.index("Python License\n==============")
    end = copyright_text.index("Licenses and Acknowledgements for Incorporated Software")
    return copyright_text[start:end].rstrip() + "\n"


def license_text(copyright_text: str, n_kept: int, n_total: int, n_dropped: int, min_chars: int, sha256: str) -> str:
    subset = "all of them" if n_kept == n_total else f"the first {n_kept} of {n_total} in path order (size budget)"
    title = f"Embedded corpus: {CORPUS_NAME}"
    header = f"""\
{title}
{"=" * len(title)}

What it is
----------
The reStructuredText sources of the Python 3.11 documentation, as shipped by Sphinx under
html/_sources/*.rst.txt. Source: Debian package python3.11-doc, version 3.11.2-6+deb12u8
({DEB_NAME}), directory usr/share/doc/python3.11/html/_sources/.

Changes made (summary, as the PSF license asks): each file became one JSON line
{{"id": <path relative to _sources>, "text": <file contents, unmodified>}}; files shorter
than {min_chars} characters were dropped ({n_dropped} files); of the remaining {n_total}
documents this file holds {subset}; the result is xz-compressed (preset 9).
It is used only as a small training/validation corpus for language-model experiments.
Built by scripts/build_embedded_corpus.py; sha256 of {CORPUS_NAME}: {sha256}

Copyright
---------
Python and its documentation are:
Copyright (c) 2001-2023 Python Software Foundation. All rights reserved.
Copyright (c) 2000 BeOpen.com. All rights reserved.
Copyright (c) 1995-2000 Corporation for National Research Initiatives. All rights reserved.
Copyright (c) 1991-1995 Stichting Mathematisch Centrum. All rights reserved.

The documentation is distributed under the PSF License Agreement below (the Python 3.11
documentation's license.rst, included in the corpus as license.rst.txt, also
places code examples in the documentation under the Zero-Clause BSD license).
The text below is the "Python License" section of Debian's
usr/share/doc/python3.11-doc/copyright file, reproduced verbatim.

"""
    return header + python_license_section(copyright_text)


def build(sources: Path, copyright_file: Path, min_chars: int, max_bytes: int) -> tuple[bytes, str, dict]:
    docs, dropped = collect_documents(sources, min_chars)
    kept, blob = fit_budget(docs, max_bytes)
    sha = hashlib.sha256(blob).hexdigest()
    lic = license_text(copyright_file.read_text(encoding="utf-8"), len(kept), len(docs), dropped, min_chars, sha)
    stats = {
        "documents": len(kept),
        "dropped_short": dropped,
        "dropped_budget": len(docs) - len(kept),
        "chars": sum(len(d["text"]) for d in kept),
        "compressed_bytes": len(blob),
        "sha256": sha,
    }
    return blob, lic, stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=Path, default=DEFAULT_SOURCES, help="html/_sources directory")
    parser.add_argument("--copyright", type=Path, default=DEFAULT_COPYRIGHT, help="Debian copyright file")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--min-chars", type=int, default=500, help="drop documents shorter than this")
    parser.add_argument("--max-bytes", type=int, default=4_000_000, help="budget for the compressed file")
    parser.add_argument("--check", action="store_true", help="rebuild in memory and compare with the files on disk")
    args = parser.parse_args(argv)

    blob, lic, stats = build(args.sources, args.copyright, args.min_chars, args.max_bytes)
    corpus_path, license_path = args.out_dir / CORPUS_NAME, args.out_dir / LICENSE_NAME
    if args.check:
        same = corpus_path.is_file() and corpus_path.read_bytes() == blob
        same_lic = license_path.is_file() and license_path.read_text(encoding="utf-8") == lic
        print(
            f"{corpus_path}: {'identical' if same else 'DIFFERS'}; {license_path}: {'identical' if same_lic else 'DIFFERS'}"
        )
        return 0 if same and same_lic else 1
    args.out_dir.mkdir(parents=True, exist_ok=True)
    corpus_path.write_bytes(blob)
    license_path.write_text(lic, encoding="utf-8")
    for key, value in stats.items():
        print(f"{key}: {value}")
    print(f"wrote {corpus_path} and {license_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
