"""Stop signals during training become a checkpoint at the end of the current step, then the stop.

Outside training (data, warm-up, evaluation, export) a signal stops the run at once, as speedrun.run.signals sets up.
Inside it, ``StopRequests.deferring`` catches SIGTERM and Ctrl-C (SIGINT) and only notes them; the loop checks
at each step boundary, writes a checkpoint (the model and optimizers are consistent only between steps) and then
stops: KeyboardInterrupt, recorded as interrupted. The same signal a second time stops at once.

Under submitit (the SLURM launcher; SUBMITIT_FOLDER is set in its jobs) the preemption/time-limit signal is
SIGUSR2, which submitit handles by calling the launcher's ``checkpoint`` (ours adds ``resume=<run dir>``,
hydra_plugins/speedrun_plugins/slurm_launcher.py), requeueing the job and exiting. We defer it like the others:
checkpoint first, then submitit's own handler, whose exit becomes ``Preempted``. submitit ignores SIGTERM (a
USR2 follows it on preemption), so there a SIGTERM writes a checkpoint and training goes on.

On several ranks a signal may reach one rank only (``kill`` of one process) or all of them at slightly different
times. Each rank notes its own (``level``); the loop folds the levels into the collective it runs after every step
anyway (World.agree_with_flags: the largest over the ranks), so every rank sees the same request at the same step
boundary, joins in the one checkpoint (rank 0 writes it) and stops, carries on or is preempted alike. The dist
guard leaves that first signal to the loop (World.stops_deferred); a second one ends the run at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

NONE, CARRY_ON, STOP, PREEMPT = 0, 1, 2, 3
"""What pending stop signals ask for, ordered so that the largest over the ranks is what they all do."""


class Preempted(KeyboardInterrupt):
    """The job was preempted or timed out under SLURM, checkpointed and requeued; it resumes by itself.
    ``exit_code``: the status submitit's handler exited with after requeueing, which the process ends with too:
    submitit's local executor restarts a job only when a task ends with its requeue status (144)."""

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code


def under_submitit() -> bool:
    return bool(os.environ.get("SUBMITIT_FOLDER"))


class StopRequests:
    def __init__(self) -> None:
        self.pending: list[int] = []
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return bool(self.pending)

    def _handler(self, signum: int, frame: Any) -> None:
        if signum in self.pending:  # the same signal again: the user or scheduler insists
            raise KeyboardInterrupt(f"signal {signum} (second)")
        self.pending.append(signum)

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """Note SIGTERM, SIGINT and (when a Python handler such as submitit's holds it) SIGUSR2 while training."""
        wanted = [signal.SIGTERM, signal.SIGINT]
        usr2 = getattr(signal, "SIGUSR2", None)
        if usr2 is not None and callable(signal.getsignal(usr2)):
            wanted.append(usr2)
        installed = []
        try:
            for sig in wanted:
                self._previous[sig] = signal.signal(sig, self._handler)
                installed.append(sig)
        except ValueError:  # not the main thread: signals stay as they were
            pass
        try:
            yield
        finally:
            for sig in installed:
                signal.signal(sig, self._previous[sig])

    def level(self, signals: list[int] | None = None) -> int:
        """What the pending signals (or ``signals``) ask for: NONE, CARRY_ON (SIGTERM under submitit: checkpoint
        and go on), STOP, or PREEMPT (SIGUSR2 under submitit). On several ranks the largest over the ranks is what
        every rank does."""
        pending = self.pending if signals is None else signals
        if not pending:
            return NONE
        usr2 = getattr(signal, "SIGUSR2", None)
        if usr2 in pending:
            return PREEMPT
        if under_submitit() and pending == [signal.SIGTERM]:
            return CARRY_ON  # submitit's convention: SIGTERM is not the end, USR2 will say if it is
        return STOP

    def act(
        self,
        steps: int,
        checkpointed: str | None,
        save: Callable[[], str | None],
        level: int | None = None,
        handed_over: Callable[[], None] = lambda: None,
        taken: list[int] | None = None,
    ) -> None:
        """At a step boundary with signals pending (here, or on another rank: ``level``, agreed over the ranks;
        default: this process's): checkpoint (``save``, unless ``checkpointed`` already names this step's file),
        then stop, requeue, or carry on (SIGTERM under submitit). On several ranks every rank calls this at the same
        step with the same level, so ``save`` (a collective) runs on all of them and all of them stop.
        ``handed_over`` (a barrier, on several ranks) runs on every rank once submitit's handler has run where it
        did: submitit requeues from global rank 0 alone and leaves the other tasks running, so they must not exit
        (SLURM may end the job step with them) before rank 0 has requeued. ``taken``: the signals ``level`` was
        agreed on (default: all pending now); only those are consumed, so one that came after the agreement (during
        this boundary's evaluation or checkpoint) stays pending for the next boundary."""
        level = self.level() if level is None else level
        pending = list(self.pending) if taken is None else list(taken)
        for signum in pending:
            if signum in self.pending:
                self.pending.remove(signum)
        if level == NONE:
            return
        path = checkpointed or save()
        where = f"checkpoint {path}" if path else "no checkpoint (checkpoint.on_signal=false)"
        if level == PREEMPT:
            outcome = self._hand_over(pending, steps, where)
            handed_over()
            raise outcome
        if level == CARRY_ON:
            return
        which = f"signal {pending[0]}" if pending else "a stop signal on another rank"
        raise KeyboardInterrupt(f"{which} at step {steps}: {where}")

    def _hand_over(self, pending: list[int], steps: int, where: str) -> BaseException:
        """Run submitit's own handler (deferring() took SIGUSR2 over only from there), whichever rank got the
        signal: on global rank 0 it requeues the job and exits, on the others it returns. The exception this rank
        then stops with."""
        usr2 = getattr(signal, "SIGUSR2", None)
        previous = self._previous.get(usr2) if usr2 is not None else None
        whose = "" if usr2 in pending else " (another rank's SIGUSR2)"
        if not callable(previous):
            return Preempted(f"preempted at step {steps}{whose}: {where}")
        try:
            previous(usr2, None)  # submitit: launcher.checkpoint -> requeue (global rank 0) -> sys.exit
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else None
            return Preempted(f"preempted at step {steps}{whose}: {where}; job requeued (resumes by itself)", code)
        except BaseException as e:  # noqa: BLE001 - e.g. submitit's "not requeued": raised once the ranks met
            return e
        return Preempted(f"signal {usr2} at step {steps}{whose}: {where}")
