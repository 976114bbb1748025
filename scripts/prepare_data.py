"""Tokenize your own documents, or this machine's Python installation, into speedrun/parameter-golf shards.

    python scripts/prepare_data.py --input docs.jsonl more.jsonl.xz notes.txt --out data/mydocs --vocab-size 1024
    python scripts/prepare_data.py --source python --out data/python_sp1024 --vocab 1024

Inputs: .jsonl / .jsonl.xz / .jsonl.gz (one JSON object per line, document in "text") and .txt
(the whole file is one document), read in the order given. Documents 0, N, 2N, ... (N =
--val-every) form the val split; with --val-docs N the first N documents do (the records' CaseOps prep splits
FineWeb so). Writes DIR/tokenizer.model, DIR/fineweb_train_%06d.bin, DIR/fineweb_val_%06d.bin and
DIR/dataset.json; train on it with
    python -m run data.path=DIR data.tokenizer=DIR/tokenizer.model data.vocab_size=<vocab>

--caseops writes the documents in parameter-golf's CaseOps (lossless_caps_caseops_v1, speedrun.data.caseops): the
tokenizer reserves the four case operators, and each val shard gets its byte sidecar DIR/fineweb_val_bytes_%06d.bin
(per token its bytes of the original text), from which a run counts val_bpb. --tokenizer PATH.model encodes with that
SentencePiece model instead of training one (with --caseops it must reserve the operators: the records' CaseOps
tokenizer does). For the Python corpus:
    python scripts/prepare_data.py --source python --caseops --out data/python_sp1024_caseops
    python -m run data=python_sp1024_caseops

--max-doc-chars N cuts each document (after the split) into runs of whole paragraphs of at most N characters: a
corpus of long documents made into FineWeb-like ones, e.g. for measuring test-time training, which works per document.
--doc-chars-lognormal MEDIAN SIGMA cuts the same way but draws each piece's cap from a lognormal distribution (seeded
by --seed), for a web corpus's heavy-tailed spread of lengths rather than all near one cap.

With --tokenizer gpt2 (or a local *.tiktoken vocabulary) nothing is trained: the documents are tokenized with
GPT-2's byte-level BPE (tiktoken; pip install 'speedrun[gpt2]'), each prefixed by <|endoftext|> (50256), as in
modded-nanogpt's FineWeb shards; train on them with
    python -m run data=fineweb10B_gpt2 data.path=DIR

--source python builds a corpus of hundreds of MB from text every machine has: the running Python's standard library
and site-packages (.py, .rst, .md, .txt; --roots to name other directories), one document a file, deduplicated by
content, about 1% of documents in val (chosen by content hash). dataset.json records a fingerprint of the files,
split and tokenizer, the counts and the Python it came from. Train on it with
    python -m run data=python_sp1024 [data.path=DIR]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

try:
    import speedrun.data  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speedrun.core.data import is_tiktoken
from speedrun.data.corpus import cut_at_paragraphs, iter_documents, lognormal_caps, split_train_val
from speedrun.data.prepare import prepare_dataset, prepare_tiktoken_dataset, read_dataset_info
from speedrun.data.python_corpus import VAL_FRACTION, build_python_corpus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train a SentencePiece BPE tokenizer on your documents (or on this machine's Python sources "
        "and docs) and write train/val token shards.",
        epilog="Examples: python scripts/prepare_data.py --input a.jsonl b.txt --out data/mine --vocab-size 1024; "
        "python scripts/prepare_data.py --source python --out data/python_sp1024",
    )
    parser.add_argument(
        "--source",
        choices=("files", "python"),
        default="files",
        help="files (default): the documents of --input; python: the running Python's stdlib and site-packages "
        "sources and docs (.py, .rst, .md, .txt), one document a file, deduplicated",
    )
    parser.add_argument(
        "--input",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="document files: .jsonl, .jsonl.xz, .jsonl.gz (field 'text') or .txt (one document); --source files",
    )
    parser.add_argument(
        "--roots",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="--source python: directories to walk (default: sysconfig's stdlib, platstdlib, purelib and platlib, "
        "and <prefix>/share/doc/python<X.Y> if installed)",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        metavar="N",
        help="--source python: stop the walk before the document that would take the corpus past N bytes",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        metavar="F",
        help=f"--source python: the fraction of documents in val, chosen by content hash (default {VAL_FRACTION})",
    )
    parser.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="--source python: tokenize in N worker processes (default: one a core this process may use)",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (must not exist)")
    parser.add_argument(
        "--tokenizer",
        default="sentencepiece",
        metavar="KIND",
        help="sentencepiece (default: train one of --vocab-size on the train split), PATH.model (encode with this "
        "SentencePiece model, e.g. the records' CaseOps tokenizer with --caseops; nothing trained), gpt2 (tiktoken's "
        "GPT-2 encoding, modded-nanogpt's) or PATH.tiktoken (a local GPT-2 vocabulary, for offline machines)",
    )
    parser.add_argument(
        "--vocab-size",
        "--vocab",
        type=int,
        default=1024,
        help="vocabulary of a trained sentencepiece tokenizer (default 1024)",
    )
    split = parser.add_mutually_exclusive_group()
    split.add_argument(
        "--val-every",
        type=int,
        metavar="N",
        help="--source files: every N-th document (starting with the first) goes to val (default 20)",
    )
    split.add_argument(
        "--val-docs",
        type=int,
        metavar="N",
        help="--source files: the first N documents go to val, the rest to train (the records' CaseOps prep: "
        "FineWeb's first 50,000 documents)",
    )
    parser.add_argument(
        "--caseops",
        action="store_true",
        help="write the documents in CaseOps (parameter-golf's lossless case transform) with a tokenizer that "
        "reserves its operators, and the val byte sidecar fineweb_val_bytes_*.bin that val_bpb is counted on",
    )
    cut = parser.add_mutually_exclusive_group()
    cut.add_argument(
        "--max-doc-chars",
        type=int,
        metavar="N",
        help="cut each document, after the train/val split, into runs of whole paragraphs of at most N characters "
        "(e.g. 2500 for FineWeb-like lengths; a longer paragraph stays whole): more, shorter documents",
    )
    cut.add_argument(
        "--doc-chars-lognormal",
        type=float,
        nargs=2,
        metavar=("MEDIAN", "SIGMA"),
        help="cut like --max-doc-chars, but each piece's cap in characters drawn in turn from a lognormal "
        "distribution of median MEDIAN and log-space standard deviation SIGMA (seeded by --seed): a web corpus's "
        "heavy-tailed document lengths. FineWeb's validation documents are about median 567 and mean 944 tokens "
        "under parameter-golf's sp8192 tokenizer, i.e. SIGMA about 1.0 (mean/median = exp(SIGMA**2/2)); convert "
        "tokens to characters with your tokenizer's characters per token; pieces end at paragraph breaks, so they "
        "come out somewhat shorter than their caps (e.g. 1650 1.0 on the embedded corpus with a 1024-token "
        "tokenizer, ~2.6 characters a token: val documents of median ~560 and mean ~940 tokens)",
    )
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default 100M)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for the tokenizer's training-text sample and --doc-chars-lognormal"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    return parser


def _cut_lognormal(docs: list[str], median: float, sigma: float, seed: str) -> list[str]:
    caps = lognormal_caps(median, sigma, random.Random(seed))
    return [piece for doc in docs for piece in cut_at_paragraphs(doc, caps)]


_PYTHON_ONLY = ("roots", "max_bytes", "val_fraction", "processes")
_FILES_ONLY = ("input", "val_every", "val_docs", "max_doc_chars", "doc_chars_lognormal")


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _print_rows(rows: dict) -> None:
    width = max(map(len, rows))
    for key, value in rows.items():
        print(f"{key.ljust(width)}: {value}")


def _main_python(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    for dest in _FILES_ONLY:
        if getattr(args, dest) is not None:
            parser.error(f"{_option(dest)} is for --source files; --source python reads --roots (or this Python)")
    if args.tokenizer != "sentencepiece":
        parser.error(f"--source python trains its own sentencepiece tokenizer; drop --tokenizer {args.tokenizer}")
    if args.val_fraction is not None and not 0 < args.val_fraction < 1:
        parser.error(f"--val-fraction {args.val_fraction}: must be between 0 and 1 (e.g. {VAL_FRACTION})")
    if args.max_bytes is not None and args.max_bytes < 1:
        parser.error(f"--max-bytes {args.max_bytes}: must be >= 1 (e.g. 5000000)")
    if args.processes is not None and args.processes < 1:
        parser.error(f"--processes {args.processes}: must be >= 1")
    t0 = time.perf_counter()
    try:
        paths = build_python_corpus(
            args.out,
            args.roots,
            args.vocab_size,
            max_bytes=args.max_bytes,
            val_fraction=VAL_FRACTION if args.val_fraction is None else args.val_fraction,
            shard_tokens=args.shard_tokens,
            processes=args.processes,
            seed=args.seed,
            overwrite=args.overwrite,
            caseops=args.caseops,
        )
    except (FileExistsError, FileNotFoundError, ValueError) as e:  # a root, --out, a split or vocabulary to change
        parser.error(str(e))
    info = read_dataset_info(paths.directory)
    source = info["source"]
    _print_rows(
        {
            "out": paths.directory,
            "tokenizer": paths.tokenizer,
            "vocab_size": paths.vocab_size,
            "python": f"{source['python_version']} ({source['python_prefix']})",
            "files": source["files"],
            "bytes": source["bytes"],
            "documents": source["documents"],
            "train_documents": info["train"]["documents"],
            "train_tokens": info["train"]["tokens"],
            "train_shards": len(paths.train),
            "val_documents": info["val"]["documents"],
            "val_tokens": info["val"]["tokens"],
            "val_bytes": info["val"]["bytes"],
            "unigram_val_bpb": f"{info['unigram_val_bpb']:.4f}",
            "fingerprint": info["fingerprint"],
            **_caseops_rows(info, paths),
            "seconds": f"{time.perf_counter() - t0:.1f}",
            "train_on_it": f"python -m run data=python_sp1024{'_caseops' if args.caseops else ''} "
            f"data.path={paths.directory}"
            + ("" if paths.vocab_size == 1024 else f" data.vocab_size={paths.vocab_size}"),
        }
    )
    return 0


def _caseops_rows(info: dict, paths) -> dict:
    """The rows a CaseOps build adds: its transform and byte sidecars (none for other builds)."""
    if "text_transform" not in info:
        return {}
    return {"text_transform": info["text_transform"], "val_byte_sidecars": len(paths.val_bytes)}


def _split(parser: argparse.ArgumentParser, docs: list[str], args: argparse.Namespace) -> tuple[list, list, dict]:
    """Train and val documents by --val-docs (the first N) or --val-every, and what dataset.json records of it."""
    if args.val_docs is not None:
        if not 0 < args.val_docs < len(docs):
            parser.error(
                f"--val-docs {args.val_docs}: must be between 1 and the {len(docs)} documents read less one "
                "(train needs a document too)"
            )
        return docs[args.val_docs :], docs[: args.val_docs], {"val_docs": args.val_docs}
    val_every = 20 if args.val_every is None else args.val_every
    train, val = split_train_val(docs, val_every)
    return train, val, {"val_every": val_every}


def _model_size(model: Path) -> int:
    """A given SentencePiece model's vocabulary (0 when it is missing: prepare_dataset names that)."""
    if not model.is_file():
        return 0
    from speedrun.core.data import load_tokenizer

    return int(load_tokenizer(model).get_piece_size())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    given = args.tokenizer.endswith(".model")  # an existing SentencePiece model: encode with it, train nothing
    if args.tokenizer != "sentencepiece" and not given and not is_tiktoken(args.tokenizer):
        parser.error(f"--tokenizer {args.tokenizer}: use sentencepiece, PATH.model, gpt2 or a path ending in .tiktoken")
    if args.source == "python":
        return _main_python(parser, args)
    for dest in _PYTHON_ONLY:
        if getattr(args, dest) is not None:
            parser.error(f"{_option(dest)} is for --source python; --source files reads --input")
    if not args.input:
        parser.error("--input FILE... is required (or --source python, for this machine's Python sources and docs)")
    if args.caseops and is_tiktoken(args.tokenizer):
        parser.error(
            f"--caseops trains a sentencepiece tokenizer that reserves its operators; drop --tokenizer {args.tokenizer}"
        )
    docs: list[str] = []
    for path in args.input:
        docs.extend(iter_documents(path))
    train, val, split = _split(parser, docs, args)
    inputs: dict = {"inputs": [str(p) for p in args.input], **split}
    if args.max_doc_chars is not None:  # after the split, so that no document has pieces in both
        if args.max_doc_chars < 1:
            parser.error(f"--max-doc-chars {args.max_doc_chars}: must be >= 1 (e.g. 2500)")
        train = [piece for doc in train for piece in cut_at_paragraphs(doc, args.max_doc_chars)]
        val = [piece for doc in val for piece in cut_at_paragraphs(doc, args.max_doc_chars)]
        inputs["max_doc_chars"] = args.max_doc_chars
    if args.doc_chars_lognormal is not None:  # the same, each piece's cap drawn from a lognormal distribution
        median, sigma = args.doc_chars_lognormal
        if not 0 < median < math.inf:  # also refuses nan
            parser.error(f"--doc-chars-lognormal {median:g} {sigma:g}: MEDIAN must be > 0 characters (e.g. 1400)")
        if not 0 <= sigma < math.inf:
            parser.error(
                f"--doc-chars-lognormal {median:g} {sigma:g}: SIGMA must be >= 0 (0: every cap MEDIAN; ~1.0: web-like)"
            )
        # one generator a split, so that val's cut does not depend on the train documents
        train = _cut_lognormal(train, median, sigma, f"{args.seed}/train")
        val = _cut_lognormal(val, median, sigma, f"{args.seed}/val")
        inputs["doc_chars_lognormal"] = {"median": median, "sigma": sigma, "seed": args.seed}
    if is_tiktoken(args.tokenizer):
        paths = prepare_tiktoken_dataset(
            train, val, args.out, args.tokenizer, args.shard_tokens, overwrite=args.overwrite, info=inputs
        )
    elif args.tokenizer == "sentencepiece" or given:
        model = Path(args.tokenizer) if given else None
        try:
            paths = prepare_dataset(
                train,
                val,
                args.out,
                _model_size(model) if model is not None else args.vocab_size,
                args.shard_tokens,
                seed=args.seed,
                overwrite=args.overwrite,
                info=inputs,
                caseops=args.caseops,
                tokenizer_model=model,
            )
        except (FileNotFoundError, ValueError) as e:  # the given model: missing, or no CaseOps operators
            parser.error(str(e))
    else:  # refused by the check above
        raise AssertionError(args.tokenizer)
    info = read_dataset_info(paths.directory)
    rows = {
        "out": paths.directory,
        "tokenizer": paths.tokenizer,
        "vocab_size": paths.vocab_size,
        "train_documents": info["train"]["documents"],
        "train_tokens": info["train"]["tokens"],
        "train_shards": len(paths.train),
        "val_documents": info["val"]["documents"],
        "val_tokens": info["val"]["tokens"],
        "val_bytes": info["val"]["bytes"],
        "unigram_val_bpb": f"{info['unigram_val_bpb']:.4f}",
        **_caseops_rows(info, paths),
    }
    _print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
