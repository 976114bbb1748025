"""Shared fixtures: compose the real config tree, and fake devices for the resolver; how the suite runs in parallel."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# One intra-op thread for torch, here and in every process a test starts (they inherit the environment): set before
# any test module imports torch. The suite runs on pytest-xdist workers (pyproject's addopts: -n auto), each one
# busy on a core; with torch's default of one OpenMP thread per core, the threads spin against the other worker
# and the CLI runs' subprocesses, and a smoke run measured 10 times slower (74 s against 7 s) on a 2-core machine
# that had other work. The models here are tiny: one thread loses nothing. An OMP_NUM_THREADS already set wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: no error where xdist is not installed
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per CPU this process may use, except for a run that selects the gpu-marked tests (one
    device: they run in one process, as scripts/gpu_tests.sh runs them, which also drops addopts)."""
    markexpr = config.getoption("markexpr", "") or ""
    if "gpu" in markexpr and "not gpu" not in markexpr:
        return 0
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_COMPOSED: dict[tuple, object] = {}
"""What the compose fixture composed in this process, by its arguments (and the conf dir and working dir, which the
hydra.* part records). Never handed out itself: each call gets a copy of its own."""


@pytest.fixture
def compose():
    """compose(["attn=sdpa", ...]) -> DictConfig, from the real conf/ tree, as `python -m run` would. Every call
    returns a config of its own; the same arguments composed again in this process (parametrized tests, a file's
    tests, files on this xdist worker) get a deep copy of the first composition (~5 ms, where Hydra takes ~0.25 s)."""
    import copy

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from speedrun.config import CONF_DIR, register_configs

    register_configs()

    def _compose(overrides=(), return_hydra_config=False):
        key = (tuple(overrides), bool(return_hydra_config), str(CONF_DIR), os.getcwd())
        if key not in _COMPOSED:  # a compose error is raised every time: only compositions are kept
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                _COMPOSED[key] = hydra_compose(
                    "config", overrides=list(overrides), return_hydra_config=return_hydra_config
                )
        return copy.deepcopy(_COMPOSED[key])

    return _compose


def session_dir(tmp_path_factory) -> Path:
    """A directory of this pytest session that every xdist worker sees: pytest-N/, above each worker's own
    pytest-N/popen-gwK/ (without xdist, the pytest session's base temp dir)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """data.cache_dir for CLI and in-process runs: the embedded dataset is built once per pytest session (per
    vocabulary size), by the first run that needs it, and shared by every test that asks for this fixture, on every
    xdist worker (ensure_embedded_dataset serialises concurrent builders on a lock file)."""
    path = session_dir(tmp_path_factory) / "speedrun-data-cache"
    path.mkdir(exist_ok=True)
    return path


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
            proc = run_cli([*args, f"hydra.run.dir={run_dir}", f"results_db={db}"], cwd=cwd, timeout=timeout)
            record.write_text(
                json.dumps({"args": proc.args, "rc": proc.returncode, "out": proc.stdout, "err": proc.stderr})
            )
    saved = json.loads(record.read_text())
    proc = subprocess.CompletedProcess(saved["args"], saved["rc"], saved["out"], saved["err"])
    return SharedRun(proc, cwd, run_dir, db)


@pytest.fixture(scope="session")
def default_smoke_run(tmp_path_factory, data_cache) -> SharedRun:
    """The default job as a CPU smoke run (`python -m run debug=smoke`, data from data_cache), run once for the
    whole pytest session: tests/test_experiments.py and tests/test_cli.py check what it recorded,
    tests/test_dist_cli.py compares a two-rank run with it and tests/test_ttt_table.py test-time trains copies of
    it. Read its run dir and database; never write to them (its database must keep its one row)."""
    return shared_cli_run(tmp_path_factory, "smoke", ["debug=smoke", f"data.cache_dir={data_cache}"])


def fake_device(profile_name: str, name: str | None = None):
    """A DetectedDevice for a profile, as detect() would report it on that card (``name``: another card name)."""
    from speedrun.hardware.profiles import device_for

    return device_for(profile_name, name or ("test cpu" if profile_name == "cpu" else None))


RANK_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "speedrun.run.runner", "speedrun.training.build"]
"""What the ranks of start_ranks find already imported: torch (~1.3 s of CPU), dynamo (~1.2 s; torch.optim imports
it when an optimizer is built) and speedrun's run and training code."""


def start_ranks(fn, args: tuple, nprocs: int = 2) -> None:
    """fn(rank, *args) on ``nprocs`` processes, waited for; an exception in a rank fails the call (torch's
    start_processes). Each rank is a fresh process, forked from multiprocessing's fork server, which imported
    RANK_PRELOAD once for this xdist worker: a spawned interpreter would import them again for every rank. The server
    starts at the first call, from this process as it is then; a rank gets its sys.path and working dir from the
    caller (as a spawned one does) and sets its own rendezvous variables (MASTER_PORT, RANK, ...)."""
    import multiprocessing

    import torch.multiprocessing

    multiprocessing.set_forkserver_preload(RANK_PRELOAD)  # read when the server starts: the first call
    torch.multiprocessing.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def run_cli(args, cwd, timeout=300, env_extra=None):
    """Run `python -m run ...` in a subprocess (the real entry point) and return the CompletedProcess."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "run", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
