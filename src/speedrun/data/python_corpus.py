"""A large corpus built from text already on any machine: the Python installation's own sources and docs.

The embedded corpus (4M tokens) is small enough that a few minutes on a GPU pass over it many times, so its
val_bpb measures memorisation. The standard library and site-packages hold hundreds of MB of .py, .rst, .md and
.txt files instead, on every machine that runs speedrun. They are walked in sorted order, deduplicated by content
hash, split into train/val by document (the same hash, so a document lands in the same split wherever it sits and
whatever else is installed), put in the order of that hash, and tokenized into parameter-golf shards with a
SentencePiece tokenizer trained on a sample. Walk order would cluster a package's many tiny files (hundreds of
documents in one 98,304-token micro-batch) and drift from package to package through a run; hash order is a
shuffle that depends on nothing but the contents, as a web corpus's shards are shuffled. What was built from what
is in dataset.json: the counts, the Python it came from, and a fingerprint over the files (paths relative to their
root, content hashes), the split and the tokenizer. Two builds with the same fingerprint have the same shards.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from speedrun.data.prepare import DatasetPaths, prepare_dataset

SUFFIXES = (".py", ".rst", ".md", ".txt")
VAL_FRACTION = 0.01
#: Characters of train documents the tokenizer is trained on: at 1024 pieces, 10M characters compress the corpus
#: about 1% better than 4M (measured on held-out documents) and train in about 2 s on 2 cores; 20M gained nothing.
TOKENIZER_CHARS = 10_000_000
#: Bump when what goes into the corpus, its split or its order changes: it is part of the fingerprint.
#: 2: documents in content-hash order (1: walk order).
CORPUS_VERSION = 2


def default_roots() -> list[Path]:
    """The running Python's standard library and site-packages (sysconfig's stdlib, platstdlib, purelib and
    platlib), then its documentation under <prefix>/share/doc/python<X.Y> where one is installed: those that exist,
    each once."""
    paths = sysconfig.get_paths()
    roots = [Path(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, paths.get("data", sys.prefix))):
        roots += [Path(prefix) / "share" / "doc" / name for name in (f"python{version}", f"python{version}-doc")]
    seen: set[Path] = set()
    out = []
    for root in roots:
        real = root.resolve()
        if real.is_dir() and real not in seen:
            seen.add(real)
            out.append(real)
    return out


def walk_files(roots: list[Path]) -> list[tuple[int, str, Path]]:
    """(root index, path relative to the root in POSIX form, path) of every file with a SUFFIXES suffix, each root's
    files sorted by relative path, roots in the order given. A root inside another is walked as itself only (e.g.
    site-packages under the stdlib of a Python that is not a venv), so each file is listed once. Links to
    directories are not followed (they can loop); links to files are read like files."""
    real_roots = [Path(r).resolve() for r in roots]
    for root, real in zip(roots, real_roots):
        if not real.is_dir():
            raise FileNotFoundError(f"corpus root not found: {root} (pass existing directories to --roots)")
    files = []
    for index, root in enumerate(real_roots):
        others = {r for r in real_roots if r != root and root in r.parents}
        found = []
        for directory, dirs, names in os.walk(root):
            here = Path(directory)
            dirs[:] = [d for d in dirs if here / d not in others]
            found += [here / n for n in names if n.endswith(SUFFIXES)]
        files += sorted((index, p.relative_to(root).as_posix(), p) for p in found)
    return files


@dataclass
class PythonCorpus:
    """The documents (one a file, deduplicated) and what was skipped, in walk order."""

    roots: list[Path]
    train: list[str] = field(default_factory=list)
    val: list[str] = field(default_factory=list)
    train_hashes: list[str] = field(default_factory=list)
    """Content sha256 of each train document, in order: the shards' order and the tokenizer's sample follow it."""
    val_hashes: list[str] = field(default_factory=list)
    files: int = 0
    """Files walked (with a SUFFIXES suffix), read or not."""
    bytes: int = 0
    """UTF-8 bytes of the documents kept."""
    duplicates: int = 0
    not_utf8: int = 0
    empty: int = 0
    unreadable: int = 0
    capped: bool = False
    """True if --max-bytes stopped the walk before its end."""
    listing: list[str] = field(default_factory=list)
    """One line a document kept, in order: <root index>/<relative path>, its content sha256 and its split."""

    @property
    def documents(self) -> int:
        return len(self.train) + len(self.val)

    @property
    def files_sha256(self) -> str:
        """sha256 over the listing: which files, with which contents, in which split."""
        return hashlib.sha256("".join(f"{line}\n" for line in self.listing).encode()).hexdigest()


def is_val(content_sha256: str, val_fraction: float) -> bool:
    """Whether a document goes to val: the first 64 bits of its content hash, as a fraction of 2**64, fall below
    ``val_fraction``. By content, not by path or position, so adding or removing other files moves no document
    between the splits."""
    return int(content_sha256[:16], 16) < val_fraction * 2**64


def collect(roots: list[Path], val_fraction: float = VAL_FRACTION, max_bytes: int | None = None) -> PythonCorpus:
    """Read the files under ``roots`` (walk_files' order) into train/val documents. A file whose bytes were already
    seen, that is not UTF-8 or holds only whitespace is skipped and counted. With ``max_bytes``, the walk stops
    before the first document that would take the kept bytes past it."""
    corpus = PythonCorpus(roots=[Path(r) for r in roots])
    seen: set[bytes] = set()
    for index, rel, path in walk_files(corpus.roots):
        corpus.files += 1
        try:
            data = path.read_bytes()
        except OSError:  # a dangling link, a file without read permission
            corpus.unreadable += 1
            continue
        digest = hashlib.sha256(data)
        if digest.digest() in seen:
            corpus.duplicates += 1
            continue
        seen.add(digest.digest())
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # test data in other encodings: as text it would be mojibake
            corpus.not_utf8 += 1
            continue
        if not text.strip():
            corpus.empty += 1
            continue
        if max_bytes is not None and corpus.bytes + len(data) > max_bytes:
            corpus.capped = True
            break
        sha = digest.hexdigest()
        split = "val" if is_val(sha, val_fraction) else "train"
        if split == "val":
            corpus.val.append(text)
            corpus.val_hashes.append(sha)
        else:
            corpus.train.append(text)
            corpus.train_hashes.append(sha)
        corpus.bytes += len(data)
        corpus.listing.append(f"{index}/{rel}\t{sha}\t{split}")
    return corpus


def in_hash_order(texts: list[str], hashes: list[str]) -> list[str]:
    """``texts`` sorted by their content hashes (``hashes``, in the same order): the order the shards hold them in."""
    return [texts[i] for i in sorted(range(len(texts)), key=hashes.__getitem__)]


def tokenizer_sample(corpus: PythonCorpus, chars: int) -> list[str]:
    """Train documents to train the tokenizer on: taken in the order of their content hashes (a sample that does
    not favour the packages that sort first) until about twice ``chars`` characters, from which the trainer
    samples ``chars``."""
    sample, size = [], 0
    for text in in_hash_order(corpus.train, corpus.train_hashes):
        if size >= 2 * chars:
            break
        sample.append(text)
        size += len(text)
    return sample


def default_processes() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def build_python_corpus(
    out_dir: Path,
    roots: list[Path] | None = None,
    vocab_size: int = 1024,
    *,
    max_bytes: int | None = None,
    val_fraction: float = VAL_FRACTION,
    shard_tokens: int = 100_000_000,
    processes: int | None = None,
    tokenizer_chars: int = TOKENIZER_CHARS,
    seed: int = 0,
    overwrite: bool = False,
    caseops: bool = False,
) -> DatasetPaths:
    """Build the Python-installation corpus into ``out_dir`` (see the module's docstring); ``roots`` default to
    default_roots(). dataset.json gets ``fingerprint`` and ``source`` (roots, counts, Python version and prefix)
    besides prepare_dataset's record. ``caseops``: the documents in CaseOps, with the val byte sidecar
    (prepare_dataset's caseops)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction} must be between 0 and 1 (e.g. {VAL_FRACTION})")
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes} must be >= 1 (or None: no cap)")
    if Path(out_dir).exists() and not overwrite:  # before seconds of reading, not after (prepare_dataset checks too)
        raise FileExistsError(f"{out_dir} already exists; pass overwrite=True (--overwrite) to replace it")
    roots = default_roots() if roots is None else [Path(r).expanduser() for r in roots]
    if not roots:
        raise FileNotFoundError("no corpus roots: this Python reports no stdlib or site-packages; pass --roots")
    t0 = time.perf_counter()
    corpus = collect(roots, val_fraction, max_bytes)
    _log_read(corpus, roots, time.perf_counter() - t0)
    if not corpus.val or not corpus.train:
        raise ValueError(
            f"{len(corpus.train)} train and {len(corpus.val)} val documents from {corpus.documents} under "
            f"{', '.join(map(str, roots))}: each split needs one; raise --max-bytes or --val-fraction"
        )
    source = source_record(corpus, roots, val_fraction, max_bytes, tokenizer_chars)
    return prepare_dataset(
        in_hash_order(corpus.train, corpus.train_hashes),
        in_hash_order(corpus.val, corpus.val_hashes),
        out_dir,
        vocab_size,
        shard_tokens,
        seed=seed,
        processes=processes or default_processes(),
        tokenizer_texts=tokenizer_sample(corpus, tokenizer_chars),
        tokenizer_chars=tokenizer_chars,
        overwrite=overwrite,
        info=functools.partial(_fingerprint, source),
        caseops=caseops,
    )


def _log_read(corpus: PythonCorpus, roots: list[Path], read_s: float) -> None:
    print(
        f"[speedrun.data] read {corpus.files:,} files under {len(roots)} root(s) in {read_s:.1f}s: "
        f"{corpus.documents:,} documents ({len(corpus.train):,} train, {len(corpus.val):,} val), "
        f"{corpus.bytes:,} bytes; skipped {corpus.duplicates:,} duplicates, {corpus.not_utf8:,} not UTF-8, "
        f"{corpus.empty:,} empty, {corpus.unreadable:,} unreadable",
        file=sys.stderr,
        flush=True,
    )


def source_record(
    corpus: PythonCorpus, roots: list[Path], val_fraction: float, max_bytes: int | None, tokenizer_chars: int
) -> dict:
    """dataset.json's ``source``: what the corpus was read from and how, what it holds, and the Python it came with."""
    return {
        "kind": "python",
        "corpus_version": CORPUS_VERSION,
        "roots": [str(r) for r in roots],
        "suffixes": list(SUFFIXES),
        "val_fraction": val_fraction,
        "max_bytes": max_bytes,
        "capped": corpus.capped,
        "tokenizer_chars": tokenizer_chars,
        "files": corpus.files,
        "bytes": corpus.bytes,
        "documents": corpus.documents,
        "skipped": {
            "duplicates": corpus.duplicates,
            "not_utf8": corpus.not_utf8,
            "empty": corpus.empty,
            "unreadable": corpus.unreadable,
        },
        "files_sha256": corpus.files_sha256,
        "python_version": sys.version.split()[0],
        "python_implementation": sys.implementation.name,
        "python_prefix": sys.prefix,
        "python_base_prefix": sys.base_prefix,
    }


def _fingerprint(source: dict, record: dict) -> dict:
    """dataset.json's ``fingerprint`` and ``source``, given prepare_dataset's record."""
    # Everything the shards are a function of: which files and contents (and their split), the tokenizer
    # (trained on them, so its hash covers the sample and the settings), and the layout.
    parts = [
        f"corpus_version={CORPUS_VERSION}",
        f"files={source['files_sha256']}",
        f"tokenizer={record['tokenizer_sha256']}",
        f"shard_tokens={record['shard_tokens']}",
    ]
    return {"fingerprint": hashlib.sha256("\n".join(parts).encode()).hexdigest(), "source": source}
