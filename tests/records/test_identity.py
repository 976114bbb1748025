"""speedrun.records.identity: the code fingerprint resume compares (working tree, tracked and untracked-not-ignored files
under src/ and conf/, or a plain walk without git) and the name of the card here."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from speedrun.records.identity import DEVICE_NAME_ENV, code_fingerprint, current_device_name


def _tree(root):
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "conf").mkdir()
    (root / "src" / "pkg" / "a.py").write_text("x = 1\n")
    (root / "conf" / "config.yaml").write_text("seed: 0\n")
    (root / "README.md").write_text("readme\n")
    return root


def _git(root, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True, capture_output=True
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_code_fingerprint_follows_the_working_tree_under_src_and_conf(tmp_path):
    root = _tree(tmp_path / "repo")
    (root / ".gitignore").write_text("*.log\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "init")
    base = code_fingerprint(root)
    assert len(base) == 16 and int(base, 16) >= 0 and code_fingerprint(root) == base

    a = root / "src" / "pkg" / "a.py"
    a.write_text("x = 2\n")  # an uncommitted edit is other code
    assert code_fingerprint(root) != base
    a.write_text("x = 1\n")
    assert code_fingerprint(root) == base

    new = root / "conf" / "extra.yaml"  # untracked, not ignored: the run composes it
    new.write_text("k: v\n")
    assert code_fingerprint(root) != base
    new.unlink()

    (root / "src" / "pkg" / "debug.log").write_text("ignored\n")  # ignored: not code
    (root / "README.md").write_text("other readme\n")  # outside src/ and conf/
    assert code_fingerprint(root) == base


def test_code_fingerprint_without_git_walks_py_and_yaml(tmp_path):
    root = _tree(tmp_path / "plain")  # not a git checkout: git ls-files fails, the walk takes over
    base = code_fingerprint(root)
    (root / "src" / "pkg" / "notes.txt").write_text("not code\n")
    assert code_fingerprint(root) == base
    (root / "conf" / "config.yaml").write_text("seed: 1\n")
    assert code_fingerprint(root) != base


def test_the_card_here_is_the_detected_device_unless_overridden(monkeypatch):
    from speedrun.hardware.profiles import detect

    monkeypatch.delenv(DEVICE_NAME_ENV, raising=False)
    assert current_device_name() == detect().name  # the name runs record as device_name
    monkeypatch.setenv(DEVICE_NAME_ENV, "NVIDIA H200")
    assert current_device_name() == "NVIDIA H200"
