"""speedrun.run.hooks: a run waits before timed training until its gate exists, or not at all."""

from __future__ import annotations

import threading
import time

import pytest

from speedrun.run import hooks as start_gate
from speedrun.run.hooks import START_GATE_ENV, wait_at_start_gate


def test_without_a_gate_nothing_waits_or_logs(monkeypatch):
    monkeypatch.delenv(START_GATE_ENV, raising=False)
    lines: list[str] = []
    assert wait_at_start_gate(lines.append) is None and lines == []


def test_a_shut_gate_holds_the_run_until_it_exists(monkeypatch, tmp_path):
    gate = tmp_path / "gate"
    monkeypatch.setenv(START_GATE_ENV, str(gate))
    opener = threading.Timer(0.3, gate.touch)
    opener.start()
    lines: list[str] = []
    t0 = time.perf_counter()
    waited = wait_at_start_gate(lines.append)
    assert gate.exists() and waited is not None and waited >= 0.3 and time.perf_counter() - t0 >= 0.3
    assert lines[0].startswith(f"start gate: waiting for {gate}") and lines[-1].startswith("start gate open after")


def test_an_open_gate_costs_nothing(monkeypatch, tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    monkeypatch.setenv(START_GATE_ENV, str(gate))
    lines: list[str] = []
    waited = wait_at_start_gate(lines.append)
    assert waited is not None and waited < 0.05 and len(lines) == 1


def test_a_gate_nobody_opens_fails_the_run_naming_the_way_out(monkeypatch, tmp_path):
    monkeypatch.setenv(START_GATE_ENV, str(tmp_path / "never"))
    monkeypatch.setattr(start_gate, "MAX_WAIT_S", 0.2)
    with pytest.raises(RuntimeError, match=f"still shut after .*unset {START_GATE_ENV}"):
        wait_at_start_gate(lambda line: None)
