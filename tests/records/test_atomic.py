"""speedrun.records.atomic: the one way speedrun writes a file whole, and the only names it deletes on its own."""

from __future__ import annotations

import os

import pytest

from speedrun.records.atomic import atomic_write, is_temp_name, remove_orphan_temps, temp_name


def test_only_the_temp_names_speedrun_makes_are_removed(tmp_path):
    mine = temp_name(tmp_path / "result.json")
    mine.write_text("half")
    theirs = [".notes.tmp", ".result.json.123.tmp", "data.tmp", ".x.12.speedrun-tmp.bak"]
    for name in theirs:
        (tmp_path / name).write_text("keep")
    (tmp_path / ".dir.1.speedrun-tmp").mkdir()  # a folder of that name is not a file speedrun left
    assert remove_orphan_temps(tmp_path) == [mine]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*theirs, ".dir.1.speedrun-tmp"])
    assert is_temp_name(mine.name) and not any(is_temp_name(n) for n in theirs)


def test_a_failed_write_or_check_keeps_the_old_file_and_leaves_nothing(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"old")

    def fails(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_write(path, fails)

    def refuse(tmp):
        assert tmp.read_bytes() == b"new"  # the check sees the whole new file before it takes the name
        raise ValueError("round trip differs")

    with pytest.raises(ValueError, match="round trip"):
        atomic_write(path, b"new", check=refuse)
    assert path.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["model.bin"]
    atomic_write(path, "new")
    assert path.read_text() == "new"


def test_a_symlink_is_replaced_never_written_through(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious")
    link = tmp_path / "result.json"
    link.symlink_to(target)
    atomic_write(link, "{}")
    assert target.read_text() == "precious" and not link.is_symlink() and link.read_text() == "{}"
    planted = temp_name(tmp_path / "train_gpt.py")  # a symlink waiting at the temp name is refused
    planted.symlink_to(target)
    with pytest.raises(OSError):
        atomic_write(tmp_path / "train_gpt.py", "x")
    assert target.read_text() == "precious" and planted.is_symlink()
