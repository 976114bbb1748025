"""Signal handling shared by a run and the sweep launcher (no heavy imports: Hydra loads the launcher plugin
on every start)."""
from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


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
    signal cannot cut result.json or the database row in half."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    except (AttributeError, ValueError, OSError):  # no pthread_sigmask here: write unprotected
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
