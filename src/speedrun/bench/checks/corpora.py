"""The corpora checks train on, beside the embedded one (speedrun.bench.spec.EMBEDDED)."""

from __future__ import annotations

from speedrun.bench.spec import Corpus

PYTHON_SP1024 = Corpus(
    data="python_sp1024",
    path="data/python_sp1024",
    tokenizer="data/python_sp1024/tokenizer.model",
    vocab_size=1024,
    prepare=(
        "python",
        "scripts/prepare_data.py",
        "--source",
        "python",
        "--out",
        "data/python_sp1024",
        "--vocab",
        "1024",
        "--overwrite",
    ),
)
"""The Python installation's own sources and documentation (conf/data/python_sp1024.yaml: about 116-178 M training
tokens at vocabulary 1024, by what is installed), built on the machine that runs the check in under a minute: big
enough that minutes of training on a GPU do not repeat it, so quality figures mean something. Each machine's Python
differs: the result records the build's fingerprint, and two results compare only on one fingerprint."""

PYTHON_SP1024_CASEOPS = Corpus(
    data="python_sp1024_caseops",
    path="data/python_sp1024_caseops",
    tokenizer="data/python_sp1024_caseops/tokenizer.model",
    vocab_size=1024,
    prepare=(
        "python",
        "scripts/prepare_data.py",
        "--source",
        "python",
        "--caseops",
        "--out",
        "data/python_sp1024_caseops",
        "--vocab",
        "1024",
        "--overwrite",
    ),
)
"""PYTHON_SP1024 written in CaseOps (conf/data/python_sp1024_caseops.yaml), with its val byte sidecar: the records'
CaseOps recipes on text every machine has, their val_bpb counted on the original bytes."""

FINEWEB_LENGTHS_SP8192 = Corpus(
    data="embedded",
    path="data/bench/pydoc_fwlen_sp8192",
    tokenizer="data/bench/pydoc_fwlen_sp8192/tokenizer.model",
    vocab_size=8192,
    prepare=(
        "python",
        "scripts/prepare_data.py",
        "--input",
        "src/speedrun/data/assets/pydoc311.jsonl.xz",
        "--out",
        "data/bench/pydoc_fwlen_sp8192",
        "--doc-chars-lognormal",
        "2500",
        "1.0",
        "--val-every",
        "3",
        "--vocab-size",
        "8192",
        "--overwrite",
    ),
)
"""The embedded corpus cut into documents of FineWeb's lengths at pgolf_record's vocabulary of 8192 (1,052
validation documents, median 556 and mean 925 tokens, against FineWeb's 567 and 944): test-time training's cost per
token depends on document lengths, and the embedded corpus's own documents are ten times longer."""

GPT2_PYDOC = Corpus(
    data="fineweb10B_gpt2",
    path="data/bench/pydoc_gpt2",
    tokenizer=".tiktoken/r50k_base.tiktoken",
    vocab_size=50257,
    prepare=(
        "python",
        "scripts/prepare_data.py",
        "--input",
        "src/speedrun/data/assets/pydoc311.jsonl.xz",
        "--tokenizer",
        ".tiktoken/r50k_base.tiktoken",
        "--out",
        "data/bench/pydoc_gpt2",
        "--overwrite",
    ),
    inputs=(".tiktoken/r50k_base.tiktoken",),
    how=(
        "put GPT-2's vocabulary at .tiktoken/r50k_base.tiktoken (sha256 306cd27f...d930; tiktoken's r50k_base "
        "file) and pip install 'speedrun[gpt2]'"
    ),
)
"""The embedded corpus's documents tokenized with GPT-2's vocabulary (3.33 M train and 220,733 val tokens), for
modded-nanogpt's 124M track on a machine without its FineWeb shards."""
