"""The local GPU-pool launcher, ``hydra/launcher=pool`` (conf/hydra/launcher/pool.yaml; the project default).

Every job is its own process, ``python -m run <job overrides>`` with the job's sweep subdir as its Hydra run
dir and ``CUDA_VISIBLE_DEVICES`` naming its GPUs: one, or ``dist.nproc`` of the free ones for a job that runs
several ranks (it starts them itself); as many jobs run at once as the slots allow (the visible GPUs x
``jobs_per_gpu``, or ``cpu_jobs`` on a machine without a GPU, 1 by default: sequential). A process per job
means a crash, an OOM or a wedged CUDA context ends one job, never the sweep, and every job starts with a fresh
CUDA context and compile cache state.

Failures. Hydra 1.3's BasicLauncher runs jobs one after another in the calling process and stores each
exception in a FAILED JobReturn; its BasicSweeper then raises the first one after the batch, so
``on_multirun_end`` callbacks never run when any job failed. Here a job that fails is a FAILED JobReturn too
(its own process has already recorded status, error and traceback); the speedrun sweeper collects them without
raising, so the sweep goes on and the summary is written. With ``fail_fast`` the pool starts no new job after
the first failure and stops the running ones with SIGTERM (recorded as interrupted). Ctrl-C does the same.

Ctrl-C twice. The terminal sends SIGINT to the whole foreground process group, the jobs included. After the first
one (or a SIGTERM) the pool waits up to ``stop_timeout_s`` for the jobs to record themselves; a second one kills
them at once (SIGKILL; the pool records them interrupted) and the sweep still ends as any other: sweep.json, the
summary, and then one line and the shell's status for the first signal (130, 143: speedrun.report.sweep). A third
leaves at once, without the summary.

The child learns it belongs to the sweep through Hydra overrides that are not task overrides
(``hydra.sweep.dir``, ``hydra.job.num``, ``hydra.run.dir``), so its recorded overrides are exactly the job's.
The jobs run in job_pool.Pool; this module is the launcher around it (Hydra's side: configs, commands, returns).
"""

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, configure_log, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from speedrun.config.objective import DEFAULT_OBJECTIVE, objective_problem
from speedrun.config.quoting import hydra_quote
from speedrun.errors import ConfigError
from speedrun.kernels.cache import cache_env
from speedrun.records.objective import maximising
from speedrun.run.signals import SWEEP_STOPS

from .gpu_slots import pool_slots, take_slots, visible_gpus  # noqa: F401 - part of this module's interface
from .job_pool import Job, Pool

log = logging.getLogger(__name__)


@dataclass
class PoolLauncherConf:
    """``hydra/launcher=pool``, registered below as the option itself (no YAML copy of these defaults)."""

    _target_: str = "hydra_plugins.speedrun_plugins.pool_launcher.PoolLauncher"
    gpus: Any = None
    """GPUs to use: null = every visible one (CUDA_VISIBLE_DEVICES if set, else nvidia-smi, else torch);
    a list of ids as CUDA_VISIBLE_DEVICES spells them ([0, 2]); or a count (the first N visible)."""
    jobs_per_gpu: int = 1
    """Jobs sharing one GPU at a time."""
    cpu_jobs: int = 1
    """Jobs at once on a machine without a GPU (1: sequential)."""
    fail_fast: Any = "${oc.select:hydra.sweeper.fail_fast,false}"
    """Start no job after the first failure and stop the running ones (default: the sweeper's fail_fast)."""
    module: str = "run"
    """The Python module each job runs (python -m <module>)."""
    echo: bool | None = None
    """Copy each job's output to this console (always also in <job dir>/console.log). null: when one slot."""
    stop_timeout_s: float = 60.0
    """After SIGTERM (fail-fast, Ctrl-C), seconds a job gets to record itself before SIGKILL."""
    compile_cache: str | None = "outputs/.compile_cache"
    """Inductor/Triton cache the jobs share (speedrun.kernels.cache); null: torch's defaults; set variables win."""


ConfigStore.instance().store(group="hydra/launcher", name="pool", node=PoolLauncherConf, provider="speedrun")


def quote(value: str) -> str:
    """A value as one quoted Hydra override value (speedrun.config.quoting)."""
    return hydra_quote(value)


# Hydra overrides of the sweep itself: meaningless (or wrong: hydra.mode=MULTIRUN) in a job's RUN-mode process.
_SWEEP_ONLY = (
    "hydra/launcher",
    "hydra.launcher",
    "hydra/sweeper",
    "hydra.sweeper",
    "hydra.sweep",
    "hydra.run",
    "hydra.mode",
    "hydra.job.num",
    "hydra.job.id",
)


def _forwarded(hydra_overrides: Sequence[str]) -> list[str]:
    out = []
    for o in hydra_overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if not any(key == p or key.startswith(p + ".") or key.startswith(p + "/") for p in _SWEEP_ONLY):
            out.append(o)
    return out


def _config_dirs(config: Any) -> list[str]:
    """``--config-dir DIR`` for each folder the sweep's command line added (Hydra keeps them as config sources, not
    as overrides), so that a job composes the same options, a user's own experiment among them."""
    sources = OmegaConf.select(config, "hydra.runtime.config_sources", default=None) or []
    dirs = [str(s.path) for s in sources if s.provider == "command-line" and s.schema == "file"]
    return [arg for d in dirs for arg in ("--config-dir", d)]


class PoolLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        super().__init__()
        self.params = params
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.interrupted = False
        """True after Ctrl-C: the sweeper launches no further batch."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        p = self.params
        slots = pool_slots(p.get("gpus"), p.get("jobs_per_gpu", 1), p.get("cpu_jobs", 1))
        echo = p.get("echo")
        echo = len(slots) == 1 if echo is None else bool(echo)
        # hydra.overrides.hydra is a list of strings; to_container's return type covers any node
        forwarded = _forwarded(cast("list[str]", OmegaConf.to_container(self.config.hydra.overrides.hydra)))
        jobs = [self._prepare(initial_job_idx + i, list(o), sweep_dir, forwarded) for i, o in enumerate(job_overrides)]
        where = ", ".join(f"GPU {s}" for s in dict.fromkeys(slots)) if slots[0] is not None else "CPU"
        log.info(
            f"Launching {len(jobs)} job(s), {len(slots)} at a time ({where}), one process each; "
            f"output in <job dir>/console.log"
        )
        os.environ.update(cache_env(Path(str(p["compile_cache"])) if p.get("compile_cache") else None))  # jobs inherit
        pool = Pool(
            slots,
            fail_fast=bool(p.get("fail_fast", False)),
            echo=echo,
            stop_timeout_s=float(p.get("stop_timeout_s", 60.0)),
            signals=SWEEP_STOPS,
            hold_stops=True,
        )
        if self.interrupted:  # a sweeper that asks again after Ctrl-C (an adaptive one) gets nothing run
            pool.stopping = "interrupted"
        returns = pool.run(jobs)
        self.interrupted = self.interrupted or pool.interrupted
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return returns

    def _prepare(self, num: int, overrides: list[str], sweep_dir: Path, forwarded: list[str]) -> Job:
        assert self.config is not None and self.hydra_context is not None
        config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(config):
            config.hydra.job.id = num
            config.hydra.job.num = num
        subdir = str(OmegaConf.select(config, "hydra.sweep.subdir"))
        job_dir = sweep_dir / subdir
        with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
            config.hydra.runtime.output_dir = str(job_dir)
        module = str(self.params.get("module", "run"))
        cmd = [
            sys.executable,
            "-m",
            module,
            *_config_dirs(config),  # flags before the overrides, where Hydra's argument parser takes them
            *overrides,
            *forwarded,
            f"hydra.run.dir={quote(str(job_dir))}",
            f"hydra.sweep.dir={quote(str(sweep_dir))}",
            f"hydra.sweep.subdir={quote(subdir)}",
            f"hydra.job.num={num}",
            f"hydra.job.id={num}",
        ]
        gpus = int(OmegaConf.select(config, "dist.nproc", default=1) or 1)
        objective = str(OmegaConf.select(config, "objective", default=None) or DEFAULT_OBJECTIVE)
        problem = objective_problem(objective)
        if problem is not None:  # before any job starts: a sweep must not run on a number it cannot read
            raise ConfigError(f"job #{num} ({' '.join(overrides)}): {problem}")
        maximise = maximising(OmegaConf.select(config, "hydra.sweeper"))
        return Job(num, overrides, config, job_dir, cmd, gpus=gpus, objective=objective, maximise=maximise)
