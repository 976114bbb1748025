"""Check speedrun's byte count of a GPT-2 (tiktoken) val split against decoding it.

    python scripts/check_bpb_bytes.py --data DIR [--tokenizer gpt2|PATH.tiktoken] [--seq-len 2048] [--tokens N]

val_bpb divides the summed loss by the bytes of the scored target tokens. For tiktoken shards speedrun counts
each target token through its byte tables (speedrun.core.data.build_tiktoken_luts, summed by
speedrun.data.bpb.token_bytes, as the final evaluation does). This script counts the same targets a second,
independent way: it cuts the val stream at <|endoftext|>, decodes each document's tokens with tiktoken
(Encoding.decode_bytes) and sums the UTF-8 lengths, checking that every document decodes to valid UTF-8. It prints
both, and dataset.json's count of the original text when the directory has one (prepare_data.py writes it), and
exits 1 if they differ.

Two spans are checked: the whole val split, and what the evaluation scores with --seq-len (the first --tokens
tokens, or all, cut to k * seq_len + 1 tokens: speedrun.core.data.load_val_tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    import speedrun.data  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np
import torch

from speedrun.core.data import (
    boundary_id,
    build_tiktoken_luts,
    list_shards,
    load_encoding,
    load_val_tokens,
    read_shard,
    token_bytes,
)


def speedrun_bytes(tokens: np.ndarray, luts) -> int:
    """Bytes of the targets tokens[1:], as the evaluation counts them (token_bytes of (previous, target))."""
    t = torch.from_numpy(tokens.astype(np.int64))
    return int(token_bytes(t[:-1], t[1:], luts).sum()) if t.numel() > 1 else 0


def decoded_bytes(tokens: np.ndarray, enc, eot: int, whole_tail: bool) -> tuple[int, int]:
    """(UTF-8 bytes of the decoded targets tokens[1:], documents): the stream cut at <|endoftext|>, each piece
    decoded with tiktoken; the separators themselves are not text. Every document that ends inside the span (and
    the last one when ``whole_tail``) must be valid UTF-8; a span cut mid-document may end inside a character."""
    targets = tokens[1:].astype(np.int64)
    pieces = [piece[piece != eot] for piece in np.split(targets, np.flatnonzero(targets == eot))]
    pieces = [piece for piece in pieces if piece.size]
    total = 0
    for i, piece in enumerate(pieces):
        data = enc.decode_bytes(piece.tolist())
        if i < len(pieces) - 1 or whole_tail:
            data.decode("utf-8")  # raises UnicodeDecodeError on a document that is not text
        total += len(data)
    return total, len(pieces)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, type=Path, help="directory with fineweb_val_*.bin (and dataset.json)")
    p.add_argument("--tokenizer", help="gpt2 or PATH.tiktoken (default: dataset.json's tokenizer)")
    p.add_argument("--seq-len", type=int, default=2048, help="evaluation window (default 2048)")
    p.add_argument("--tokens", type=int, default=None, help="eval.tokens: score the first N val tokens")
    args = p.parse_args(argv)

    info_path = args.data / "dataset.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    tokenizer = args.tokenizer or info.get("tokenizer")
    if tokenizer is None:
        p.error("--tokenizer is needed (no dataset.json names one)")
    enc = load_encoding(tokenizer)
    eot = boundary_id(enc)
    luts = build_tiktoken_luts(enc)
    val_paths = list_shards(args.data, "val")
    stream = np.concatenate([read_shard(path) for path in val_paths]).astype(np.int64)
    print(f"tokenizer      : {tokenizer} ({enc.n_vocab} tokens, <|endoftext|> = {eot})")
    print(f"val shards     : {', '.join(str(x) for x in val_paths)}")
    print(f"val tokens     : {stream.size:,} (first token {stream[0]}: {'the separator' if stream[0] == eot else '?'})")

    ok = True
    scored = load_val_tokens(val_paths, args.tokens, args.seq_len).numpy()
    spans = (("whole val split", stream, True), (f"eval windows (seq_len {args.seq_len})", scored, False))
    for label, tokens, whole in spans:
        ours = speedrun_bytes(tokens, luts)
        theirs, docs = decoded_bytes(tokens, enc, eot, whole_tail=whole or tokens.size == stream.size)
        same = ours == theirs
        ok &= same
        print(f"{label}: {tokens.size - 1:,} targets in {docs} document(s)")
        print(f"  speedrun byte count (token_bytes over the targets): {ours:,}")
        print(f"  UTF-8 bytes of tiktoken's decoding                : {theirs:,}  {'equal' if same else 'DIFFERENT'}")
    original = info.get("val", {}).get("bytes_original_text")
    if original is not None:
        whole = speedrun_bytes(stream, luts)
        same = whole == original
        ok &= same
        print(f"dataset.json: the val documents' text is {original:,} bytes: {'equal' if same else 'DIFFERENT'}")
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
