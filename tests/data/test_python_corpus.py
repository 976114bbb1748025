"""The Python-installation corpus (--source python): the walk, dedup, the split by content, the shards and
dataset.json, determinism, the CLI, and a run's data build reading it."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from speedrun.core.data import HEADER_INTS, SHARD_MAGIC, SHARD_VERSION, read_shard
from speedrun.data.existing import open_dataset
from speedrun.data.prepare import DataNotFoundError, read_dataset_info
from speedrun.data.python_corpus import SUFFIXES, build_python_corpus, collect, default_roots, is_val, walk_files

REPO = Path(__file__).resolve().parents[2]
VOCAB = 1024  # data=python_sp1024's, so the build-data test reads the same directory
VAL_FRACTION = 0.2  # a few dozen documents: 1% would leave val empty
STDLIB_BYTES = 1_200_000
SKIPPED = ("copy_of_abc.py", "latin1.txt", "__init__.py")  # the duplicate, the file not in UTF-8, the empty one


def _stdlib_files() -> list[Path]:
    """The stdlib's top-level modules in sorted order, about STDLIB_BYTES of them (real Python text)."""
    out, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if size >= STDLIB_BYTES:
            break
        out.append(path)
        size += path.stat().st_size
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Stdlib modules, docs, and the files the walk must skip or count once."""
    root = tmp_path_factory.mktemp("pyroot") / "lib"
    (root / "pkg" / "sub").mkdir(parents=True)
    for path in _stdlib_files():
        shutil.copyfile(path, root / path.name)
    (root / "pkg" / "README.md").write_text("# pkg\n\nA package.\n\n" + "Some *words* here.\n" * 200)
    (root / "pkg" / "guide.rst").write_text("Guide\n=====\n\n.. code-block:: python\n\n    x = 1\n" * 100)
    (root / "pkg" / "NOTES.txt").write_text("notes\n" * 300)
    (root / "pkg" / "sub" / "copy_of_abc.py").write_bytes((root / "abc.py").read_bytes())  # a duplicate
    (root / "pkg" / "sub" / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))  # not UTF-8
    (root / "pkg" / "__init__.py").write_text("")  # empty
    (root / "pkg" / "data.json").write_text("{}")  # not a corpus suffix
    (root / "pkg" / "mod.cpython-311.pyc").write_bytes(b"\0" * 100)
    return root


@pytest.fixture(scope="module")
def built(root, tmp_path_factory):
    out = tmp_path_factory.mktemp("built") / "python_sp1024"
    paths = build_python_corpus(out, [root], VOCAB, val_fraction=VAL_FRACTION, processes=2, shard_tokens=200_000)
    return paths, read_dataset_info(out)


def _raw_header(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<i4", count=HEADER_INTS)


def _documents(paths, split: str) -> list[str]:
    """The split's documents decoded from its shards (split at BOS)."""
    sp = spm.SentencePieceProcessor(model_file=str(paths.tokenizer))
    stream = np.concatenate([np.asarray(read_shard(p)) for p in getattr(paths, split)]).astype(np.int64)
    starts = np.flatnonzero(stream == sp.bos_id()).tolist() + [stream.size]
    assert starts[0] == 0  # the stream starts with a document
    return sp.decode([stream[a + 1 : b].tolist() for a, b in zip(starts[:-1], starts[1:])])


def test_shards_and_manifest(built, root):
    paths, info = built
    d = paths.directory
    assert paths.tokenizer == d / "tokenizer.model" and paths.vocab_size == VOCAB
    assert [p.name for p in paths.train[:2]] == ["fineweb_train_000000.bin", "fineweb_train_000001.bin"]
    assert paths.val[0].name == "fineweb_val_000000.bin"
    shard_tokens = {}
    for shard in paths.train + paths.val:
        header = _raw_header(shard)
        assert (header[0], header[1]) == (SHARD_MAGIC, SHARD_VERSION) and not header[3:].any()
        assert shard.stat().st_size == HEADER_INTS * 4 + 2 * int(header[2])  # uint16 tokens after the header
        shard_tokens[shard] = int(header[2])
    assert all(shard_tokens[p] == 200_000 for p in paths.train[:-1])
    # the manifest's counts are the shards'
    assert info["train"]["tokens"] == sum(shard_tokens[p] for p in paths.train)
    assert info["val"]["tokens"] == sum(shard_tokens[p] for p in paths.val)
    assert (info["train"]["shards"], info["val"]["shards"]) == (len(paths.train), len(paths.val))
    source = info["source"]
    n_stdlib = len(_stdlib_files())
    # every file with a corpus suffix is counted; the duplicate, the latin-1 and the empty file are not documents
    assert source["files"] == n_stdlib + 6
    assert source["skipped"] == {"duplicates": 1, "not_utf8": 1, "empty": 1, "unreadable": 0}
    assert source["documents"] == n_stdlib + 3 == info["train"]["documents"] + info["val"]["documents"]
    kept = [p for p in root.rglob("*") if p.suffix in SUFFIXES and p.name not in SKIPPED]
    assert source["bytes"] == sum(p.stat().st_size for p in kept) and len(kept) == source["documents"]
    assert source["python_version"] == sys.version.split()[0] and source["python_prefix"] == sys.prefix
    assert source["roots"] == [str(root.resolve())] and not source["capped"]
    assert (
        len(info["fingerprint"]) == 64
        and info["tokenizer_sha256"] == hashlib.sha256(paths.tokenizer.read_bytes()).hexdigest()
    )
    assert info["val"]["bytes"] == info["val"]["bytes_original_text"]  # the byte count BPB divides by is exact
    assert not [p for p in d.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_split_is_by_document_content(built, root):
    paths, _ = built
    train, val = _documents(paths, "train"), _documents(paths, "val")
    texts = {p.read_bytes() for p in root.rglob("*") if p.suffix in SUFFIXES and p.name not in SKIPPED}
    by_split: dict[str, list[str]] = {"train": [], "val": []}
    for data in texts:  # each document in the split its content hash picks
        split = "val" if is_val(hashlib.sha256(data).hexdigest(), VAL_FRACTION) else "train"
        by_split[split].append(data.decode())
    assert sorted(train) == sorted(by_split["train"]) and sorted(val) == sorted(by_split["val"])
    assert len(val) >= 2 and len(train) > 5 and not set(train) & set(val)
    # each split in the order of its documents' hashes, not the walk's (which starts with abc.py, aifc.py, ...)
    for docs in (train, val):
        hashes = [hashlib.sha256(doc.encode()).hexdigest() for doc in docs]
        assert hashes == sorted(hashes)
    walk_order = [doc for doc in (p.read_text() for p in sorted(root.glob("*.py"))) if doc in train]
    assert [doc for doc in train if doc in walk_order] != walk_order
    # the split reads only content: the same text elsewhere, or renamed, would land in the same split
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(20_000)]
    assert 0.008 < np.mean([is_val(h, 0.01) for h in hashes]) < 0.012


def test_deterministic_and_independent_of_where_the_root_is(built, root, tmp_path):
    """Built again from a copy of the root elsewhere, tokenized in one process: the same fingerprint and bytes."""
    paths, info = built
    moved = tmp_path / "elsewhere" / "lib"
    shutil.copytree(root, moved)
    again = build_python_corpus(
        tmp_path / "again", [moved], VOCAB, val_fraction=VAL_FRACTION, processes=1, shard_tokens=200_000
    )
    assert read_dataset_info(again.directory)["fingerprint"] == info["fingerprint"]
    names = sorted(p.name for p in paths.directory.iterdir())
    assert names == sorted(p.name for p in again.directory.iterdir())
    for name in names:
        if name != "dataset.json":  # it names the roots
            assert (paths.directory / name).read_bytes() == (again.directory / name).read_bytes(), name
    # a different file set is a different fingerprint
    (moved / "extra.md").write_text("# one more document\n")
    assert collect([moved], VAL_FRACTION).files_sha256 != collect([root], VAL_FRACTION).files_sha256


def test_walk_is_sorted_and_lists_nested_roots_once(root):
    files = walk_files([root, root / "pkg"])
    rels = [(i, rel) for i, rel, _ in files]
    assert len({p for _, _, p in files}) == len(files)  # pkg/ under root is walked as its own root only
    assert [rel for i, rel in rels if i == 0] == sorted(rel for i, rel in rels if i == 0)
    assert {rel for i, rel in rels if i == 1} == {
        "README.md",
        "guide.rst",
        "NOTES.txt",
        "__init__.py",
        "sub/copy_of_abc.py",
        "sub/latin1.txt",
    }
    assert not [rel for i, rel in rels if i == 0 and rel.startswith("pkg/")]
    with pytest.raises(FileNotFoundError, match="corpus root not found"):
        walk_files([root / "nowhere"])
    assert all(r.is_dir() for r in default_roots()) and default_roots()


def test_max_bytes_stops_the_walk(root):
    full = collect([root], VAL_FRACTION)
    capped = collect([root], VAL_FRACTION, max_bytes=300_000)
    assert capped.capped and not full.capped and 0 < capped.bytes <= 300_000
    assert capped.listing == full.listing[: len(capped.listing)]  # the first documents of the same walk


def test_cli_builds_and_refuses_mixed_options(root, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("prepare_data_cli", REPO / "scripts" / "prepare_data.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out = tmp_path / "out"
    args = ["--source", "python", "--roots", str(root), "--out", str(out), "--vocab", "400"]
    assert cli.main([*args, "--max-bytes", "400000", "--val-fraction", "0.3", "--processes", "1"]) == 0
    printed = capsys.readouterr().out
    info = read_dataset_info(out)
    for key in ("files", "bytes", "documents", "train_tokens", "val_tokens", "fingerprint", "seconds"):
        assert f"\n{key}" in printed, key
    assert f"fingerprint    : {info['fingerprint']}" in printed and f"data.path={out}" in printed
    assert info["vocab_size"] == 400 and info["source"]["max_bytes"] == 400_000 and info["source"]["capped"]
    for bad in (
        ["--input", "x.txt"],
        ["--val-fraction", "1.5"],
        ["--max-bytes", "0"],
        ["--tokenizer", "gpt2"],
        ["--max-doc-chars", "100"],
    ):
        with pytest.raises(SystemExit):
            cli.main(["--source", "python", "--roots", str(root), "--out", str(tmp_path / "bad"), *bad])
    with pytest.raises(SystemExit):  # and the other way round
        cli.main(["--input", "x.txt", "--out", str(tmp_path / "bad"), "--roots", str(root)])
    assert "--roots is for --source python" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    for bad, needle in ((["--out", str(out)], "already exists"), (["--roots", str(tmp_path / "nowhere")], "not found")):
        with pytest.raises(SystemExit):  # one line, no traceback
            cli.main(["--source", "python", "--roots", str(root), "--out", str(tmp_path / "bad"), *bad])
        assert needle in capsys.readouterr().err


def test_a_run_reads_it_and_a_missing_one_names_the_command(built, compose, tmp_path):
    from speedrun.config import to_config
    from speedrun.plan import resolve
    from speedrun.run.build import build_data
    from support.devices import fake_device

    paths, info = built
    overrides = ["debug=smoke", "data=python_sp1024", f"data.path={paths.directory}"]
    plan = resolve(to_config(compose(overrides)), fake_device("cpu"))
    assert plan.data.tokenizer == str(paths.directory / "tokenizer.model")  # follows data.path
    data = build_data(plan, lambda m: None)
    assert data.train_tokens == info["train"]["tokens"] and data.bos_id == 1
    x, y = data.train_batches().next_batch()
    assert x.shape == y.shape and int(x.max()) < VOCAB and bool((x.flatten()[1:] == y.flatten()[:-1]).all())
    assert data.val_tokens.numel() > 1000

    missing = tmp_path / "python_sp1024"
    plan = resolve(
        to_config(compose(["debug=smoke", "data=python_sp1024", f"data.path={missing}"])), fake_device("cpu")
    )
    with pytest.raises(DataNotFoundError) as err:
        build_data(plan, lambda m: None)
    message = str(err.value)
    assert "\n" not in message and f"dataset directory not found: {missing}" in message
    assert f"python scripts/prepare_data.py --source python --out {missing} --vocab 1024" in message
    missing.mkdir()  # a directory without shards or tokenizer: the same command
    with pytest.raises(DataNotFoundError, match="--source python --out") as err:
        open_dataset(missing, missing / "tokenizer.model", VOCAB)
    assert "\n" not in str(err.value)
