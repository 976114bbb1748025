"""The pool of the ``pool`` launcher (speedrun_plugins.pool_launcher): prepared jobs run as processes over the slots
(GPUs, or CPU slots), the main thread polling and one thread per job copying its output; fail-fast, Ctrl-C and a
second Ctrl-C handled as the launcher's docstring says, and the record of a job that died without writing its own.
"""

import copy
import logging
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from speedrun.config.objective import DEFAULT_OBJECTIVE
from speedrun.paths import results_db_path
from speedrun.records.identity import GPU_SHARED_ENV
from speedrun.records.objective import Objective, objective_of
from speedrun.records.store import ResultsDB
from speedrun.run.signals import sigterm_as_interrupt

from .gpu_slots import take_slots
from .job_io import pump_output, read_json

log = logging.getLogger(__name__)


class JobFailed(Exception):
    """A pool job that ended with a failure (its own dir holds error.txt and console.log)."""

    def __init__(self, message: str, status: str = "failed"):
        super().__init__(message)
        self.status = status


class JobNotRun(Exception):
    """A job the pool never started (fail-fast or interrupted)."""

    status = "not_run"


@dataclass
class ScoredFailure(JobReturn):
    """The return of a job that failed and recorded it (failed, out of memory, refused): status FAILED with the
    JobFailed in ``_return_value``, as the speedrun sweeper reads it, but a ``return_value`` that is the worst
    objective rather than a raise. Hydra's adaptive sweepers (Optuna, Ax, Nevergrad) read only ``return_value``;
    a raise there makes Optuna's stop the whole sweep at the first failed trial."""

    objective: Objective | None = None

    @property
    def return_value(self) -> Any:
        return self.objective

    @return_value.setter
    def return_value(self, value: Any) -> None:
        self._return_value = value


SCORED_FAILURES = ("failed", "oom")
"""Job statuses that are a result of the trial's settings, scored as the worst objective; an interrupted or unrun
job is no result, and its return raises as Hydra's does."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def set_stop_handlers(handler: Any) -> None:
    for signum in STOP_SIGNALS:
        try:
            signal.signal(signum, handler)
        except ValueError:  # not the main thread: signals are the main thread's to handle
            return


def record_death(job: "Job", status: str, why: str) -> None:
    """A job that died without writing its record (SIGKILL, the OOM killer, a segfault) would stay `running` in
    results.sqlite forever: close its row from here."""
    db_path = results_db_path(job.config.get("results_db"))
    try:
        ResultsDB(db_path).upsert(
            str(job.job_dir.resolve()), {"status": status, "error": why, "finished_at": time.time()}
        )
    except Exception as e:  # noqa: BLE001 - the sweep goes on; the console already says what happened
        log.warning(f"could not record job #{job.num} as {status} in {db_path}: {e}")


def row_still_running(job: "Job") -> bool:
    """Whether the job's results.sqlite row still says running: a job killed between writing its result.json and
    its row (a second Ctrl-C) leaves the two apart, and only the launcher can close the row."""
    try:
        rows = ResultsDB(results_db_path(job.config.get("results_db"))).rows(
            "run_id = ?", (str(job.job_dir.resolve()),)
        )
    except Exception:  # noqa: BLE001 - unreadable: record_death says why if it cannot write either
        return True
    return any(r.get("status") == "running" for r in rows)


@dataclass
class Job:
    num: int
    overrides: list[str]
    config: DictConfig
    job_dir: Path
    cmd: list[str]
    gpus: int = 1
    """GPUs the job needs at once: its dist.nproc (a CPU slot runs any job)."""
    objective: str = DEFAULT_OBJECTIVE
    """The result key the job returns to the sweeper (its ``objective`` setting)."""
    maximise: bool = False
    """The sweeper maximises the objective: a failed job then scores -inf, not inf."""
    slots: list[int] | None = None
    proc: subprocess.Popen | None = None
    pump: threading.Thread | None = None
    started: float = 0.0
    ret: JobReturn | None = None
    killed: str | None = None
    """Why the pool killed the job (SIGKILL), if it did: it could not record itself, so the pool records it."""


class Pool:
    """Runs prepared jobs over the slots; the main thread polls, one thread per job copies its output."""

    def __init__(
        self,
        slots: list[str | None],
        fail_fast: bool,
        echo: bool,
        stop_timeout_s: float,
        signals: list[int] | None = None,
        hold_stops: bool = False,
    ):
        """``signals``: where the stop signals received are noted (a list of its own by default). ``hold_stops``:
        once interrupted, keep handling stop signals after ``run`` returns, until the process ends (the launcher:
        the sweep is ending and still has its manifest and summary to write); else the handlers ``run`` found are
        put back."""
        self.slots, self.fail_fast, self.echo, self.stop_timeout_s = slots, fail_fast, echo, stop_timeout_s
        self.interrupted = False
        self.stopping: str | None = None
        self.signals = signals if signals is not None else []
        self.hold_stops = hold_stops
        self.forced = False
        """A second stop signal came: the running jobs were killed."""
        self._running: list[Job] = []

    def run(self, jobs: list[Job]) -> list[JobReturn]:
        outer = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        try:
            with sigterm_as_interrupt():
                return self._run(jobs)
        finally:
            if self.interrupted:  # _run put _stop_again in place; sigterm_as_interrupt has since reset SIGTERM
                if self.hold_stops:
                    set_stop_handlers(self._stop_again)
                else:
                    for signum, handler in outer.items():
                        if handler is not None:  # None: set outside Python, nothing to put back
                            try:
                                signal.signal(signum, handler)
                            except ValueError:  # not the main thread: _run could not take them either
                                break

    def _stop_again(self, signum: int, frame: Any) -> None:
        """A stop signal after the first: kill the running jobs now (the loop records them); after a third, leave at
        once. Never raises, so the cleanup it lands in (the jobs' records, sweep.json, the summary) runs on."""
        self.signals.append(signum)
        if self.forced:
            os.write(
                2, b"interrupted three times: exiting now; sweep.json and the summary may not say how the jobs ended\n"
            )
            os._exit(128 + self.signals[0])
        self.forced = True
        for job in self._running:
            if job.proc is not None and job.proc.poll() is None:
                job.killed = f"killed by a second {_signal_name(signum)} while it stopped"
                job.proc.kill()

    def _echoing(self) -> bool:
        # Once stopping, the console gets the pool's word on each job, not what the jobs print as they stop
        # (console.log keeps it): a terminal's Ctrl-C reaches the jobs too, and a job hit by a second one while it
        # exits prints a traceback of its own
        return self.echo and not self.interrupted

    def _run(self, jobs: list[Job]) -> list[JobReturn]:
        pending = deque(jobs)
        running: list[Job] = []
        self._running = running
        free = list(range(len(self.slots)))
        try:
            while pending or running:
                while pending and free and self.stopping is None:
                    slots = take_slots(self.slots, free, pending[0].gpus)
                    if slots is None:  # in order: the next job waits for enough free GPUs
                        break
                    if not slots:  # more than the pool has: it can never start
                        self._refuse(pending.popleft())
                        continue
                    running.append(self._start(pending.popleft(), slots))
                if self.stopping is not None:
                    while pending:
                        self._not_run(pending.popleft())
                for job in [j for j in running if j.proc is not None and j.proc.poll() is not None]:
                    running.remove(job)
                    free.extend(job.slots or [])
                    self._finish(job)
                    if (
                        job.ret is not None
                        and job.ret.status == JobStatus.FAILED
                        and self.fail_fast
                        and self.stopping is None
                    ):
                        self.stopping = f"fail_fast: job #{job.num} failed"
                        log.error(
                            f"{self.stopping}; stopping {len(running)} running job(s), not starting {len(pending)}"
                        )
                        self._terminate(running)
                time.sleep(0.05)
        except KeyboardInterrupt as e:
            # first thing: from here on a stop signal kills the running jobs (_stop_again) instead of raising
            # into this cleanup, which would leave no record of how the sweep ended
            set_stop_handlers(self._stop_again)
            self.signals.append(signal.SIGTERM if f"signal {int(signal.SIGTERM)}" in str(e) else signal.SIGINT)
            self.interrupted = True
            self.stopping = "interrupted"
            log.error(
                f"interrupted: stopping {len(running)} running job(s) ({_signal_name(self.signals[0])} again kills "
                f"them), not starting {len(pending)}"
            )
            while pending:
                self._not_run(pending.popleft())
            self._drain(running)
        for job in jobs:  # an interrupt between two steps above can leave a job without its return
            if job.ret is None:
                if job.proc is not None and job.proc.poll() is not None:
                    self._finish(job)
                else:
                    self._not_run(job)
        returns = [j.ret for j in jobs if j.ret is not None]
        assert len(returns) == len(jobs)  # the loop above gave every job its return
        return returns

    def _start(self, job: Job, slots: list[int]) -> Job:
        gpu = ",".join(g for g in (self.slots[i] for i in slots) if g is not None) or None
        env = {**os.environ, "PYTHONUNBUFFERED": "1", GPU_SHARED_ENV: "0"}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
            # jobs_per_gpu > 1: the run records gpu_shared (speed is not the card's alone)
            if any(self.slots.count(self.slots[i]) > 1 for i in slots):
                env[GPU_SHARED_ENV] = "1"
        if len(self.slots) > 1 and "OMP_NUM_THREADS" not in os.environ:
            # parallel jobs share the cores: without this each one starts a thread per core and they thrash
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // len(self.slots)))
        job.job_dir.mkdir(parents=True, exist_ok=True)
        job.slots, job.started = slots, time.time()
        log.info(
            f"#{job.num} {' '.join(filter_overrides(job.overrides))}" + (f" -> GPU {gpu}" if gpu is not None else "")
        )
        job.proc = subprocess.Popen(
            job.cmd,
            env=env,
            cwd=os.getcwd(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            errors="replace",
        )
        prefix = f"[#{job.num}] " if len(self.slots) > 1 else ""
        job.pump = threading.Thread(
            target=pump_output, args=(job.proc, job.job_dir / "console.log", self._echoing, prefix), daemon=True
        )
        job.pump.start()
        return job

    def _finish(self, job: Job) -> None:
        assert job.proc is not None
        if job.pump is not None:
            job.pump.join(timeout=10)
        rc = job.proc.returncode
        seconds = time.time() - job.started
        result = read_json(job.job_dir / "result.json")
        status = result.get("status") if result else None
        ret = _job_return(job)
        # after a second Ctrl-C the console gets one line at the end; each job's outcome is in sweep.json
        say: Callable[..., None] = log.debug if self.forced else log.info
        # a job killed after it recorded ok (in its teardown) did finish ok
        if (rc == 0 or (job.killed and status == "ok")) and status not in ("failed", "interrupted", "running"):
            ret.status = JobStatus.COMPLETED
            ret.return_value = objective_of(result, job.objective, job.maximise)
            metrics = "  ".join(
                f"{k} {result[k]:.4g}"
                for k in ("val_bpb", "val_bpb_quant", "tokens_per_s")
                if result and isinstance(result.get(k), (int, float))
            )
            say(f"#{job.num} {status or 'done'} in {seconds:.1f}s  {metrics}  ({job.job_dir})")
        else:
            if job.killed and status in (None, "running"):  # killed before it could record itself
                status, why = "interrupted", job.killed
            else:
                status = status if status not in (None, "running", "ok") else "failed"
                why = (result or {}).get("error") or f"exited with code {rc}: see {job.job_dir / 'console.log'}"
            if not result or result.get("status") == "running" or row_still_running(job):
                record_death(job, status, why)
            if status in SCORED_FAILURES:
                ret = _scored(job, {**(result or {}), "status": status, "error": why})
            ret.status = JobStatus.FAILED
            ret.return_value = JobFailed(f"job #{job.num} ({' '.join(job.overrides)}) {status}: {why}", status)
            (log.debug if self.forced else log.error)(f"#{job.num} {status} in {seconds:.1f}s: {why}  ({job.job_dir})")
        job.ret = ret

    def _refuse(self, job: Job) -> None:
        gpus = len({g for g in self.slots if g is not None})
        why = f"dist.nproc={job.gpus} needs {job.gpus} GPUs at once; the pool has {gpus}"
        log.error(f"#{job.num} failed: {why}")
        record_death(job, "failed", why)
        ret = _scored(job, {"status": "failed", "error": why})
        ret.status = JobStatus.FAILED
        ret.return_value = JobFailed(f"job #{job.num} ({' '.join(job.overrides)}) failed: {why}")
        job.ret = ret

    def _not_run(self, job: Job) -> None:
        ret = _job_return(job)
        ret.status = JobStatus.FAILED
        ret.return_value = JobNotRun(f"job #{job.num} ({' '.join(job.overrides)}) not run: {self.stopping}")
        job.ret = ret

    def _terminate(self, running: list[Job]) -> None:
        for job in running:
            if job.proc is not None and job.proc.poll() is None:
                job.proc.terminate()

    def _drain(self, running: list[Job]) -> None:
        """After Ctrl-C: SIGTERM the running jobs, give them stop_timeout_s to record themselves, then SIGKILL.
        A second Ctrl-C kills them at once (_stop_again); either way each gets its return and its record."""
        self._terminate(running)
        deadline = time.time() + self.stop_timeout_s
        while any(j.proc is not None and j.proc.poll() is None for j in running):
            if time.time() > deadline:
                for j in running:
                    if j.proc is not None and j.proc.poll() is None:
                        j.killed = f"killed: still running {self.stop_timeout_s:g} s after SIGTERM"
                        j.proc.kill()
            time.sleep(0.1)
        for job in running:
            if job.proc is not None:
                job.proc.wait()
                self._finish(job)


def _signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _scored(job: Job, record: dict[str, Any]) -> ScoredFailure:
    ret = ScoredFailure(objective=objective_of(record, job.objective, job.maximise))
    _fill(job, ret)
    return ret


def _job_return(job: Job) -> JobReturn:
    ret = JobReturn()
    _fill(job, ret)
    return ret


def _fill(job: Job, ret: JobReturn) -> None:
    ret.overrides = list(job.overrides)
    task_cfg = copy.deepcopy(job.config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    ret.cfg = task_cfg
    ret.hydra_cfg = job.config
    ret.working_dir = os.getcwd()
    ret.task_name = str(OmegaConf.select(job.config, "hydra.job.name", default=""))
