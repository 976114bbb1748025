"""A CPU run's torch threads (speedrun.hardware.threads): hardware.threads, then OMP_NUM_THREADS, then the cores
that other work leaves free, measured from /proc/stat; the one busy line; the configure step that applies the
choice and returns what result.json records. The default job beside two busy processes:
tests/e2e/test_busy_cpu.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from speedrun.hardware import threads as th
from speedrun.records.keys import thread_keys


def test_a_set_count_wins_over_the_environment_and_the_environment_over_the_measure(monkeypatch):
    monkeypatch.setattr(th, "busy_cores", lambda usable, seconds=0: pytest.fail("measured"))
    assert thread_keys(th.choose_threads(3, {"OMP_NUM_THREADS": "1"})) == {
        "cpu_threads": 3,
        "cpu_threads_source": "hardware.threads",
        "cpu_cores_busy": None,
    }
    chosen = th.choose_threads(None, {"OMP_NUM_THREADS": "2"})
    assert (chosen.threads, chosen.source, chosen.busy_line()) == (2, "OMP_NUM_THREADS", None)


@pytest.mark.parametrize(
    ("usable", "busy", "threads"),
    [(2, 0.0, 2), (2, 0.4, 2), (2, 1.0, 1), (2, 1.6, 1), (2, 2.0, 1), (2, 7.0, 1), (16, 2.0, 14), (16, 0.2, 16)],
)
def test_the_free_cores_less_the_busy_ones_at_least_one(monkeypatch, usable, busy, threads):
    monkeypatch.setattr(th, "usable_cores", lambda: usable)
    monkeypatch.setattr(th, "busy_cores", lambda usable, seconds=0: min(float(usable), busy))
    chosen = th.choose_threads(None, {"OMP_NUM_THREADS": "garbage"})  # ignored, as OpenMP ignores it
    assert (chosen.threads, chosen.source) == (threads, "free_cores")
    line = chosen.busy_line()
    if threads < usable:
        assert line is not None and f"torch trains on {threads} thread(s)" in line and "hardware.threads=N" in line
        assert "\n" not in line
    else:
        assert line is None


def test_busy_cores_sees_a_spinning_process():
    usable = th.usable_cores()
    idle_before = th.busy_cores(usable, 0.3)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # the interpreter's start-up
        busy = th.busy_cores(usable, 0.3)
    finally:
        spinner.kill()
        spinner.wait()
    # one more core busy than a moment before, give or take the rest of the machine's work
    assert busy >= min(1.0, usable) * 0.8 or busy > idle_before + 0.5, (idle_before, busy)
    assert 0.0 <= busy <= usable


def test_configure_torch_applies_the_choice_and_returns_its_keys(monkeypatch):
    import torch

    from speedrun.run.build import configure_torch

    class CpuPlan:
        device, seed, threads = "cpu", 0, 1

    before = torch.get_num_threads()
    try:
        keys = configure_torch(CpuPlan())  # type: ignore[arg-type]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert keys == {"cpu_threads": 1, "cpu_threads_source": "hardware.threads", "cpu_cores_busy": None}


def test_hardware_threads_is_checked_at_compose(compose):
    from speedrun.config import to_config
    from speedrun.errors import ConfigError

    assert to_config(compose(["hardware.threads=3"])).hardware.threads == 3
    with pytest.raises(ConfigError, match=r"hardware.threads=0 must be >= 1"):
        to_config(compose(["hardware.threads=0"]))
