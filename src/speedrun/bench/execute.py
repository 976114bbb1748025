"""Running steps as processes: several at once, each in a process group of its own so that a timeout or Ctrl-C
stops all of a run (torchrun's ranks included), or one stopped with SIGTERM after its warm-up and then resumed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

from speedrun.bench.spec import RunArm
from speedrun.bench.steps import Step


def execute(steps: Sequence[Step], timeout_s: float) -> list[tuple[int | None, float]]:
    """Start ``steps`` at once and wait for all: (exit code or None for a timeout, seconds) for each."""
    started = []
    for step in steps:
        if step.run_dir.exists():
            shutil.rmtree(step.run_dir)
        step.log.unlink(missing_ok=True)
        step.run_dir.mkdir(parents=True)
        f = open(step.log, "w")  # noqa: SIM115 - closed below, after the process ends
        # a session of its own: a timeout stops the run's whole process group (torchrun's ranks included)
        proc = subprocess.Popen(
            step.argv,
            cwd=step.cwd,
            env={**os.environ, **step.env},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append((proc, f, time.monotonic()))
    out: list[tuple[int | None, float]] = []
    try:
        for proc, f, t0 in started:
            left = max(1.0, timeout_s - (time.monotonic() - t0))
            try:
                rc: int | None = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                _stop(proc)
                rc = None
            f.close()
            out.append((rc, time.monotonic() - t0))
    except BaseException:
        # Ctrl-C reaches this process only (each run has a session of its own): stop the runs before leaving, or
        # they would train on with nobody to read them
        for proc, f, _ in started:
            _stop(proc)
            f.close()
        raise
    return out


def execute_stopped(step: Step, timeout_s: float) -> tuple[int | None, float]:
    """The run, SIGTERM ``stop_after_s`` seconds after its console says ``warm-up done``, then its resume: the
    resume's exit code (None for a timeout) and the seconds of both parts."""
    assert isinstance(step.arm, RunArm) and step.arm.stop_after_s is not None
    t0 = time.monotonic()
    if step.run_dir.exists():
        shutil.rmtree(step.run_dir)
    step.run_dir.mkdir(parents=True)
    with open(step.log, "w") as f:
        proc = subprocess.Popen(
            step.argv, cwd=step.cwd, env={**os.environ, **step.env}, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        warm = None
        try:
            while proc.poll() is None and time.monotonic() - t0 < timeout_s:
                if warm is None and "warm-up done" in step.log.read_text(errors="replace"):
                    warm = time.monotonic()
                if warm is not None and time.monotonic() - warm >= step.arm.stop_after_s:
                    # the launcher only, as a scheduler's SIGTERM reaches a job: it passes the signal to its ranks
                    os.kill(proc.pid, signal.SIGTERM)
                    break
                time.sleep(1.0)
            proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            _stop(proc)
            return None, time.monotonic() - t0
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
    return rc, time.monotonic() - t0


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
