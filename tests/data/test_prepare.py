"""Dataset preparation, the embedded dataset cache, opening existing shards, the loader, the CLI."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch

from speedrun.core.data import ShardError, TokenStream, load_val_tokens, read_shard
from speedrun.data import encoding as encoding_mod
from speedrun.data.corpus import (
    cut_at_paragraphs,
    iter_documents,
    load_embedded_documents,
    lognormal_caps,
    split_train_val,
)
from speedrun.data.existing import open_dataset
from speedrun.data.prepare import (
    DataNotFoundError,
    ensure_embedded_dataset,
    prepare_dataset,
    read_dataset_info,
)
from speedrun.data.shards import write_shard
from speedrun.data.tokenizer import train_tokenizer

REPO = Path(__file__).resolve().parents[2]
VOCAB = 512


@pytest.fixture(scope="module")
def docs():
    """12 small documents (the first 3000 characters of embedded-corpus documents)."""
    return [d[:3000] for d in load_embedded_documents()[:12]]


@pytest.fixture(scope="module")
def prepared(docs, tmp_path_factory):
    train, val = split_train_val(docs, 4)  # val: docs 0, 4, 8
    out = tmp_path_factory.mktemp("prep") / "mini"
    return prepare_dataset(train, val, out, VOCAB, shard_tokens=1000), train, val


def _stream(paths):
    return np.concatenate([np.asarray(read_shard(p)) for p in paths]).astype(np.int64)


def test_prepare_writes_tokenizer_and_shards(prepared):
    paths, train, val = prepared
    d = paths.directory
    assert paths.tokenizer == d / "tokenizer.model" and paths.vocab_size == VOCAB
    assert [p.name for p in paths.train[:2]] == ["fineweb_train_000000.bin", "fineweb_train_000001.bin"]
    assert len(paths.train) > 5 and len(paths.val) >= 2  # 1000-token shards; documents span shards
    assert all(read_shard(p).size == 1000 for p in paths.train[:-1])
    sp = spm.SentencePieceProcessor(model_file=str(paths.tokenizer))
    assert sp.get_piece_size() == VOCAB
    for split_paths, split_docs in ((paths.train, train), (paths.val, val)):
        expected = [t for ids in sp.encode(split_docs) for t in [sp.bos_id(), *ids]]
        assert _stream(split_paths).tolist() == expected  # [BOS] + ids per document, in order
    info = read_dataset_info(d)
    assert info["train"] == {"documents": len(train), "tokens": len(_stream(paths.train)), "shards": len(paths.train)}
    assert info["val"]["bytes"] == info["val"]["bytes_original_text"] == sum(len(t.encode()) for t in val)
    assert 0 < info["unigram_val_bpb"] < 8
    assert not [p for p in d.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_prepare_refuses_existing_dir_and_overwrites_on_request(prepared, docs, tmp_path):
    paths, _, _ = prepared
    with pytest.raises(FileExistsError, match="overwrite"):
        prepare_dataset(docs[1:], docs[:1], paths.directory, VOCAB)
    out = tmp_path / "ds"
    prepare_dataset(docs[1:], docs[:1], out, VOCAB)
    again = prepare_dataset(docs[2:], docs[:2], out, VOCAB, overwrite=True)
    assert read_dataset_info(out)["val"]["documents"] == 2 and again.directory == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_killed_build_leaves_nothing(docs, tmp_path, monkeypatch):
    calls = []

    def failing_write(path, tokens):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if the process were interrupted mid-build
        write_shard(path, tokens)

    monkeypatch.setattr(encoding_mod, "write_shard", failing_write)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(docs[1:], docs[:1], tmp_path / "ds", VOCAB, shard_tokens=1000)
    assert list(tmp_path.iterdir()) == []


def test_prepare_rejects_empty_splits_and_bad_vocab(docs, tmp_path):
    with pytest.raises(ValueError, match="at least one train and one val"):
        prepare_dataset(docs, [], tmp_path / "a", VOCAB)
    with pytest.raises(ValueError, match="too small"):
        prepare_dataset(docs[1:], docs[:1], tmp_path / "b", 280)
    assert list(tmp_path.iterdir()) == []


def test_builds_are_byte_identical(docs, tmp_path):
    a = prepare_dataset(docs[1:], docs[:1], tmp_path / "a", VOCAB, shard_tokens=5000)
    b = prepare_dataset(docs[1:], docs[:1], tmp_path / "b", VOCAB, shard_tokens=5000, num_threads=1)
    files = sorted(p.name for p in a.directory.iterdir())
    assert files == sorted(p.name for p in b.directory.iterdir())
    for name in files:
        if name != "dataset.json":
            assert (a.directory / name).read_bytes() == (b.directory / name).read_bytes(), name
    other = train_tokenizer(docs[1:], tmp_path / "c" / "tok", VOCAB, seed=0, num_threads=1)
    sp_a, sp_c = (spm.SentencePieceProcessor(model_file=str(p)) for p in (a.tokenizer, other))
    assert [sp_a.id_to_piece(i) for i in range(VOCAB)] == [sp_c.id_to_piece(i) for i in range(VOCAB)]


def test_worker_processes_write_the_same_shards(docs, tmp_path, monkeypatch):
    """processes=2 (a large corpus's path): the same bytes as in-process encoding, the documents in order across
    several pool tasks; a callable info sees the record; tokenizer_texts trains the tokenizer on other text."""
    monkeypatch.setattr(encoding_mod, "POOL_TASK_CHARS", 5000)  # 11 documents of 3000 characters: 6 tasks
    a = prepare_dataset(docs[1:], docs[:1], tmp_path / "a", VOCAB, shard_tokens=5000)
    seen = []
    b = prepare_dataset(
        docs[1:],
        docs[:1],
        tmp_path / "b",
        VOCAB,
        shard_tokens=5000,
        processes=2,
        info=lambda record: seen.append(record) or {"extra": record["tokenizer_sha256"]},
    )
    files = sorted(p.name for p in a.directory.iterdir())
    assert files == sorted(p.name for p in b.directory.iterdir()) and len(b.train) > 2
    for name in files:
        if name != "dataset.json":
            assert (a.directory / name).read_bytes() == (b.directory / name).read_bytes(), name
    info = read_dataset_info(b.directory)
    assert info["extra"] == info["tokenizer_sha256"] == hashlib.sha256(b.tokenizer.read_bytes()).hexdigest()
    assert seen[0]["train"]["tokens"] == info["train"]["tokens"]
    c = prepare_dataset(docs[1:], docs[:1], tmp_path / "c", VOCAB, tokenizer_texts=docs[6:], tokenizer_chars=9000)
    assert read_dataset_info(c.directory)["tokenizer_sha256"] != info["tokenizer_sha256"]


# --- loader ----------------------------------------------------------------------------------


def test_token_stream_batches_shift_and_wrap(prepared):
    paths = prepared[0]
    stream = _stream(paths.train)
    B, T = 4, 16
    ts = TokenStream(paths.train, seq_len=T, batch_size=B, vocab_size=VOCAB)
    assert ts.total_tokens == stream.size
    steps = stream.size // (B * T) + 3  # past the end: wraps to the first shard
    for k, (x, y) in zip(range(steps), ts):
        assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(x.flatten()[1:], y.flatten()[:-1])
        want = np.take(stream, np.arange(k * B * T, k * B * T + B * T + 1), mode="wrap")
        assert x.flatten().tolist() == want[:-1].tolist() and y.flatten().tolist() == want[1:].tolist()
    again = TokenStream(paths.train, seq_len=T, batch_size=B)
    assert torch.equal(next(iter(again))[0], next(iter(TokenStream(paths.train, T, B)))[0])  # deterministic


def test_token_stream_ranks_take_disjoint_slices(prepared):
    paths = prepared[0]
    stream = _stream(paths.train)
    B, T, W = 2, 8, 3
    ranks = [TokenStream(paths.train, T, B, rank=r, world_size=W) for r in range(W)]
    for step in range(5):
        for r, ts in enumerate(ranks):
            x, y = ts.next_batch()
            start = step * W * B * T + r * B * T
            assert x.flatten().tolist() == stream[start : start + B * T].tolist()
            assert y.flatten().tolist() == stream[start + 1 : start + B * T + 1].tolist()


def test_token_stream_resume_and_errors(prepared):
    paths = prepared[0]
    ts = TokenStream(paths.train, 16, 2)
    for _ in range(3):
        ts.next_batch()
    resumed = TokenStream(paths.train, 16, 2)
    resumed.load_state_dict(ts.state_dict())
    assert torch.equal(ts.next_batch()[0], resumed.next_batch()[0])
    with pytest.raises(ShardError, match="fineweb_train_000000.bin.*>= vocab_size 100"):
        TokenStream(paths.train, 16, 2, vocab_size=100).next_batch()
    with pytest.raises(ValueError, match="one step needs"):
        TokenStream(paths.train, 4096, 64)
    with pytest.raises(ValueError, match="rank"):
        TokenStream(paths.train, 16, 2, rank=2, world_size=2)


def test_load_val_tokens(prepared):
    paths = prepared[0]
    stream = _stream(paths.val)
    T = 16
    val = load_val_tokens(paths.val, None, T)
    assert val.dtype == torch.int64 and val.ndim == 1
    assert val.numel() == (stream.size - 1) // T * T + 1 and val.tolist() == stream[: val.numel()].tolist()
    assert load_val_tokens(paths.val, 100, T).tolist() == stream[:97].tolist()  # 6 windows of 16, + 1
    assert load_val_tokens(paths.val, 1500, T, vocab_size=VOCAB).numel() == 1489  # spans two shards
    with pytest.raises(ValueError, match="need at least seq_len"):
        load_val_tokens(paths.val, 10, T)
    with pytest.raises(ShardError, match="vocab_size 10"):
        load_val_tokens(paths.val, None, T, vocab_size=10)


# --- opening existing shard directories ------------------------------------------------------


def test_open_dataset_missing_paths_explain_how_to_get_data(tmp_path, prepared):
    missing = tmp_path / "data" / "datasets" / "fineweb10B_sp1024"
    with pytest.raises(DataNotFoundError) as err:
        open_dataset(missing, tmp_path / "data/tokenizers/fineweb_1024_bpe.model", 1024)
    msg = str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    assert str(missing) in msg
    assert "python3 data/cached_challenge_fineweb.py --variant sp1024" in msg
    assert "willdepueoai/parameter-golf" in msg and "fineweb_1024_bpe.model" in msg
    assert "data.path=" in msg and "data.tokenizer=" in msg
    assert "--variant sp8192" in str(pytest.raises(DataNotFoundError, open_dataset, missing, missing, 8192).value)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataNotFoundError, match="fineweb_train_%06d.bin"):
        open_dataset(empty, tmp_path / "tok.model", 1024)
    paths = prepared[0]
    with pytest.raises(DataNotFoundError, match="tokenizer not found"):
        open_dataset(paths.directory, tmp_path / "tok.model", VOCAB)
    # a directory that keeps its tokenizer inside is scripts/prepare_data.py's: one line naming the command
    with pytest.raises(DataNotFoundError) as err:
        open_dataset(tmp_path / "mine", tmp_path / "mine" / "tokenizer.model", 1024)
    assert str(err.value) == (
        f"dataset directory not found: {tmp_path / 'mine'}; build it with: python scripts/prepare_data.py "
        f"--source python --out {tmp_path / 'mine'} --vocab 1024 (this machine's Python sources and docs; or "
        "--input FILE... in place of --source python, for your own text)"
    )


def test_open_dataset_checks_vocab_and_shards(prepared, tmp_path):
    paths = prepared[0]
    opened = open_dataset(paths.directory, paths.tokenizer, VOCAB)
    assert opened == paths
    with pytest.raises(ValueError, match=f"has {VOCAB} pieces but the configured vocab_size is 1024"):
        open_dataset(paths.directory, paths.tokenizer, 1024)
    bad = tmp_path / "bad"
    bad.mkdir()
    write_shard(bad / "fineweb_train_000000.bin", np.arange(10))
    write_shard(bad / "fineweb_val_000000.bin", np.arange(10))
    (bad / "fineweb_val_000000.bin").write_bytes((bad / "fineweb_val_000000.bin").read_bytes()[:-2])
    with pytest.raises(ShardError, match="fineweb_val_000000.bin"):
        open_dataset(bad, paths.tokenizer, VOCAB)


# --- the embedded dataset ---------------------------------------------------------------------


def test_ensure_embedded_dataset_builds_once_under_concurrency(tmp_path):
    cache = tmp_path / "cache"
    code = (
        "import sys; from speedrun.data import ensure_embedded_dataset as e; "
        "p = e(sys.argv[1], 1024); print(p.tokenizer, len(p.train), len(p.val))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert outs[0][0] == outs[1][0]
    assert sum("building the embedded dataset" in o[1] for o in outs) == 1  # the other waited and reused it

    target = cache / "embedded_pydoc311_sp1024"
    mtime = (target / "tokenizer.model").stat().st_mtime_ns
    paths = ensure_embedded_dataset(cache, 1024)  # reuse: no rebuild
    assert (target / "tokenizer.model").stat().st_mtime_ns == mtime
    assert paths.directory == target and paths.vocab_size == 1024
    info = read_dataset_info(target)
    assert info["train"]["tokens"] > 3_000_000 and info["val"]["tokens"] > 100_000
    assert info["val"]["bytes"] == info["val"]["bytes_original_text"]
    assert sorted(p.name for p in cache.iterdir()) == [".embedded_pydoc311_sp1024.lock", "embedded_pydoc311_sp1024"]

    # a cache built from another corpus version is rebuilt
    info["corpus_sha256"] = "0" * 64
    (target / "dataset.json").write_text(json.dumps(info))
    ensure_embedded_dataset(cache, 1024)
    assert read_dataset_info(target)["corpus_sha256"] != "0" * 64


# --- corpus readers and the CLI ---------------------------------------------------------------


def test_iter_documents_formats(tmp_path):
    import gzip
    import lzma

    lines = "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(["one\r\n", "two\n\nlines"]))
    (tmp_path / "a.jsonl").write_text(lines + "\n", encoding="utf-8")
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    (tmp_path / "a.jsonl.xz").write_bytes(lzma.compress(lines.encode()))
    (tmp_path / "b.txt").write_bytes("whole\r\nfile \u00e9\n".encode())
    for name in ("a.jsonl", "a.jsonl.gz", "a.jsonl.xz"):
        assert list(iter_documents(tmp_path / name)) == ["one\r\n", "two\n\nlines"]
    assert list(iter_documents(tmp_path / "b.txt")) == ["whole\r\nfile \u00e9\n"]
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object with a string field 'text'"):
        list(iter_documents(tmp_path / "bad.jsonl"))
    with pytest.raises(ValueError, match="unsupported"):
        list(iter_documents(tmp_path / "x.parquet"))
    with pytest.raises(FileNotFoundError):
        list(iter_documents(tmp_path / "missing.txt"))


def test_split_train_val():
    docs = [str(i) for i in range(45)]
    train, val = split_train_val(docs, 20)
    assert val == ["0", "20", "40"] and len(train) == 42 and set(train) | set(val) == set(docs)
    assert split_train_val(["only"], 20) == ([], ["only"])
    with pytest.raises(ValueError):
        split_train_val(docs, 1)


def test_cut_at_paragraphs_gives_the_document_back_in_whole_paragraphs():
    doc = "a" * 5 + "\n\n" + "b" * 3 + "\n\n\n" + "c" * 20 + "\n\n" + "d" * 4 + "\n\n" + "e"
    pieces = cut_at_paragraphs(doc, 13)
    assert "".join(pieces) == doc
    # whole paragraphs with their blank lines; the 22-character one is a piece alone; none mixes across it
    assert pieces == ["aaaaa\n\nbbb\n\n\n", "c" * 20 + "\n\n", "dddd\n\ne"]
    assert all(len(p) <= 13 for p in pieces if "c" not in p)
    assert cut_at_paragraphs("one paragraph", 100) == ["one paragraph"]
    # Windows line ends and blank lines holding spaces are breaks too; the next paragraph keeps its indentation
    assert cut_at_paragraphs("aaaaa\r\n\r\nbbbbb\r\n \r\nccccc", 8) == ["aaaaa\r\n\r\n", "bbbbb\r\n \r\n", "ccccc"]
    assert cut_at_paragraphs("x\n\t\n    code\n\ny", 9) == ["x\n\t\n", "    code\n\n", "y"]
    # blank lines leading a document never make a document of their own
    assert cut_at_paragraphs("\n\n" + "b" * 20 + "\n\nc", 10) == ["\n\n" + "b" * 20 + "\n\n", "c"]
    assert cut_at_paragraphs("", 10) == []
    with pytest.raises(ValueError, match="max_chars"):
        cut_at_paragraphs(doc, 0)


def test_cut_at_paragraphs_with_a_cap_drawn_per_piece():
    """A callable cap: drawn once as each piece is started, and that piece keeps within it (unless it is one
    over-long paragraph); the pieces still give the document back."""
    rng = random.Random(1)
    paras = ["p" * rng.randint(1, 60) for _ in range(300)]
    doc = "\n\n" + "\n\n".join(paras) + "\r\n \r\ntail"
    caps: list[int] = []

    def next_cap() -> int:
        caps.append(rng.choice([1, 5, 40, 90, 200, 700]))
        return caps[-1]

    pieces = cut_at_paragraphs(doc, next_cap)
    assert "".join(pieces) == doc and len(pieces) == len(caps) > 20
    for piece, cap in zip(pieces, caps):
        assert len(piece) <= cap or len(piece.strip().split("\n\n")) == 1  # a single paragraph over its cap
    assert pieces[0].startswith("\n\np")  # leading blank lines join what follows
    # a cap drawn for a piece holds for it alone: 10 then 100 gives 2 pieces, the second with 3 paragraphs
    draws = iter([10, 100])
    assert cut_at_paragraphs("aaaa\n\nbbbbbbbb\n\ncc\n\nd", lambda: next(draws)) == [
        "aaaa\n\n",
        "bbbbbbbb\n\ncc\n\nd",
    ]
    assert cut_at_paragraphs("", lambda: 0) == []  # no piece, no draw
    with pytest.raises(ValueError, match="int >= 1"):
        cut_at_paragraphs("a\n\nb", lambda: 0)


def _many_short_paragraphs() -> str:
    rng = random.Random(0)
    return "\n\n".join("".join(rng.choice("abcdefgh ") for _ in range(rng.randint(20, 80))) for _ in range(20_000))


def test_doc_chars_lognormal_gives_heavy_tailed_lengths():
    """--doc-chars-lognormal MEDIAN SIGMA: pieces of median about MEDIAN; SIGMA 1.0 a heavy tail (mean/median about
    exp(0.5) = 1.65, FineWeb's is ~944/567 = 1.66), SIGMA 0 all near MEDIAN."""
    cli = _load_cli()
    doc = _many_short_paragraphs()
    for sigma, low, high in ((1.0, 1.4, 2.0), (0.0, 0.95, 1.05)):
        pieces = cli._cut_lognormal([doc], 1000, sigma, "0/val")
        lengths = np.array([len(p) for p in pieces])
        assert "".join(pieces) == doc
        assert abs(np.median(lengths) / 1000 - 1) < 0.15, (sigma, np.median(lengths))
        assert low < lengths.mean() / np.median(lengths) < high, (sigma, lengths.mean() / np.median(lengths))
    with pytest.raises(ValueError, match="median"):
        lognormal_caps(0, 1.0, random.Random(0))
    with pytest.raises(ValueError, match="sigma"):
        lognormal_caps(1000, -0.1, random.Random(0))
    assert {lognormal_caps(0.2, 0.0, random.Random(0))() for _ in range(3)} == {1}  # rounded, at least 1


def test_doc_chars_lognormal_is_seeded():
    cli = _load_cli()
    docs = [_many_short_paragraphs()[:50_000]] * 2
    same = cli._cut_lognormal(docs, 800, 1.0, "0/train")
    assert cli._cut_lognormal(docs, 800, 1.0, "0/train") == same
    assert cli._cut_lognormal(docs, 800, 1.0, "1/train") != same
    assert cli._cut_lognormal(docs, 800, 1.0, "0/val") != same


def test_prepare_data_cuts_documents_after_the_split(docs, tmp_path):
    """--max-doc-chars: the val split is the same documents' text (split first, then cut), in more, shorter pieces."""
    cli = _load_cli()
    long_docs = ["\n\n".join(docs[i : i + 4]) for i in range(0, 12, 2)]
    jsonl = tmp_path / "long.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in long_docs), encoding="utf-8")
    args = ["--input", str(jsonl), "--vocab-size", "400", "--val-every", "3"]
    assert cli.main([*args, "--out", str(tmp_path / "whole")]) == 0
    assert cli.main([*args, "--out", str(tmp_path / "cut"), "--max-doc-chars", "200"]) == 0
    whole, cut = read_dataset_info(tmp_path / "whole"), read_dataset_info(tmp_path / "cut")
    assert cut["val"]["bytes"] == whole["val"]["bytes"]  # the same val text
    assert cut["val"]["documents"] > whole["val"]["documents"] == 2
    assert cut["train"]["documents"] > whole["train"]["documents"] == 4
    with pytest.raises(SystemExit):
        cli.main([*args, "--out", str(tmp_path / "bad"), "--max-doc-chars", "0"])
    # --doc-chars-lognormal: the same val text in pieces of lengths drawn from a lognormal, recorded in dataset.json
    assert cli.main([*args, "--out", str(tmp_path / "ln"), "--doc-chars-lognormal", "300", "1.0", "--seed", "3"]) == 0
    ln = read_dataset_info(tmp_path / "ln")
    assert ln["val"]["bytes"] == whole["val"]["bytes"] and ln["val"]["documents"] > whole["val"]["documents"]
    assert ln["doc_chars_lognormal"] == {"median": 300.0, "sigma": 1.0, "seed": 3} and "max_doc_chars" not in ln
    for bad in (["--max-doc-chars", "200", "--doc-chars-lognormal", "300", "1"], ["--doc-chars-lognormal", "0", "1"]):
        with pytest.raises(SystemExit):
            cli.main([*args, "--out", str(tmp_path / "bad"), *bad])
    with pytest.raises(SystemExit):
        cli.main([*args, "--out", str(tmp_path / "bad"), "--doc-chars-lognormal", "300", "-1"])


def _load_cli():
    spec = importlib.util.spec_from_file_location("prepare_data_cli", REPO / "scripts" / "prepare_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prepare_data_cli(docs, tmp_path, capsys):
    cli = _load_cli()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0 and "--vocab-size" in capsys.readouterr().out

    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:8]), encoding="utf-8")
    txt = tmp_path / "notes.txt"
    txt.write_text(docs[8], encoding="utf-8")
    out = tmp_path / "out"
    assert (
        cli.main(["--input", str(jsonl), str(txt), "--out", str(out), "--vocab-size", "400", "--val-every", "3"]) == 0
    )
    printed = capsys.readouterr().out
    assert "train_tokens" in printed and "unigram_val_bpb" in printed
    info = read_dataset_info(out)
    assert info["vocab_size"] == 400 and info["val"]["documents"] == 3 and info["train"]["documents"] == 6
    assert (out / "tokenizer.model").is_file() and (out / "fineweb_train_000000.bin").is_file()
    assert open_dataset(out, out / "tokenizer.model", 400).vocab_size == 400
