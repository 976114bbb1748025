"""Tokenize your own documents into speedrun/parameter-golf shards.

    python scripts/prepare_data.py --input docs.jsonl more.jsonl.xz notes.txt --out data/mydocs --vocab-size 1024

Inputs: .jsonl / .jsonl.xz / .jsonl.gz (one JSON object per line, document in "text") and .txt
(the whole file is one document), read in the order given. Documents 0, N, 2N, ... (N =
--val-every) form the val split. Writes DIR/tokenizer.model, DIR/fineweb_train_%06d.bin,
DIR/fineweb_val_%06d.bin and DIR/dataset.json; train on it with
    python -m run data.path=DIR data.tokenizer=DIR/tokenizer.model data.vocab_size=<vocab>
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import speedrun.data  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speedrun.data.corpus import iter_documents, split_train_val
from speedrun.data.prepare import prepare_dataset, read_dataset_info


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train a SentencePiece BPE tokenizer on your documents and write train/val token shards.",
        epilog="Example: python scripts/prepare_data.py --input a.jsonl b.txt --out data/mine --vocab-size 1024",
    )
    parser.add_argument(
        "--input",
        nargs="+",
        type=Path,
        required=True,
        metavar="FILE",
        help="document files: .jsonl, .jsonl.xz, .jsonl.gz (field 'text') or .txt (one document)",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (must not exist)")
    parser.add_argument("--vocab-size", type=int, default=1024, help="tokenizer vocabulary size (default 1024)")
    parser.add_argument(
        "--val-every",
        type=int,
        default=20,
        help="every N-th document (starting with the first) goes to val (default 20)",
    )
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default 100M)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the tokenizer's training-text sample")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    docs: list[str] = []
    for path in args.input:
        docs.extend(iter_documents(path))
    train, val = split_train_val(docs, args.val_every)
    paths = prepare_dataset(
        train,
        val,
        args.out,
        args.vocab_size,
        args.shard_tokens,
        seed=args.seed,
        overwrite=args.overwrite,
        info={"inputs": [str(p) for p in args.input], "val_every": args.val_every},
    )
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
    }
    width = max(map(len, rows))
    for key, value in rows.items():
        print(f"{key.ljust(width)}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
