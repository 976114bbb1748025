"""A pool job's files: its console output copied line by line, and its result.json read back."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def pump_output(proc: subprocess.Popen, path: Path, echo: Callable[[], bool], prefix: str) -> None:
    """Copy a job's output to its console.log (and to this console while ``echo()`` says so), line by line."""
    assert proc.stdout is not None
    broken = False
    with open(path, "a", buffering=1, errors="replace") as f:
        for line in proc.stdout:
            f.write(line)
            if not broken and echo():
                try:
                    sys.stdout.write(prefix + line)
                    sys.stdout.flush()
                except (OSError, ValueError):
                    broken = True


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
