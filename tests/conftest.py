"""Shared fixtures: compose the real config tree, the embedded dataset and the smoke run every test may read; how
the suite runs in parallel. What the tests import (CLI runs, fake devices, the two-rank harness, the tiny models)
is in tests/support/."""

from __future__ import annotations

import math
import os

import pytest

from support.cli import SharedRun, session_dir, shared_cli_run

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


FILE_SECONDS = "speedrun/file_seconds"
"""The pytest cache's key for what each test file took in the last run that ran it: {file: seconds}."""


FIRST = {"tests/e2e/test_busy_cpu.py"}
"""Files that start before any other: the busy-CPU test's two spinners take both cores from the other worker while
the default job trains beside them, so it runs at the start, not beside the long tail."""

MEASURED = {
    "tests/e2e/test_optuna_sweep.py": 114.0,
    "tests/ttt/test_ttt_compiled.py": 140.0,
    "tests/e2e/test_faults.py": 135.0,
    "tests/ttt/test_ttt_causality.py": 30.0,
    "tests/plan/test_refusal_advice.py": 17.0,
    "tests/training/test_run_steps.py": 10.0,
    # outside tests/e2e/, a file of few long tests: seconds in a CI run (.ci/run, 2 workers)
    "tests/config/test_config.py": 80.0,
    "tests/project/test_docs.py": 60.0,
    "tests/bench/test_bench.py": 52.0,
    "tests/training/test_checkpoint_ranks.py": 43.0,
    "tests/kernels/test_kernel_tools.py": 33.0,
    "tests/plan/test_plan.py": 29.0,
    "tests/ttt/test_ttt_graphs.py": 26.0,
    "tests/model/test_model_levers.py": 22.0,
    "tests/training/test_batch_search.py": 20.0,
    "tests/kernels/test_kernel.py": 20.0,
}
"""Seconds that files took alone (pytest -n 0 on 2 cores) or in CI, the order's guess where the pytest cache has none
(a fresh CI checkout): the per-test guess misplaces files whose tests are few and long or many and short."""


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    """Test files longest first, each file's tests in their order: the xdist workers take whole files in this order
    (pyproject's --dist loadfile --no-loadscope-reorder), so that no long file is left running alone at the end. A
    file's length is what it took last time (the pytest cache), else MEASURED's seconds, else a guess: 30 s a test in
    tests/e2e/ (each runs the CLI), 0.2 s elsewhere; FIRST's files go before all. Every worker reads the same cache, so all collect the same order."""
    cache = getattr(config, "cache", None)
    seconds = cache.get(FILE_SECONDS, {}) if cache is not None else {}
    counts: dict[str, int] = {}
    for item in items:
        counts[_file_of(item.nodeid)] = counts.get(_file_of(item.nodeid), 0) + 1

    def length(path: str) -> float:
        if path in FIRST:
            return math.inf
        guess = MEASURED.get(path, counts[path] * (30.0 if path.startswith("tests/e2e/") else 0.2))
        return seconds.get(path, guess)

    first = {path: i for i, path in enumerate(counts)}
    items.sort(key=lambda item: (-length(_file_of(item.nodeid)), first[_file_of(item.nodeid)]))


_TOOK: dict[str, float] = {}
"""Seconds each file's tests took in this run (setup, call and teardown), for the next run's order."""


def pytest_runtest_logreport(report):
    _TOOK[_file_of(report.nodeid)] = _TOOK.get(_file_of(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session):
    """Keep what each file took (in the process that saw every report: the xdist controller, or -n 0's one)."""
    cache = getattr(session.config, "cache", None)
    if cache is None or os.environ.get("PYTEST_XDIST_WORKER") or not _TOOK:
        return
    cache.set(FILE_SECONDS, {**cache.get(FILE_SECONDS, {}), **{path: round(s, 2) for path, s in _TOOK.items()}})


_COMPOSED: dict[tuple, object] = {}
"""What the compose fixture composed in this process, by its arguments (and the conf dir and working dir, which the
hydra.* part records). Never handed out itself: each call gets a copy of its own."""


def _split_key_overrides(overrides) -> tuple[list, list] | None:
    """``overrides`` as (the ones Hydra's compose takes, Hydra's parse of the plain ``group.key=value`` changes
    that end the list: dotted keys outside hydra.*, no +, ++ or ~ prefix, no @package, no sweep), or None when none
    ends it so. Hydra applies such changes after it composes the defaults list, in their order, after every
    override before them that is not a group choice (ConfigLoaderImpl._apply_overrides_to_config)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    n = len(parsed)
    while n > 0:
        o = parsed[n - 1]
        plain = not (o.is_add() or o.is_force_add() or o.is_delete() or o.is_sweep_override())
        key = o.key_or_group
        if not plain or o.package is not None or "." not in key or "/" in key or o.is_hydra_override():
            break
        n -= 1
    return (list(overrides)[:n], parsed[n:]) if n < len(parsed) else None


@pytest.fixture
def compose():
    """compose(["attn=sdpa", ...]) -> DictConfig, from the real conf/ tree, as `python -m run` would. Every call
    returns a config of its own; the same arguments composed again in this process (parametrized tests, a file's
    tests, files on this xdist worker) get a deep copy of the first composition (~5 ms, where Hydra takes ~0.25 s).

    Plain dotted keys at the end of the overrides (optim.matrix_lr=-1, budget.tokens=2e9 after quant=int6) are what
    Hydra applies to the composed config last, with its own parser and its own apply step
    (ConfigLoaderImpl._apply_overrides_to_config, in the same struct mode): here they are applied so to a copy of
    the composition of the overrides before them, which saves Hydra's ~0.25 s of composing the same defaults
    again. Group choices, hydra.* keys, +, ++, ~ and whatever comes before them go through Hydra's compose, and
    return_hydra_config composes the whole list there."""
    import copy

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from speedrun.config import CONF_DIR, register_configs

    register_configs()

    def _hydra(overrides, return_hydra_config):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)

    def _compose(overrides=(), return_hydra_config=False):
        key = (tuple(overrides), bool(return_hydra_config), str(CONF_DIR), os.getcwd())
        if key not in _COMPOSED:  # a compose error is raised every time: only compositions are kept
            split = _split_key_overrides(overrides) if overrides and not return_hydra_config else None
            if split is None:
                _COMPOSED[key] = _hydra(overrides, return_hydra_config)
            else:
                cfg = _compose(split[0])  # what comes before the keys, composed once (a copy of its own)
                ConfigLoaderImpl._apply_overrides_to_config(split[1], cfg)
                _COMPOSED[key] = cfg
        return copy.deepcopy(_COMPOSED[key])

    return _compose


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """data.cache_dir for CLI and in-process runs: the embedded dataset is built once per pytest session (per
    vocabulary size), by the first run that needs it, and shared by every test that asks for this fixture, on every
    xdist worker (ensure_embedded_dataset serialises concurrent builders on a lock file)."""
    path = session_dir(tmp_path_factory) / "speedrun-data-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def default_smoke_run(tmp_path_factory, data_cache) -> SharedRun:
    """The default job as a CPU smoke run (`python -m run debug=smoke`, data from data_cache), run once for the
    whole pytest session: tests/e2e/test_experiments.py and tests/e2e/test_cli.py check what it recorded,
    tests/e2e/test_dist_cli.py compares a two-rank run with it and tests/e2e/test_ttt_table.py test-time trains copies of
    it. Read its run dir and database; never write to them (its database must keep its one row)."""
    return shared_cli_run(tmp_path_factory, "smoke", ["debug=smoke", f"data.cache_dir={data_cache}"])
