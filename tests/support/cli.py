"""`python -m run` in a process of its own (a new interpreter, or forked from the test's): one run (run_cli), and a run
that the whole pytest session shares (shared_cli_run, which conftest's default_smoke_run fixture runs once)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

SWEEP_TINY = [
    "hardware=cpu",
    "model=tiny",
    "hardware.micro_batch=4",
    "budget.tokens_per_step=2048",
    "eval.tokens=2048",
    "logger.log_every_seconds=0.5",
    "budget.train_seconds=2",
    "budget.max_steps=4",
    "budget.warmup_steps=0",
]
"""A sweep's job as a tiny CPU run of 4 steps (or 2 s, whichever ends first), no warm-up step and a shorter eval:
every job is a real run, just short (a 2 s budget alone ran ~10 steps a job, which no assertion needs)."""


def run_cli(args, cwd, timeout=300, env_extra=None, fork=False):
    """Run `python -m run ...` (the real entry point) in a new interpreter and return the CompletedProcess. ``fork``:
    src/run.py as `__main__` in a child forked from this process instead, which finds torch, Hydra and speedrun
    imported (a new interpreter spends ~9 s of CPU on them before its first line of work): for one run or resume
    whose outcome depends on its arguments and files only, which starts no launcher (a sweep's pool, torchrun's
    ranks), takes no signal from the test, and is not about what a new interpreter imports or puts on sys.path. An
    ``env_extra`` always gets a new interpreter (PYTHONPATH's sitecustomize acts at start-up)."""
    if not fork or env_extra or not hasattr(os, "fork"):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
        return subprocess.run(
            [sys.executable, "-m", "run", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    return run_python(["-m", "run", *args], cwd, timeout)


WARM = ("run", "torch._dynamo", "speedrun.run.job", "speedrun.run.cli_step")
"""What a forked run finds imported: run.py's own imports, what a run and --plan import, torch._dynamo (a torch
optimizer's first construction imports it: ~3 s). A name that is gone is skipped: the child imports what it needs."""


def _warm() -> None:
    import importlib

    for name in WARM:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _target(args: list[str], cwd: Path) -> tuple[str | None, list[str], str]:
    """(module or None, sys.argv, sys.path's first entry) of `python ARGS` started in ``cwd``."""
    module = args[1] if args[0] == "-m" else None
    argv = [module, *args[2:]] if module else [str(args[0]), *args[1:]]
    return module, argv, str(cwd) if module else str(Path(args[0]).resolve().parent)


def _child(args: list[str], cwd: Path, out_fd: int, err_fd: int) -> None:
    """In a forked child: become `python ARGS` in ``cwd`` with stdout and stderr on the given fds (fds 1 and 2, and
    sys.stdout/stderr over them), SIGINT and SIGTERM as a new interpreter has them, and end as an interpreter does
    (SystemExit's code or message, a traceback and 1 for an exception, logging flushed). Never returns."""
    import runpy
    import signal

    code = 1
    try:
        module, argv, first = _target(args, cwd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # never the xdist worker's channel
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # pytest's capture replaced the parent's
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(cwd)
        os.environ["PYTHONUNBUFFERED"] = "1"
        sys.path.insert(0, first)
        sys.argv = argv
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()  # as a new interpreter has it: no config dir initialized
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)  # sys.exit("error: ...") prints its message
        except BaseException:
            import traceback

            traceback.print_exc()
    finally:
        try:
            import logging

            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_python(args: list[str], cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python ARGS` (``["-m", module, ...]`` or ``[script, ...]``) in a child of this process, its stdout and stderr
    in files of its own: it starts in ``cwd`` with cwd (`-m`) or the script's folder first on sys.path, as python
    puts them (see _child). Killed with SIGKILL after ``timeout`` s, as subprocess.run would, raising
    TimeoutExpired. For a command whose outcome depends on its arguments and files only: the child finds this
    process's imports (torch's ~5 s of CPU is not spent again) and its module state."""
    import signal
    import tempfile
    import time

    cwd = Path(cwd)
    _, argv, _ = _target(args, cwd)
    _warm()  # once per process: later calls find them in sys.modules
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            _child(args, cwd, out.fileno(), err.fileno())
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(argv, timeout)
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status), stdout, stderr)


class Forked:
    """`python ARGS` forked from this process and left running, as subprocess.Popen(..., stdout=PIPE,
    stderr=STDOUT, text=True) would start it: for a test that reads its console as it goes and signals it (pid,
    stdout, poll, wait, send_signal, kill, communicate, returncode, args). See run_python for when to fork."""

    def __init__(self, args: list[str], cwd):
        cwd = Path(cwd)
        _, self.args, _ = _target(args, cwd)
        _warm()
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            os.close(read)
            _child(args, cwd, write, write)
        os.close(write)
        self.stdout = open(read, encoding="utf-8", errors="replace")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)
        if self.returncode is None:
            self.wait()

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        """The rest of its console (until it closes it), then its exit; TimeoutExpired past ``timeout`` s."""
        import threading
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.append(self.stdout.read()), daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.stdout.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return rest[0], None


def session_dir(tmp_path_factory) -> Path:
    """A directory of this pytest session that every xdist worker sees: pytest-N/, above each worker's own
    pytest-N/popen-gwK/ (without xdist, the pytest session's base temp dir)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@dataclasses.dataclass(frozen=True)
class SharedRun:
    """A finished `python -m run` that several tests read: its console (proc), working dir, run dir and database."""

    proc: subprocess.CompletedProcess
    cwd: Path
    run_dir: Path
    db: Path


def shared_cli_run(tmp_path_factory, name: str, args: list[str], timeout: int = 300) -> SharedRun:
    """Run `python -m run <args>` once per pytest session, whichever test or xdist worker asks first (the others wait
    on a lock, then read the same run), with hydra.run.dir and results_db in a directory of its own. For tests that
    only read what the run left: one that writes to its run dir or database gets a run of its own instead. The
    outcome is kept whatever it was; each test asserts on it (proc.returncode first)."""
    import fcntl
    import json

    cwd = session_dir(tmp_path_factory) / f"shared-run-{name}"
    run_dir, db, record = cwd / "run", cwd / "r.sqlite", cwd / "console.json"
    with open(session_dir(tmp_path_factory) / f".shared-run-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            cwd.mkdir(exist_ok=True)
            proc = run_cli([*args, f"hydra.run.dir={run_dir}", f"results_db={db}"], cwd=cwd, timeout=timeout, fork=True)
            record.write_text(
                json.dumps({"args": proc.args, "rc": proc.returncode, "out": proc.stdout, "err": proc.stderr})
            )
    saved = json.loads(record.read_text())
    proc = subprocess.CompletedProcess(saved["args"], saved["rc"], saved["out"], saved["err"])
    return SharedRun(proc, cwd, run_dir, db)
