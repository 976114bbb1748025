"""The guard: one thread per rank of a multi-process run that ends every rank within seconds when one fails or a
stop signal comes, and makes the run's row name what happened.

Why a thread: a rank whose peer failed is usually blocked inside a collective or a GPU sync (C++), where Python
runs no signal handler and raises nothing until the process group's timeout (minutes). The guard watches, from
outside the main thread:

- the rendezvous store every rank already shares (torchrun's agent store, or rank 0's for a submitit job): a
  rank that raises publishes its error and traceback there before it exits (``settle``), and the first to do so
  is recorded under one key, so every rank names the same culprit;
- stop signals (Ctrl-C, SIGTERM from torchrun, SLURM or the sweep pool), through ``signal.set_wakeup_fd``, which
  Python's C-level handler writes even while the main thread is blocked. During training (``set_deferring``) the
  first stop signal is left to the loop, which agrees on it with the other ranks at the next step boundary,
  checkpoints and stops every rank there (speedrun.run.periodic); a second one is acted on here as always.

On either it aborts the NCCL communicators, so the blocked collective returns with an error and the main thread
records the run and exits, and on rank 0 it closes the row at once (World.on_stop), in case this process is
killed before it gets that far. With gloo (CPU) a peer's exit already breaks the collective it left.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import threading
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger("speedrun")

POLL_S = 0.25
"""How often the store is asked whether a rank failed: the delay before the other ranks stop."""


class Guard(threading.Thread):
    def __init__(self, world: Any, nccl: bool):
        super().__init__(name="speedrun-guard", daemon=True)
        import torch.distributed as dist

        self.world, self.nccl = world, nccl
        # Its own client of the rendezvous store (MASTER_ADDR:MASTER_PORT, which env:// init used), so this
        # thread never shares a connection with the main thread's collectives; the lock covers settle's use.
        self.store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=30),
            wait_for_workers=False,
        )
        # Keys of this launch only: a restarted elastic job gets a new restart count.
        run = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID") or "run"
        self.prefix = f"speedrun/{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self.peer: dict[str, Any] | None = None
        """The first rank that failed, when it is another: {"rank", "error", "traceback"}."""
        self.stop_signal: int | None = None
        self._deferring = False
        """Training defers stop signals to its next step boundary (World.stops_deferred): the first one is the loop's
        to act on (every rank stops at the same step, after a checkpoint); only a second ends the run from here."""
        self._deferred = 0
        self._defer_lock = threading.Lock()  # not _lock: that one may wait on the store
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._aborted = False
        self._signalled = False
        self._store_ok = True
        # A rank started by torchrun or `python -m run dist.nproc=N` has the launcher as its parent; should that
        # die without stopping it (SIGKILL, the OOM killer), the rank would run on alone: it stops itself.
        self._parent = os.getppid() if world.info.launcher in ("torchrun", "elastic") else None
        self._read, write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(write, False)
        self._write = write
        try:  # the main thread only; elsewhere (a launcher's worker thread) signals stay the main thread's
            self._previous_fd: int | None = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:
            self._previous_fd = None

    # -- the thread ---------------------------------------------------------------------------------------
    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                ready, _, _ = select.select([self._read], [], [], POLL_S)
                if ready:
                    self._read_signals()
            except OSError:
                return
            if self._parent is not None and os.getppid() != self._parent:
                log.warning("rank %d: the launching process is gone; stopping", self.world.rank)
                self._parent = None
                os.kill(os.getpid(), signal.SIGTERM)  # the usual way out: recorded as interrupted
            # A peer's failure first: torchrun signals the other ranks only after the failed rank has exited,
            # by which time its error is in the store.
            if self.peer is None and self._store_ok:
                peer = self.first_failure()
                if peer is not None and peer["rank"] != self.world.rank:
                    self.peer = peer
                    self._stop_run("failed", f"rank {peer['rank']}: {peer['error']}", peer.get("traceback", ""))
                    continue
            if self.stop_signal is not None and not self._signalled and self.peer is None:
                self._signalled = True
                self._stop_run("interrupted", f"interrupted (signal {signal.Signals(self.stop_signal).name})", "")

    def set_deferring(self, on: bool) -> None:
        """Start or end (or, on again, start afresh after the loop acted on a signal) the deferral. What the signal
        pipe holds is read first, under the deferral it arrived in: the loop has seen every signal whose handler
        ran, and its byte is in the pipe by then, so a signal the loop acted on is never acted on here later."""
        self._read_signals()
        with self._defer_lock:
            self._deferring, self._deferred = on, 0

    def _read_signals(self) -> None:
        with self._defer_lock:  # one reader at a time: this thread, or the main thread in set_deferring
            if self._read < 0:
                return
            try:
                data = os.read(self._read, 64)
            except BlockingIOError:  # the other reader emptied it
                return
            for signum in data:
                if signum not in (signal.SIGINT, signal.SIGTERM):
                    continue
                if self._deferring:
                    self._deferred += 1
                    if self._deferred < 2:  # the first is the loop's (it stops every rank at a step boundary)
                        continue
                if self.stop_signal is None:
                    self.stop_signal = signum

    def _stop_run(self, status: str, error: str, tb: str) -> None:
        if self.world.on_stop is not None:
            try:
                self.world.on_stop(status, error, tb)
            except Exception as e:  # noqa: BLE001 - the main thread still records the run
                log.warning("could not record %s early: %s: %s", status, type(e).__name__, e)
        self.abort()

    def abort(self) -> None:
        """Abort the NCCL communicators: a collective blocked on a rank that is gone returns with an error."""
        if self._aborted or not self.nccl:
            return
        self._aborted = True
        from torch.distributed.distributed_c10d import _abort_process_group

        try:
            _abort_process_group()
        except Exception as e:  # noqa: BLE001 - NCCL's own watchdog and timeout remain
            log.warning("rank %d: aborting NCCL: %s: %s", self.world.rank, type(e).__name__, e)

    def stop(self) -> None:
        self._stopped.set()
        if self._previous_fd is not None:
            try:
                signal.set_wakeup_fd(self._previous_fd)
            except ValueError:
                pass
            self._previous_fd = None
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=2 * POLL_S + 1)
        if not self.is_alive() and self._read >= 0:
            for fd in (self._read, self._write):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._read = self._write = -1  # closed once: the numbers may be reused by other files

    # -- the store ----------------------------------------------------------------------------------------
    def first_failure(self) -> dict[str, Any] | None:
        """The failure of the rank that failed first (maybe this one), or None."""
        try:
            with self._lock:
                if not self.store.check([self.prefix + "first"]):
                    return None
                first = int(self.store.get(self.prefix + "first"))
                return json.loads(self.store.get(self.prefix + f"failure/{first}"))
        except Exception as e:  # noqa: BLE001 - the store's host (the launcher's agent, or rank 0) has ended
            self._store_ok = False
            log.debug("rank %d: rendezvous store unreachable: %s", self.world.rank, e)
            return None

    def publish(self, error: str, tb: str) -> None:
        """This rank failed: its error for the others (who stop) and for rank 0's record."""
        rank = self.world.rank
        try:
            with self._lock:
                self.store.set(
                    self.prefix + f"failure/{rank}", json.dumps({"rank": rank, "error": error, "traceback": tb})
                )
                self.store.compare_set(self.prefix + "first", "", str(rank))  # the first to fail keeps the key
        except Exception as e:  # noqa: BLE001 - the others still stop when this process exits
            log.warning("rank %d: could not publish its failure: %s: %s", rank, type(e).__name__, e)

    def settle(self, result: dict[str, Any], exc: BaseException, run_dir: Any) -> None:
        peer = self.peer or (self.first_failure() if self._store_ok else None)
        if peer is not None and peer["rank"] != self.world.rank:
            result["status"] = "failed"
            result["error"] = f"rank {peer['rank']}: {peer['error']}"
            if peer.get("traceback"):
                Path(run_dir, "error.txt").write_text(f"rank {peer['rank']}:\n{peer['traceback']}")
            return
        if self.stop_signal is not None or isinstance(exc, KeyboardInterrupt):
            # a collective that the stop broke is part of the interrupt, not a failure of its own; an interrupt the
            # loop raised keeps its own words (the step it stopped at and its checkpoint)
            result["status"] = "interrupted"
            if not isinstance(exc, KeyboardInterrupt) or not str(exc):
                result["error"] = "interrupted (Ctrl-C or SIGTERM)"
            return
        self.publish(str(result.get("error")), traceback.format_exc())
        result["error"] = f"rank {self.world.rank}: {result.get('error')}"  # as every other rank names it
