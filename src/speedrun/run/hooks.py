"""A start gate before timed training, for runs compared side by side on one host.

With ``SPEEDRUN_START_GATE=PATH`` set, a run compiles and warms up as usual, then waits until PATH exists before
its training clock starts. speedrun.bench sets it for a speedrun arm run beside a peer script, and creates PATH
when the peer starts training: the two then train at the same time, instead of one training while the other's
compile (minutes, on every CPU core of the host) still runs. Unset, nothing waits.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

START_GATE_ENV = "SPEEDRUN_START_GATE"
READY_LINE = "ready to train"
"""Logged once everything before timed training is done, right before the gate (speedrun.bench times start-up to
it)."""
POLL_S = 0.05
MAX_WAIT_S = 3600.0
"""A gate still shut after this long has lost whoever was to open it: the run fails rather than hold its GPU."""


def wait_at_start_gate(log: Callable[[str], None]) -> float | None:
    """Wait for the gate named by ``SPEEDRUN_START_GATE``: the seconds waited, or None when none is set."""
    path = os.environ.get(START_GATE_ENV)
    if not path:
        return None
    gate, t0 = Path(path), time.perf_counter()
    if not gate.exists():
        log(f"start gate: waiting for {gate} to exist before timed training ({START_GATE_ENV})")
    while not gate.exists():
        if time.perf_counter() - t0 > MAX_WAIT_S:
            raise RuntimeError(
                f"start gate {gate} still shut after {MAX_WAIT_S:.0f} s: whatever was to create it is gone; "
                f"create it to start training, or unset {START_GATE_ENV}"
            )
        time.sleep(POLL_S)
    waited = time.perf_counter() - t0
    log(f"start gate open after {waited:.1f} s")
    return waited
