"""A live run's pulse: its row's ``heartbeat_at`` and its run dir's lock file, refreshed from a daemon thread.

A row whose heartbeat stops reads ``lost`` (speedrun.records.store.effective_status), so a run killed without a
word (kill -9, power loss) is told apart from one still running. A failed write is a warning once, never a failed
run: the run's own record writes say what went wrong with the database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from speedrun.records.store import HEARTBEAT_SECONDS

log = logging.getLogger("speedrun")


class Heartbeat:
    def __init__(self, beat: Callable[[float], None], every: float = HEARTBEAT_SECONDS):
        """``beat(now)`` writes one heartbeat; it runs every ``every`` seconds until ``stop``."""
        self._beat, self._every = beat, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="speedrun-heartbeat", daemon=True)
        self._warned = False

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No heartbeat after this returns: the final record write must not be followed by one."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._beat(time.time())
            except Exception as e:  # noqa: BLE001 - a heartbeat is best effort (module docstring)
                if not self._warned:
                    log.warning("could not write the run's heartbeat: %s: %s", type(e).__name__, e)
                    self._warned = True
