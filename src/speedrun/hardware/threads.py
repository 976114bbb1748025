"""How many CPU threads a CPU run's torch uses: the cores that are free when it starts, not every core.

torch starts one intra-op thread per core. On a machine where other work runs, those threads wait on each other
and on the other work at every parallel region, and a run can train ten times slower than on one thread. So a
CPU run asks, in this order: ``hardware.threads`` (set: that many), ``OMP_NUM_THREADS`` (set: that many, as torch
itself would), else the cores it may run on (``os.sched_getaffinity``, and a cgroup's CPU quota) less the cores
that other processes keep busy, measured over a short window from /proc/stat (the load average where that file
is missing: it lags a minute behind a load that just started), and at least one.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SAMPLE_SECONDS = 0.3
"""How long the busy cores are measured for: long enough for a few scheduler ticks on every core."""


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    source: str
    """hardware.threads, OMP_NUM_THREADS or free_cores."""
    usable: int
    """Cores this process may run on."""
    busy: float | None
    """Cores other work kept busy when measured (None: not measured, the count was set)."""

    def busy_line(self) -> str | None:
        """One line when other work left this run fewer threads than cores (None: the machine was free)."""
        if self.source != "free_cores" or self.threads >= self.usable:
            return None
        return (
            f"the machine is busy: other work keeps {self.busy:.1f} of {self.usable} cores busy, so torch trains on "
            f"{self.threads} thread(s); expect fewer tokens/s than on an idle machine (hardware.threads=N or "
            f"OMP_NUM_THREADS=N sets the count)"
        )


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota (a container's share)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def _cpu_times(cores: set[int] | None) -> tuple[float, float] | None:
    """(busy, total) jiffies summed over ``cores`` (None: all) from /proc/stat, or None where it cannot be read."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = 0.0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        if cores is not None and int(name[3:]) not in cores:
            continue
        values = [float(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(values)
        busy += sum(values) - values[3] - values[4]
    return (busy, total) if total else None


def busy_cores(usable: int, sample_seconds: float = SAMPLE_SECONDS) -> float:
    """Cores that other processes keep busy now, of the ``usable`` ones (this process sleeps while it measures)."""
    try:
        affinity: set[int] | None = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    before = _cpu_times(affinity)
    if before is not None:
        time.sleep(sample_seconds)
        after = _cpu_times(affinity)
        if after is not None and after[1] > before[1]:
            cores = len(affinity) if affinity is not None else (os.cpu_count() or 1)
            share = (after[0] - before[0]) / (after[1] - before[1])
            return min(float(usable), share * cores)
    try:
        return min(float(usable), os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def choose_threads(
    requested: int | None, environ: Mapping[str, str] | None = None, sample_seconds: float = SAMPLE_SECONDS
) -> ThreadChoice:
    """The thread count for a CPU run: ``requested`` (hardware.threads), else $OMP_NUM_THREADS, else the free
    cores. A malformed $OMP_NUM_THREADS is ignored here as OpenMP ignores it."""
    env = os.environ if environ is None else environ
    usable = usable_cores()
    if requested:
        return ThreadChoice(int(requested), "hardware.threads", usable, None)
    omp = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if omp.isdigit() and int(omp) > 0:
        return ThreadChoice(int(omp), "OMP_NUM_THREADS", usable, None)
    busy = busy_cores(usable, sample_seconds)
    # a core counts as free when less than half of it is taken: 2 cores at 1.4 busy leave 1 thread, at 0.4 leave 2
    threads = max(1, min(usable, math.floor(usable - busy + 0.5)))
    return ThreadChoice(threads, "free_cores", usable, busy)
