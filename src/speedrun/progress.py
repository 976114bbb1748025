"""Progress lines for long phases (evaluation, GPTQ, compression, TTT), so a phase of minutes is never silent, and
the one callback (``Report``) through which the core tells its shell what happened.

Torch-free and below every package, so each phase can use it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# How the core reports to its shell: report(kind, values). Kinds: "line" ({"text": ...}, a human line), "metrics"
# (one training record: step, train_loss, lr, seconds, tokens) and "phase" ({"name": ..., values}, when a phase
# ends). `python -m run` writes run.log, metrics.jsonl, the loggers and result.json from it; the driver prints.
Report = Callable[[str, dict[str, Any]], None]


class Progress:
    """The progress line of a long phase, at most one every ``every`` seconds: ``tick(done, total)`` prints
    "eval: 12,345/1,400,000 tokens (0.9%), 31s, ~3,480s left" once that much time passed since the start or the
    last line, so a phase of minutes is never silent and one of seconds prints nothing. A tick costs a clock read:
    callers tick from counts the host already has, never from a value that waits for the device. With no ``log``
    every tick is a no-op."""

    def __init__(
        self,
        label: str,
        log: Callable[[str], None] | None,
        unit: str = "tokens",
        every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label, self.log, self.unit, self.every, self.clock = label, log, unit, every, clock
        self.start = clock()
        self._next = self.start + every

    def elapsed(self) -> float:
        return self.clock() - self.start

    def tick(self, done: float, total: float | None = None) -> bool:
        """Print the line if it is due; True when it printed."""
        if self.log is None:
            return False
        now = self.clock()
        if now < self._next:
            return False
        self._next = now + self.every
        self.log(self.line(done, total, now - self.start))
        return True

    def line(self, done: float, total: float | None, seconds: float) -> str:
        def num(x: float) -> str:
            return f"{x:,}" if isinstance(x, int) else f"{x:,.1f}"

        text = f"{self.label}: {num(done)}" + (f"/{num(total)}" if total is not None else "") + f" {self.unit}"
        if total:
            text += f" ({100 * done / total:.1f}%)"
        text += f", {seconds:,.0f}s"
        if total and 0 < done < total:
            text += f", ~{seconds * (total - done) / done:,.0f}s left"
        return text
