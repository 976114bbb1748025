"""The product speaks of itself: its docs, code, conf, scripts and tests name cards, commands, checks and dates,
never how the people who build it organise their work: no numbered or deictic work sessions, no tracker
references (an issue by its number), no names of rented-machine kinds or of the time and numbered calls spent on
them, no word for the builders as a group. A fact worth keeping is said as a fact, with the benchmark check that
measures it (``python -m speedrun.bench --list``).

The patterns are built from pieces so that this file does not match itself. pytest's own sessions ("this pytest
session", fixture scope "session") and the profiler's "self device time" are not matched."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCOPE = ["docs", "src", "conf", "scripts", "tests", "notebooks", "README.md", "setup.py"]

_S = "ses" + "sion"
_ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|[a-z]+teenth|twentieth"
    "|this|last|next|that|earlier|previous|same"
)
_DEV = "dev" + "ice "
FORBIDDEN: dict[str, re.Pattern[str]] = {
    "a work session": re.compile(rf"\b(?:{_ORDINALS}) {_S}\b", re.IGNORECASE),
    "a tracker reference": re.compile(r"\b" + "iss" + r"ues? [0-9]+", re.IGNORECASE),
    "a rented-machine kind": re.compile(r"\b" + "nvi" + r"dia-h[12]00(?:-x[0-9])?\b"),
    "rented GPU time": re.compile(r"(?<!self )\b" + _DEV + "ti" + r"me\b", re.IGNORECASE),
    "the lending tool": re.compile(r"\b" + _DEV + "to" + "ol", re.IGNORECASE),
    "a numbered call": re.compile(r"\b" + "cal" + r"l [0-9]", re.IGNORECASE),
    "the builders": re.compile(r"\bthe " + "te" + r"am\b", re.IGNORECASE),
    "an unnamed function": re.compile(r"(?<![.\w])" + "hel" + r"per\b(?!\s*\()", re.IGNORECASE),
}
"""What may not appear, by what it is. The last is the vague word for a function, matched except as a code
identifier (an attribute, or a name that is called)."""


def scoped_files() -> list[Path]:
    """Tracked files, and untracked ones git does not ignore, under SCOPE."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *SCOPE],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = sorted({REPO / p for p in out.decode("utf-8", "replace").split("\0") if p})
    return [p for p in paths if p.is_file()]


def offences(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the line) for every forbidden phrase in ``text``."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            if pattern.search(line):
                found.append((n, what, line.strip()))
    return found


def test_the_patterns_catch_what_they_are_for():
    s = "ses" + "sion"
    caught = [
        f"measured in the fourteenth {s}",
        f"as this {s} found",
        "I" + "ssue 21: a run whose loss blew up",
        "on " + "nvi" + "dia-h1" + "00-x4",
        "it ran out of " + _DEV + "ti" + "me",
        "the " + _DEV + "to" + "ol said",
        "in " + "cal" + "l 3 of the run",
        "the " + "te" + "am decided",
        "a " + "hel" + "per that raises",
    ]
    for line in caught:
        assert offences(line), line
    fine = [
        f"a directory of this pytest {s}",
        f'@pytest.fixture(scope="{s}")',
        "NVIDIA H100 80GB HBM3",
        "an event's self " + _DEV + "ti" + "me in us",
        "submitit." + "hel" + "pers.TorchDistributedEnvironment",
        "a recall 5 of them",
    ]
    for line in fine:
        assert not offences(line), line


def test_the_product_names_no_work_sessions_issues_or_rented_machines():
    bad = []
    for path in scoped_files():
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary (images)
        for n, what, line in offences(data.decode("utf-8", "replace")):
            bad.append(f"{path.relative_to(REPO)}:{n}: {what}: {line[:160]}")
    assert not bad, "say what the product does, not how it was built:\n" + "\n".join(bad)
