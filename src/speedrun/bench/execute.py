"""Running steps as processes: several at once, each in a process group of its own so that a timeout or Ctrl-C
stops all of a run (torchrun's ranks included), or one stopped with SIGTERM after its warm-up and then resumed.

While a run goes, its log is read as it grows, so the moment its timed training began (the step's ``ready`` line:
speedrun's ``ready to train``, a peer's first training step) is known to within ``POLL_S``: the run's
``startup_seconds``, imports, data, compiling and warm-up steps, measured alike for speedrun and a peer script,
which prints no clock of its own. The same reading opens a wave's start gate (speedrun.run.hooks): once
every peer run has begun training, the speedrun runs beside them may begin theirs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from speedrun.bench.spec import RunArm
from speedrun.bench.steps import Step

POLL_S = 0.5
"""How often a running step is looked at: its exit, its timeout and its log's new lines."""


@dataclass(frozen=True)
class Outcome:
    """How a step's process ended: its exit code (None: stopped at its timeout), its seconds, and the seconds from
    its start until its log showed its ``ready`` line (None: never, or the step names none)."""

    rc: int | None
    seconds: float
    ready_s: float | None = None


class ReadyWatch:
    """Finds the first line of a growing log that matches ``pattern`` and when it was first seen."""

    def __init__(self, log: Path, pattern: str | None, t0: float) -> None:
        self.log, self.t0 = log, t0
        self.pattern = re.compile(pattern) if pattern else None
        self.offset, self.partial = 0, b""
        self.ready_s: float | None = None

    def poll(self) -> None:
        if self.pattern is None or self.ready_s is not None:
            return
        try:
            with open(self.log, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        if any(self.pattern.search(line.decode(errors="replace")) for line in lines):
            self.ready_s = time.monotonic() - self.t0


@dataclass
class _Running:
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    t0: float
    watch: ReadyWatch
    opens_gate: bool
    """A run without a start gate of its own: the gated runs of its wave wait for it to begin training."""
    outcome: Outcome | None = None


def execute(steps: Sequence[Step], timeout_s: float) -> list[Outcome]:
    """Start ``steps`` at once and wait for all: an Outcome for each, in order."""
    running: list[_Running] = []
    try:
        for step in steps:
            if step.run_dir.exists():
                shutil.rmtree(step.run_dir)
            step.log.unlink(missing_ok=True)
            if step.gate is not None:
                step.gate.unlink(missing_ok=True)
            step.run_dir.mkdir(parents=True)
            f = open(step.log, "wb")  # noqa: SIM115 - closed below, after the process ends
            # a session of its own: a timeout stops the run's whole process group (torchrun's ranks included)
            proc = subprocess.Popen(
                step.argv,
                cwd=step.cwd,
                env={**os.environ, **step.env},
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            t0 = time.monotonic()
            running.append(_Running(proc, f, t0, ReadyWatch(step.log, step.ready, t0), step.gate is None))
        gates = {s.gate for s in steps if s.gate is not None}
        while any(r.outcome is None for r in running):
            if gates and all(r.outcome is not None or r.watch.ready_s is not None for r in running if r.opens_gate):
                for gate in gates:  # every ungated run has begun training (or ended): the gated ones may start
                    gate.touch()
                gates = set()
            for r in running:
                if r.outcome is not None:
                    continue
                r.watch.poll()
                rc = r.proc.poll()
                if rc is None and time.monotonic() - r.t0 < timeout_s:
                    continue
                if rc is None:
                    _stop(r.proc)
                r.log.close()
                r.watch.poll()  # the lines written since the last look
                r.outcome = Outcome(rc, time.monotonic() - r.t0, r.watch.ready_s)  # rc None: stopped at its timeout
            time.sleep(POLL_S)
    except BaseException:
        # Ctrl-C reaches this process only (each run has a session of its own): stop the runs before leaving, or
        # they would train on with nobody to read them
        for r in running:
            _stop(r.proc)
            r.log.close()
        raise
    return [r.outcome for r in running if r.outcome is not None]


def execute_stopped(step: Step, timeout_s: float) -> Outcome:
    """The run, SIGTERM ``stop_after_s`` seconds after its ``ready`` line (speedrun's ``ready to train``), then its
    resume: the resume's exit code (None for a timeout), the seconds of both parts and the first part's
    ``ready_s``."""
    assert isinstance(step.arm, RunArm) and step.arm.stop_after_s is not None and step.ready
    if step.run_dir.exists():
        shutil.rmtree(step.run_dir)
    step.run_dir.mkdir(parents=True)
    with open(step.log, "w") as f:
        proc = subprocess.Popen(
            step.argv, cwd=step.cwd, env={**os.environ, **step.env}, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        t0 = time.monotonic()
        watch = ReadyWatch(step.log, step.ready, t0)
        try:
            while proc.poll() is None and time.monotonic() - t0 < timeout_s:
                watch.poll()
                if watch.ready_s is not None and time.monotonic() - t0 - watch.ready_s >= step.arm.stop_after_s:
                    # the launcher only, as a scheduler's SIGTERM reaches a job: it passes the signal to its ranks
                    os.kill(proc.pid, signal.SIGTERM)
                    break
                time.sleep(POLL_S)
            proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            _stop(proc)
            return Outcome(None, time.monotonic() - t0, watch.ready_s)
        except BaseException:
            _stop(proc)
            raise
    with open(step.log, "a") as f:
        f.write(f"\n[speedrun.bench] stopped with SIGTERM; resuming: {step.shell(step.resume_argv)}\n")
        f.flush()
        proc = subprocess.Popen(
            step.resume_argv, cwd=step.cwd, env={**os.environ, **step.env}, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc = None
        except BaseException:
            _stop(proc)
            raise
    return Outcome(rc, time.monotonic() - t0, watch.ready_s)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the run's process group (speedrun records an interrupted row), SIGKILL 30 s later."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
