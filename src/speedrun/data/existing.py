"""Opening shard directories made elsewhere, checked: parameter-golf's and modded-nanogpt's published exports, or a
directory scripts/prepare_data.py built; a missing one is refused with how to get it."""

from __future__ import annotations

import os
from pathlib import Path

from speedrun.core.data import (
    DatasetPaths,
    is_tiktoken,
    list_shards,
    list_sidecars,
    load_encoding,
)
from speedrun.data.bpb import warn_if_inexact
from speedrun.data.caseops import OPERATORS
from speedrun.data.layout import DataNotFoundError
from speedrun.data.shards import check_header
from speedrun.data.tokenizer import check_recorded_sha256, open_tokenizer
from speedrun.errors import DataError

# Published parameter-golf exports: vocab size -> (variant, Hugging Face dataset repo).
_PGOLF_VARIANTS = {
    512: ("sp512", None),
    1024: ("sp1024", None),
    2048: ("sp2048", None),
    4096: ("sp4096", None),
    8192: ("sp8192", "kevclark/parameter-golf"),  # not in the default repo; community export
}


def parameter_golf_help(vocab_size: int) -> str:
    """How to download parameter-golf's FineWeb shards for ``vocab_size`` and point speedrun at them."""
    variant, repo = _PGOLF_VARIANTS.get(vocab_size, ("sp1024", None))
    env = f"MATCHED_FINEWEB_REPO_ID={repo} " if repo else ""
    source = f"{repo}, a community export" if repo else "willdepueoai/parameter-golf"
    n = variant[2:]
    lines = [
        f"To use parameter-golf's published FineWeb shards ({variant}; Hugging Face dataset {source}):",
        "    git clone https://github.com/openai/parameter-golf && cd parameter-golf",
        f"    {env}python3 data/cached_challenge_fineweb.py --variant {variant} --train-shards 10",
        f"  which writes data/datasets/fineweb10B_{variant}/ (fineweb_train_*.bin, fineweb_val_*.bin; 100M tokens per",
        f"  train shard, the full val split always) and data/tokenizers/fineweb_{n}_bpe.model. Then set",
        f"    data.path=<parameter-golf>/data/datasets/fineweb10B_{variant} "
        f"data.tokenizer=<parameter-golf>/data/tokenizers/fineweb_{n}_bpe.model",
        "  or leave data.path unset to train on the embedded corpus (Python 3.11 docs).",
    ]
    if vocab_size not in _PGOLF_VARIANTS:
        lines.insert(
            0,
            f"(parameter-golf publishes no vocab {vocab_size} export; variants: "
            f"{', '.join(v for v, _ in _PGOLF_VARIANTS.values())}.)",
        )
    return "\n".join(lines)


CASEOPS_REPO = "romeerp/parameter-golf-caseops-v1"
"""The Hugging Face dataset of parameter-golf's CaseOps sp8192 export (the records' data since PR #1855)."""


def caseops_help() -> str:
    """How to download parameter-golf's CaseOps export to where data=fineweb_sp8192_caseops reads it."""
    return "\n".join(
        [
            f"To use parameter-golf's CaseOps FineWeb export (Hugging Face dataset {CASEOPS_REPO}, ~16 GB: 80 train "
            "shards, the 50,000-document val split and its byte sidecar):",
            '    python -c "from huggingface_hub import snapshot_download; snapshot_download('
            f"repo_id='{CASEOPS_REPO}', repo_type='dataset', local_dir='data/datasets/fineweb10B_sp8192_caseops')\"",
            "  which writes datasets/datasets/fineweb10B_sp8192_lossless_caps_caseops_v1_reserved/ (fineweb_train_*.bin,",
            "  fineweb_val_*.bin, fineweb_val_bytes_*.bin) and datasets/tokenizers/"
            "fineweb_8192_bpe_lossless_caps_caseops_v1_reserved.model",
            "  under it, the paths data=fineweb_sp8192_caseops names (from another directory: data.path=... "
            "data.tokenizer=...).",
            "  Or build CaseOps data from your own text: python scripts/prepare_data.py --caseops --input ... --out DIR",
        ]
    )


def prepared_help(path: Path, vocab_size: int) -> str:
    """One line: how to build a dataset directory that keeps its tokenizer inside (scripts/prepare_data.py's)."""
    return (
        f"build it with: python scripts/prepare_data.py --source python --out {path} --vocab {vocab_size} "
        "(this machine's Python sources and docs; or --input FILE... in place of --source python, for your own text)"
    )


def open_dataset(path: Path, tokenizer: Path | str, vocab_size: int) -> DatasetPaths:
    """An existing shard directory plus its tokenizer, checked: shards present with valid headers,
    tokenizer present with exactly ``vocab_size`` pieces."""
    if is_tiktoken(tokenizer):
        return _open_tiktoken_dataset(Path(path).expanduser(), str(tokenizer), vocab_size)
    path, tokenizer = Path(path).expanduser(), Path(tokenizer).expanduser()
    if os.path.abspath(tokenizer.parent) == os.path.abspath(path):
        # A directory that holds its own tokenizer is scripts/prepare_data.py's (parameter-golf keeps tokenizers
        # apart from the shards): name the command that builds it, on the same line.
        help_text = f"; {prepared_help(path, vocab_size)}"
    elif "caseops" in f"{path.name}/{tokenizer.name}".lower():  # the CaseOps export's names say so
        help_text = f"\n{caseops_help()}"
    else:
        help_text = f"\n{parameter_golf_help(vocab_size)}"
    if not path.is_dir():
        raise DataNotFoundError(f"dataset directory not found: {path}{help_text}")
    try:
        train, val = list_shards(path, "train"), list_shards(path, "val")
    except FileNotFoundError as e:
        raise DataNotFoundError(f"{e}{help_text}") from None
    if not tokenizer.is_file():
        raise DataNotFoundError(f"tokenizer not found: {tokenizer} (the SentencePiece .model of {path}){help_text}")
    if os.path.abspath(tokenizer.parent) == os.path.abspath(path):  # a prepared dir: dataset.json names its bytes
        check_recorded_sha256(tokenizer, path)
    sp = open_tokenizer(tokenizer)
    n = int(sp.get_piece_size())
    if n != vocab_size:
        raise DataError(
            f"tokenizer {tokenizer} has {n} pieces but the configured vocab_size is {vocab_size}; "
            f"use the tokenizer that made {path} and set the vocab size to {n} (or pick the matching variant)"
        )
    warn_if_inexact(sp)
    sidecars = list_sidecars(path)  # CaseOps data's val bytes
    for shard in train + val + sidecars:
        check_header(shard)  # cheap: magic, version, size; token ids are checked as batches are read
    paths = DatasetPaths(train=train, val=val, tokenizer=tokenizer, vocab_size=vocab_size, val_bytes=sidecars)
    check_sidecars(paths, sp)
    return paths


def check_sidecars(paths: DatasetPaths, sp=None) -> None:
    """Each val shard has the byte sidecar of its index, as long as it (DataError otherwise). With ``sp`` (the
    SentencePiece tokenizer), data whose tokenizer reserves the CaseOps operators must have a sidecar: counted from
    the pieces, an operator's 3 bytes stand for none of the original text."""
    sidecars = paths.val_bytes
    if not sidecars:
        if sp is not None and all(sp.piece_to_id(op) != sp.unk_id() for op in OPERATORS):
            raise DataError(
                f"{paths.tokenizer} reserves the CaseOps case operators but {paths.val[0].parent} has no byte sidecar "
                "(fineweb_val_bytes_*.bin): val_bpb would count the operators' bytes; download the export with its "
                "sidecar, or build the data with scripts/prepare_data.py --caseops"
            )
        return
    if len(sidecars) != len(paths.val):
        raise DataError(
            f"{paths.val[0].parent}: {len(sidecars)} byte sidecar(s) (fineweb_val_bytes_*.bin) for {len(paths.val)} "
            "val shard(s); each val shard needs the sidecar of its index (rebuild or re-download the split whole)"
        )
    for shard, sidecar in zip(paths.val, sidecars):
        if check_header(sidecar) != check_header(shard):
            raise DataError(
                f"{sidecar} holds {check_header(sidecar)} byte counts but {shard.name} {check_header(shard)} tokens; "
                "the sidecar belongs to other shards (rebuild or re-download the val split whole)"
            )


MODDED_NANOGPT_HELP = (
    "To get modded-nanogpt's GPT-2-tokenized FineWeb shards (fineweb_train_%06d.bin, fineweb_val_%06d.bin):\n"
    "    git clone https://github.com/KellerJordan/modded-nanogpt && cd modded-nanogpt\n"
    "    python data/cached_fineweb10B.py 8     # the val shard and 8 train shards of 100M tokens\n"
    "  which writes data/fineweb10B/. Then set data=fineweb10B_gpt2 data.path=<modded-nanogpt>/data/fineweb10B,\n"
    "  or tokenize your own text: python scripts/prepare_data.py --tokenizer gpt2 --input ... --out DIR"
)


def _open_tiktoken_dataset(path: Path, tokenizer: str, vocab_size: int) -> DatasetPaths:
    """Shards tokenized with a tiktoken vocabulary (GPT-2): shards checked, vocabulary size matched."""
    if not path.is_dir():
        raise DataNotFoundError(f"dataset directory not found: {path}\n{MODDED_NANOGPT_HELP}")
    try:
        train, val = list_shards(path, "train"), list_shards(path, "val")
    except FileNotFoundError as e:
        raise DataNotFoundError(f"{e}\n{MODDED_NANOGPT_HELP}") from None
    n = int(load_encoding(tokenizer).n_vocab)
    if n != vocab_size:
        raise DataError(
            f"tokenizer {tokenizer} has {n} tokens but the configured vocab_size is {vocab_size}; "
            f"set data.vocab_size={n}"
        )
    for shard in train + val:
        check_header(shard)
    return DatasetPaths(train=train, val=val, tokenizer=Path(tokenizer), vocab_size=vocab_size)
