"""scripts/prepare_data.py --caseops --val-docs: the records' CaseOps layout (token shards plus each val shard's byte
sidecar fineweb_val_bytes_*.bin), how a run opens and checks it, and the removal of killed builds' temporaries."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from speedrun.core.data import (
    HEADER_BYTES,
    SHARD_MAGIC,
    load_tokenizer,
    load_val_bytes,
    load_val_tokens,
    read_header,
    read_shard,
    sidecar_name,
)
from speedrun.data import caseops
from speedrun.data.corpus import load_embedded_documents
from speedrun.data.existing import check_sidecars, open_dataset
from speedrun.data.prepare import prepare_dataset
from speedrun.data.shards import write_shard
from speedrun.data.staging import DEAD_BUILD_GRACE_S
from speedrun.errors import DataError

REPO = Path(__file__).resolve().parents[2]
VAL_DOCS = 4


def _cli():
    spec = importlib.util.spec_from_file_location("prepare_data_cli", REPO / "scripts" / "prepare_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def docs():
    """24 documents with capitals, a literal operator and multi-byte characters: every case the sidecar counts."""
    base = [d[:2500] for d in load_embedded_documents()[:22]]
    return [*base, f"ALL CAPS, TitleCase, iPhone and a literal {caseops.TITLE} é😀", "ĄĘ NASA x86_64"]


@pytest.fixture(scope="module")
def built(docs, tmp_path_factory):
    """The CLI's CaseOps build of ``docs`` (first VAL_DOCS documents in val), with shards small enough that the
    val split spans several, so that sidecars and shards must line up one by one."""
    tmp = tmp_path_factory.mktemp("caseops")
    source = tmp / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    out = tmp / "ds"
    argv = ["--input", str(source), "--out", str(out), "--caseops", "--val-docs", str(VAL_DOCS)]
    assert _cli().main([*argv, "--vocab-size", "512", "--shard-tokens", "1500"]) == 0
    return out


def test_the_layout_is_the_records(built, docs):
    paths = open_dataset(built, built / "tokenizer.model", 512)
    assert len(paths.val) >= 2 and [p.name for p in paths.val_bytes] == [sidecar_name(i) for i in range(len(paths.val))]
    for shard, sidecar in zip(paths.val, paths.val_bytes, strict=True):
        header = np.fromfile(sidecar, dtype="<i4", count=256)  # the token shards' 256-int32 header
        assert header[0] == SHARD_MAGIC and header[1] == 1 and header[2] == read_header(shard)
        assert sidecar.stat().st_size == HEADER_BYTES + 2 * read_header(shard)  # a uint16 payload
    info = json.loads((built / "dataset.json").read_text())
    assert info["text_transform"] == "lossless_caps_caseops_v1" and info["val_docs"] == VAL_DOCS
    original = sum(len(d.encode("utf-8")) for d in docs[:VAL_DOCS])
    assert info["val"]["bytes"] == info["val"]["bytes_original_text"] == original
    assert info["val"]["documents"] == VAL_DOCS and info["train"]["documents"] == len(docs) - VAL_DOCS


def test_val_is_the_first_documents_in_caseops_and_the_sidecar_counts_their_bytes(built, docs):
    paths = open_dataset(built, built / "tokenizer.model", 512)
    sp = load_tokenizer(paths.tokenizer)
    assert all(sp.piece_to_id(op) != sp.unk_id() for op in caseops.OPERATORS)
    stream = np.concatenate([np.asarray(read_shard(p)) for p in paths.val]).astype(np.int64)
    counts = np.concatenate([np.asarray(read_shard(p)) for p in paths.val_bytes]).astype(np.int64)
    starts = np.flatnonzero(stream == sp.bos_id()).tolist()
    assert len(starts) == VAL_DOCS and (counts[starts] == 0).all()  # BOS counts no byte
    for doc, a, b in zip(docs[:VAL_DOCS], starts, [*starts[1:], stream.size], strict=True):
        assert caseops.decode(sp.decode(stream[a + 1 : b].tolist())) == doc
        assert int(counts[a:b].sum()) == len(doc.encode("utf-8"))
    # the last val document holds capitals, an escaped operator and 4-byte characters; the train shards hold the rest
    train = np.concatenate([np.asarray(read_shard(p)) for p in paths.train]).astype(np.int64)
    assert (train == sp.bos_id()).sum() == len(docs) - VAL_DOCS


def test_load_val_bytes_reads_a_prefix_and_other_shards_sidecars_are_refused(built, tmp_path):
    paths = open_dataset(built, built / "tokenizer.model", 512)
    sp = load_tokenizer(paths.tokenizer)
    tokens = load_val_tokens(paths.val, 2000, 64, include_tail=True)
    sidecar = load_val_bytes(paths, tokens.numel())
    assert sidecar is not None and sidecar.dtype == torch.int32 and sidecar.numel() == 2000
    whole = np.concatenate([np.asarray(read_shard(p)) for p in paths.val_bytes])
    assert sidecar.tolist() == whole[:2000].tolist()
    check_sidecars(paths, sp)
    with pytest.raises(DataError, match="1 byte sidecar"):
        check_sidecars(dataclasses.replace(paths, val_bytes=paths.val_bytes[:1]))
    short = tmp_path / sidecar_name(0)
    write_shard(short, np.zeros(3, dtype=np.uint16))
    with pytest.raises(DataError, match="holds 3 byte counts"):
        check_sidecars(dataclasses.replace(paths, val_bytes=[short, *paths.val_bytes[1:]]))


def test_a_caseops_tokenizer_without_its_sidecar_is_refused(built, tmp_path):
    copy = tmp_path / "no_sidecar"
    shutil.copytree(built, copy)
    for sidecar in copy.glob("fineweb_val_bytes_*.bin"):
        sidecar.unlink()
    with pytest.raises(DataError, match="reserves the CaseOps case operators .* no byte sidecar"):
        open_dataset(copy, copy / "tokenizer.model", 512)


def test_val_docs_needs_a_train_document_and_excludes_val_every(tmp_path, capsys):
    source = tmp_path / "d.jsonl"
    source.write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    cli = _cli()
    with pytest.raises(SystemExit):
        cli.main(["--input", str(source), "--out", str(tmp_path / "o"), "--val-docs", "2"])
    assert "--val-docs 2: must be between 1 and the 2 documents read less one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--input", str(source), "--out", str(tmp_path / "o"), "--val-docs", "1", "--val-every", "2"])
    assert "not allowed with argument" in capsys.readouterr().err


def _age(path: Path) -> None:
    old = time.time() - DEAD_BUILD_GRACE_S - 5
    os.utime(path, (old, old))


def test_a_killed_builds_temporary_directory_is_removed_by_the_next_build(docs, tmp_path):
    out = tmp_path / "ds"
    killed = tmp_path / f".{out.name}.tmp-1-killed"
    running = tmp_path / f".{out.name}.tmp-2-running"
    young = tmp_path / f".{out.name}.tmp-3-young"
    other = tmp_path / ".other.tmp-4-killed"
    for d in (killed, running, young, other):
        d.mkdir()
        (d / "fineweb_train_000000.bin").write_bytes(b"half written")
    # a build that holds its directory's lock, as a running prepare does; SIGKILL it: the kernel drops the lock
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True); time.sleep(120)",
            str(running),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        for d in (killed, running, other):
            _age(d)
        prepare_dataset(docs[1:8], docs[:1], out, 512, shard_tokens=5000)
        # the dead build's directory went; the live one's, one too young to judge and another dataset's stayed
        assert not killed.exists() and running.exists() and young.exists() and other.exists()
        holder.kill()
        holder.wait(timeout=30)
        _age(running)
        prepare_dataset(docs[1:8], docs[:1], out, 512, shard_tokens=5000, overwrite=True)
        assert not running.exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)
        holder.stdout.close()


def test_data_fineweb_sp8192_caseops_reads_the_hugging_face_export_as_it_lands(compose, built, tmp_path):
    """conf/data/fineweb_sp8192_caseops.yaml names the paths a snapshot of romeerp/parameter-golf-caseops-v1 into
    data/datasets/fineweb10B_sp8192_caseops has (the records' prep and READMEs): shards, sidecars and tokenizer
    placed there open with their sidecar. Without the data, the refusal says how to download it."""
    data = compose(["data=fineweb_sp8192_caseops"]).data
    assert (data.name, data.vocab_size) == ("fineweb_sp8192_caseops", 8192)
    root = "data/datasets/fineweb10B_sp8192_caseops/datasets"
    assert data.path == f"{root}/datasets/fineweb10B_sp8192_lossless_caps_caseops_v1_reserved"
    assert data.tokenizer == f"{root}/tokenizers/fineweb_8192_bpe_lossless_caps_caseops_v1_reserved.model"
    with pytest.raises(DataError, match="romeerp/parameter-golf-caseops-v1"):
        open_dataset(tmp_path / data.path, tmp_path / data.tokenizer, data.vocab_size)
    shutil.copytree(built, tmp_path / data.path, ignore=shutil.ignore_patterns("tokenizer.*", "dataset.json"))
    (tmp_path / data.tokenizer).parent.mkdir(parents=True)
    shutil.copy(built / "tokenizer.model", tmp_path / data.tokenizer)
    paths = open_dataset(tmp_path / data.path, tmp_path / data.tokenizer, 512)  # the tiny build's vocabulary
    assert len(paths.val_bytes) == len(paths.val) >= 2
    assert load_val_bytes(paths, 100) is not None


def test_data_python_sp1024_caseops_is_the_python_corpus_built_with_caseops(compose):
    data = compose(["data=python_sp1024_caseops"]).data
    assert (data.name, data.path, data.vocab_size) == ("python_sp1024_caseops", "data/python_sp1024_caseops", 1024)
    assert data.tokenizer == "data/python_sp1024_caseops/tokenizer.model"  # the build keeps its tokenizer inside
    help_line = _cli().build_parser().format_help()
    assert "--caseops" in help_line and "--val-docs" in help_line


def test_a_given_caseops_tokenizer_encodes_the_same_shards_and_sidecars(built, docs, tmp_path, capsys):
    """--tokenizer PATH.model encodes with an existing model (the records' CaseOps tokenizer, say) and trains
    nothing: with the model the first build trained, the val shards and sidecars come out byte for byte the same."""
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    model = tmp_path / "given.model"
    shutil.copy(built / "tokenizer.model", model)
    out = tmp_path / "again"
    argv = ["--input", str(source), "--out", str(out), "--caseops", "--val-docs", str(VAL_DOCS), "--tokenizer"]
    assert _cli().main([*argv, str(model), "--shard-tokens", "1500"]) == 0
    for name in ["tokenizer.model", *(p.name for p in built.glob("fineweb_val*.bin"))]:
        assert (out / name).read_bytes() == (built / name).read_bytes(), name
    assert json.loads((out / "dataset.json").read_text())["tokenizer_settings"] == {"given": str(model)}
    # a model without the operators as pieces would count them as 3 bytes of text: refused before any work
    plain = tmp_path / "plain"
    prepare_dataset(docs[4:], docs[:4], plain, 512, shard_tokens=5000)
    with pytest.raises(SystemExit):
        _cli().main([*argv, str(plain / "tokenizer.model"), "--out", str(tmp_path / "refused")])
    assert "does not reserve the CaseOps operators" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()
