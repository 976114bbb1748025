"""Shard format: round trip, exact header layout, and a named error for each kind of bad file."""

from __future__ import annotations

import numpy as np
import pytest

from speedrun.core.data import HEADER_BYTES, SHARD_MAGIC, ShardError, list_shards, read_shard
from speedrun.data.shards import validate_shard, write_shard


def _write(path, tokens, magic=SHARD_MAGIC, version=1, n_tokens=None):
    """Write a shard by hand (so malformed ones can be made)."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens) if n_tokens is None else n_tokens
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())
    return path


def test_round_trip_and_layout(tmp_path):
    tokens = np.array([1, 0, 65535, 42, 7, 1, 300], dtype=np.int64)
    path = tmp_path / "fineweb_train_000000.bin"
    write_shard(path, tokens)
    raw = path.read_bytes()
    assert len(raw) == HEADER_BYTES + 2 * tokens.size
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    assert header[:3].tolist() == [20240520, 1, tokens.size] and not header[3:].any()
    assert np.frombuffer(raw[HEADER_BYTES:], dtype="<u2").tolist() == tokens.tolist()
    back = read_shard(path)
    assert back.dtype == np.dtype("<u2") and back.tolist() == tokens.tolist()
    assert validate_shard(path) == tokens.size
    assert validate_shard(path, vocab_size=65536) == tokens.size
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_empty_shard(tmp_path):
    path = tmp_path / "fineweb_val_000000.bin"
    write_shard(path, np.zeros(0, dtype=np.uint16))
    assert validate_shard(path, vocab_size=10) == 0 and read_shard(path).size == 0


@pytest.mark.parametrize("bad", [65536, -1])
def test_write_refuses_ids_outside_uint16(tmp_path, bad):
    path = tmp_path / "fineweb_train_000000.bin"
    with pytest.raises(ValueError, match=str(bad)) as err:
        write_shard(path, np.array([1, 2, bad]))
    assert path.name in str(err.value)
    assert not list(tmp_path.iterdir())


def test_bad_magic(tmp_path):
    path = _write(tmp_path / "fineweb_train_000000.bin", [1, 2, 3], magic=1234)
    with pytest.raises(ShardError) as err:
        validate_shard(path)
    msg = str(err.value)
    assert path.name in msg and "magic" in msg and "20240520" in msg and "1234" in msg


def test_bad_version(tmp_path):
    path = _write(tmp_path / "fineweb_train_000000.bin", [1, 2, 3], version=7)
    with pytest.raises(ShardError) as err:
        validate_shard(path)
    msg = str(err.value)
    assert path.name in msg and "version" in msg and "expected 1" in msg and "found 7" in msg


def test_truncated_file_disagrees_with_header(tmp_path):
    path = tmp_path / "fineweb_train_000001.bin"
    write_shard(path, np.arange(100))
    path.write_bytes(path.read_bytes()[:-10])  # lose 5 tokens
    with pytest.raises(ShardError) as err:
        validate_shard(path)
    msg = str(err.value)
    assert path.name in msg and "100" in msg and str(HEADER_BYTES + 190) in msg and str(HEADER_BYTES + 200) in msg


def test_header_count_larger_than_file(tmp_path):
    path = _write(tmp_path / "fineweb_val_000000.bin", [5, 6], n_tokens=1000)
    with pytest.raises(ShardError, match="disagrees with the header's token count 1000") as err:
        validate_shard(path)
    assert path.name in str(err.value)


def test_file_shorter_than_header(tmp_path):
    path = tmp_path / "fineweb_train_000000.bin"
    path.write_bytes(b"\x00" * 100)
    with pytest.raises(ShardError) as err:
        validate_shard(path)
    msg = str(err.value)
    assert path.name in msg and "100 bytes" in msg and "shorter than" in msg and str(HEADER_BYTES) in msg


def test_token_id_out_of_vocab(tmp_path):
    path = tmp_path / "fineweb_train_000000.bin"
    write_shard(path, np.array([1, 5, 1030, 7, 1024]))
    assert validate_shard(path, vocab_size=2048) == 5
    with pytest.raises(ShardError) as err:
        validate_shard(path, vocab_size=1024)
    msg = str(err.value)
    assert path.name in msg and "1030" in msg and "1024" in msg and "at token 2" in msg


def test_the_core_refuses_a_bad_shard_in_one_line(tmp_path):
    for n, kw in enumerate(({"magic": 1234}, {"version": 7}, {"n_tokens": 1000})):
        path = _write(tmp_path / f"fineweb_train_{n:06d}.bin", [1, 2, 3], **kw)
        with pytest.raises(ShardError, match="not a token shard"):
            read_shard(path)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        read_shard(tmp_path / "nope.bin")


def test_list_shards(tmp_path):
    for name in [
        "fineweb_train_000002.bin",
        "fineweb_train_000000.bin",
        "fineweb_train_000001.bin",
        "fineweb_val_000000.bin",
        "fineweb_train_1.bin",
        "other.bin",
        ".fineweb_train_000003.bin.tmp1",
    ]:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in list_shards(tmp_path, "train")] == [
        "fineweb_train_000000.bin",
        "fineweb_train_000001.bin",
        "fineweb_train_000002.bin",
    ]
    assert [p.name for p in list_shards(tmp_path, "val")] == ["fineweb_val_000000.bin"]
    with pytest.raises(ValueError, match="split"):
        list_shards(tmp_path, "test")


def test_list_shards_none(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        list_shards(tmp_path, "val")
    assert str(tmp_path) in str(err.value) and "fineweb_val_%06d.bin" in str(err.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_shards(tmp_path / "missing", "train")


def test_dataset_paths_lists_a_directorys_shards_and_sidecars(tmp_path):
    from speedrun.core.data import dataset_paths, sidecar_name

    for name in ("fineweb_train_000001.bin", "fineweb_train_000000.bin", "fineweb_val_000000.bin", sidecar_name(0)):
        write_shard(tmp_path / name, np.arange(4))
    paths = dataset_paths(tmp_path, tmp_path / "tokenizer.model", 1024)
    assert [p.name for p in paths.train] == ["fineweb_train_000000.bin", "fineweb_train_000001.bin"]
    assert [p.name for p in paths.val_bytes] == [sidecar_name(0)] and len(paths.val) == 1
    assert paths.tokenizer == tmp_path / "tokenizer.model" and paths.vocab_size == 1024
