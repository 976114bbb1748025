"""Where a user installs speedrun from: no placeholder URL anywhere a user reads (README, docs/, notebooks/), and the
Colab notebook's install cell installs the wheel or folder it is given (INSTALL), else the git URL it is given
(REPO_URL), else nothing where speedrun is already importable, and otherwise stops with one line naming both
parameters. The whole notebook runs headless in tests/e2e/test_notebook.py."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "colab_t4.ipynb"
# OWNER as the old install URL spelt it, or a github.com/<...>/ or {...} stand-in for an account
PLACEHOLDER = re.compile(r"\bOWNER\b|github\.com/(?:<[^>]*>|\{[^}]*\}|your[-_]?name|user(?:name)?)/")
FIND_SPEC = importlib.util.find_spec


def _user_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "notebooks").glob("*"))]


def test_no_placeholder_url_is_left_for_a_user_to_trip_on():
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _user_files()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PLACEHOLDER.search(line)
    ]
    assert not found, "\n".join(found)
    assert PLACEHOLDER.search("pip install git+https://github.com/OWNER/speedrun.git")  # the check can fail


def _install_cell() -> str:
    cells = {c.get("id"): c for c in json.loads(NOTEBOOK.read_text())["cells"]}
    return "".join(cells["install"]["source"])


def _run_install(monkeypatch, install: str, repo_url: str, installed: bool) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "check_call", lambda cmd, *a, **k: calls.append(list(cmd)) or 0)
    real = FIND_SPEC
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (real(name, *a) if installed else None) if name == "speedrun" else real(name, *a),
    )
    exec(compile(_install_cell(), "install", "exec"), {"INSTALL": install, "REPO_URL": repo_url})
    return calls


def test_the_install_cell_installs_what_it_is_given(monkeypatch):
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    wheel = "/content/speedrun-0.1.0-py3-none-any.whl"
    assert _run_install(monkeypatch, wheel, "https://example.org/x/speedrun.git", False) == [[*pip, wheel]]
    url = "https://example.org/x/speedrun.git"
    assert _run_install(monkeypatch, "", url, False) == [[*pip, f"git+{url}"]]
    assert _run_install(monkeypatch, "", "", True) == []  # already importable: nothing to install


def test_the_install_cell_stops_in_one_line_when_it_has_nothing_to_install(monkeypatch):
    with pytest.raises(RuntimeError) as e:
        _run_install(monkeypatch, "", "", False)
    message = str(e.value)
    assert "\n" not in message and "INSTALL" in message and "REPO_URL" in message
