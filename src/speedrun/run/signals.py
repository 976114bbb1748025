"""Signal handling shared by a run and the sweep launcher (no heavy imports: Hydra loads the launcher plugin
on every start)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}

SWEEP_STOPS: list[int] = []
"""The stop signals (SIGINT, SIGTERM) this process's sweep received once its pool began to stop, in order: the pool
launcher (hydra_plugins/speedrun_plugins/pool_launcher.py) notes them here, the sweep's summary reads them."""


def sweep_stop_signals() -> list[int]:
    """The stop signals the sweep in this process received, first first: none (or another launcher's sweep), or the
    one that interrupted it and any that came after (the summary callback exits with the first one's status and,
    after a second, says one line)."""
    return list(SWEEP_STOPS)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SLURM and `kill` send SIGTERM: treat it as Ctrl-C, so a run is recorded as interrupted and a sweep stops
    its jobs instead of orphaning them."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (e.g. a launcher thread): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the final record is written; they are delivered right after, so a second
    signal cannot cut result.json or the database row in half.

    Blocking them in this thread is not enough in a process with other threads (torch's, NCCL's, gloo's): the
    kernel hands the signal to one of those, and Python then runs the handler here anyway, or the default action
    ends the process. So the handlers are also swapped for one that only notes the signal, which is raised again
    once the record is written."""
    caught: list[int] = []
    try:
        previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in _STOP_SIGNALS}
    except ValueError:  # not the main thread: only the mask below
        previous = {}
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        masked = True
    except (AttributeError, ValueError, OSError):  # no pthread_sigmask here
        masked = False
    try:
        yield
    finally:
        if masked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # what was held arrives: noted below
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, nothing to restore from here
                signal.signal(signum, handler)
        if caught:
            signal.raise_signal(caught[0])
