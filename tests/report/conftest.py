"""The report's console tables fit $COLUMNS when it is set: these tests read whole tables, so each starts without
it (a test of the width sets its own)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
