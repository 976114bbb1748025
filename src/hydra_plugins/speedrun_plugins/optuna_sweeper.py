"""The Optuna sweeper, ``hydra/sweeper=optuna`` (``pip install -e '.[optuna]'``): an adaptive sweep that asks Optuna
for each trial's values and tells it the number each run returns (its ``objective`` result key, val_bpb by default).

Written on Optuna's own ask-and-tell API (Optuna 4 and later): hydra-optuna-sweeper 1.3 pins Optuna 2, whose
database storage fails under SQLAlchemy 2. What it adds to a plain loop:

- a persisted study: ``storage`` is a database URL (``sqlite:///study.db``; default: ``optuna.db`` in the sweep dir),
  opened with ``load_if_exists``, so the same command run again goes on where the study stopped: it runs only
  the trials that ``n_trials`` still lacks, and re-runs with the same values a trial that a killed sweep left
  running. optuna-dashboard opens the same file.
- a seeded sampler (``seed``; tpe, random or grid) and ``n_jobs`` trials asked at once (the launcher's batch).
- pruning: with a pruner (median by default) and periodic validation in the runs (``eval.every_steps`` or
  ``eval.every_seconds``), each run reports every validation's objective (val_bpb or val_loss) to its trial
  (speedrun.sweep_trial) and stops training when the pruner says so; the trial is then recorded as pruned.
- a run that did not end ok scores the worst value (speedrun.records.objective) and the study goes on; a job the
  launcher could not run is a failed trial, and the study goes on too.

Search space, as Hydra's override grammar writes it: ``key=interval(a,b)`` (a float; ``int(interval(a,b))`` an
int; ``tag(log,interval(a,b))`` for a log scale), ``key=choice(a,b,c)`` or ``key=a,b,c`` (categorical),
``key=range(a,b,step)`` (categorical of its values); a plain ``key=value`` is fixed for every trial.
"""

import logging
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

TRIAL_ENV = "SPEEDRUN_OPTUNA_TRIAL"
"""Set in each job's environment (hydra.job.env_set): ``<trial number>:<study file>``, where the study file (JSON in
the sweep dir) names the storage, the study and the metric the run reports at each periodic validation."""

STUDY_FILE = "optuna_study.json"
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "none")


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.speedrun_plugins.optuna_sweeper.OptunaSweeper"
    direction: str = "minimize"
    """minimize or maximize the objective the runs return (``objective=``, val_bpb by default)."""
    n_trials: int = 20
    """Trials the study should hold when the sweep ends, counting those a resumed study already has."""
    n_jobs: int = 1
    """Trials asked for at once and handed to the launcher together (the pool runs them side by side)."""
    storage: str | None = None
    """Database URL of the study (sqlite:///study.db resumes across commands). None: optuna.db in the sweep dir."""
    study_name: str | None = None
    """None: the run's ``name`` (default)."""
    sampler: str = "tpe"
    """tpe, random or grid (grid: every parameter a choice; n_trials caps the grid)."""
    seed: int | None = 0
    """The sampler's seed: the same study proposes the same trials. None: unseeded."""
    pruner: str = "median"
    """median (Optuna's MedianPruner) or none. Acts only on runs with periodic validation."""
    pruner_startup_trials: int = 2
    """Trials that finish before the pruner prunes any."""
    pruner_warmup_steps: int = 0
    """Optimizer steps of a run before the pruner judges its validations."""
    params: dict[str, str] | None = None
    """The search space as overrides, e.g. {optim.matrix_lr: 'interval(0.01,0.05)'}; the command line adds to it."""


ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="speedrun")


def _require(ok: bool, message: str) -> None:
    if not ok:
        from hydra.errors import CompactHydraException

        from speedrun.errors import ConfigError  # here: Hydra imports its plugins on every start

        class SweeperSettingError(ConfigError, CompactHydraException):
            """A bad hydra.sweeper.* setting: Hydra prints a CompactHydraException as its one line, no traceback."""

        raise SweeperSettingError(f"error: {message}")


class OptunaSweeper(Sweeper):
    def __init__(
        self,
        direction: str = "minimize",
        n_trials: int = 20,
        n_jobs: int = 1,
        storage: str | None = None,
        study_name: str | None = None,
        sampler: str = "tpe",
        seed: int | None = 0,
        pruner: str = "median",
        pruner_startup_trials: int = 2,
        pruner_warmup_steps: int = 0,
        params: dict[str, str] | None = None,
    ) -> None:
        self.direction, self.n_trials, self.n_jobs = str(direction).lower(), int(n_trials), int(n_jobs)
        self.storage, self.study_name = storage, study_name
        self.sampler_name, self.seed, self.pruner_name = str(sampler), seed, str(pruner)
        self.pruner_startup_trials, self.pruner_warmup_steps = int(pruner_startup_trials), int(pruner_warmup_steps)
        self.params = dict(params or {})
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _check(self) -> None:
        _require(
            self.direction in ("minimize", "maximize"),
            f"hydra.sweeper.direction={self.direction} must be minimize or maximize",
        )
        _require(self.n_trials >= 1, f"hydra.sweeper.n_trials={self.n_trials} must be >= 1")
        _require(self.n_jobs >= 1, f"hydra.sweeper.n_jobs={self.n_jobs} must be >= 1")
        _require(
            self.sampler_name in SAMPLERS,
            f"hydra.sweeper.sampler={self.sampler_name} is not one of {', '.join(SAMPLERS)}",
        )
        _require(
            self.pruner_name in PRUNERS, f"hydra.sweeper.pruner={self.pruner_name} is not one of {', '.join(PRUNERS)}"
        )

    def sweep(self, arguments: list[str]) -> Any:
        import optuna  # here: Hydra imports its plugins on every start, and Optuna is a sweep's alone

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        self._check()
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        space, fixed = search_space(overrides)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        storage = self.storage or f"sqlite:///{sweep_dir / 'optuna.db'}"
        name = self.study_name or str(self.config.get("name") or "speedrun")
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweeper says what matters, in its own lines
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=self._sampler(optuna, space),
            pruner=self._pruner(optuna),
            direction="maximize" if self.direction == "maximize" else "minimize",
            load_if_exists=True,
        )
        retried = _retry_abandoned(optuna, study)
        if self.sampler_name == "grid":
            self._queue_grid(optuna, study, space)
        study_file = sweep_dir / STUDY_FILE
        metric = str(self.config.get("objective") or "val_bpb")
        pruner = {
            "name": self.pruner_name,
            "n_startup_trials": self.pruner_startup_trials,
            "n_warmup_steps": self.pruner_warmup_steps,
        }
        _write_json(study_file, {"storage": storage, "study": name, "metric": metric, "pruner": pruner})
        finished = _finished(study)
        log.info(
            f"optuna: study {name!r} in {storage}: {len(finished)} of {self.n_trials} trial(s) done"
            + (f", {retried} left running by a stopped sweep to run again" if retried else "")
        )
        returns = []
        job_idx = 0
        while len(_finished(study)) < self.n_trials:
            todo = self.n_trials - len(_finished(study))
            trials = [study.ask(space) for _ in range(min(self.n_jobs, todo))]
            batch = []
            for trial in trials:
                trial.set_user_attr("sweeper", f"{socket.gethostname()}:{os.getpid()}")
                values = [f"{key}={Override._get_value_element_as_str(trial.params[key])}" for key in space]
                env = _quote(f"{trial.number}:{study_file}")
                # the trial's values first: the summary and the logs name a job by its leading overrides
                batch.append([*values, *fixed, f"++hydra.job.env_set.{TRIAL_ENV}={env}"])
            results = self.launcher.launch(batch, initial_job_idx=job_idx)
            job_idx += len(batch)
            returns.append(list(results))
            if getattr(self.launcher, "interrupted", False):  # Ctrl-C in the pool: the rest waits for a resume
                left = _requeue_unrun(optuna, study, trials, results)
                log.info(f"optuna: interrupted; {left} trial(s) not run are queued for the same command run again")
                break
            for trial, ret in zip(trials, results):
                _tell(optuna, study, trial, ret)
        self._report(optuna, study, sweep_dir)
        return returns

    def _sampler(self, optuna: Any, space: dict[str, Any]) -> Any:
        # grid: the combinations are queued (_queue_grid) and drawn in turn; Optuna's GridSampler would end the
        # study with Study.stop(), which only works inside study.optimize()
        if self.sampler_name in ("random", "grid"):
            return optuna.samplers.RandomSampler(seed=self.seed)
        # constant_liar: trials asked together (n_jobs) see each other as running, so they are not proposed alike
        return optuna.samplers.TPESampler(seed=self.seed, constant_liar=True)

    def _queue_grid(self, optuna: Any, study: Any, space: dict[str, Any]) -> None:
        """Queue every combination of the choices the study has not tried, in an order the seed fixes; n_trials
        is capped to the grid's size."""
        import itertools
        import random

        for key, dist in space.items():
            _require(
                isinstance(dist, optuna.distributions.CategoricalDistribution),
                f"hydra.sweeper.sampler=grid needs every parameter as a choice: {key} is an interval; write "
                f"{key}=choice(a,b,...)",
            )
        combos = [dict(zip(space, values)) for values in itertools.product(*(d.choices for d in space.values()))]
        random.Random(self.seed).shuffle(combos)
        if self.n_trials > len(combos):
            log.info(f"optuna: the grid has {len(combos)} combination(s); n_trials={self.n_trials} capped to it")
            self.n_trials = len(combos)
        for params in combos:
            study.enqueue_trial(params, skip_if_exists=True)

    def _pruner(self, optuna: Any) -> Any:
        if self.pruner_name == "none":
            return optuna.pruners.NopPruner()
        return optuna.pruners.MedianPruner(
            n_startup_trials=self.pruner_startup_trials, n_warmup_steps=self.pruner_warmup_steps
        )

    def _report(self, optuna: Any, study: Any, sweep_dir: Path) -> None:
        states = [t.state.name.lower() for t in study.trials]
        counts = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
        log.info(f"optuna: study {study.study_name!r}: {len(states)} trial(s): {counts}")
        try:
            best = study.best_trial
        except ValueError:  # no trial completed
            log.info("optuna: no trial completed; no best value")
            return
        log.info(f"Best parameters: {best.params}")
        log.info(f"Best value: {best.value}")
        OmegaConf.save(
            OmegaConf.create(
                {"name": "optuna", "study": study.study_name, "best_params": best.params, "best_value": best.value}
            ),
            sweep_dir / "optimization_results.yaml",
        )


def search_space(overrides: list[Override]) -> tuple[dict[str, Any], list[str]]:
    """Optuna distributions for the sweep overrides, and the fixed overrides as strings."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space: dict[str, Any] = {}
    fixed: list[str] = []
    for o in overrides:
        key = o.get_key_element()
        if not o.is_sweep_override():
            fixed.append(f"{key}={o.get_value_element_as_str()}")
            continue
        value = o.value()
        if isinstance(value, IntervalSweep):
            assert value.start is not None and value.end is not None
            log_scale = "log" in value.tags
            if isinstance(value.start, int) and isinstance(value.end, int):
                space[key] = IntDistribution(int(value.start), int(value.end), log=log_scale)
            else:
                space[key] = FloatDistribution(float(value.start), float(value.end), log=log_scale)
        elif isinstance(value, (ChoiceSweep, RangeSweep)):
            choices = [v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for v in o.sweep_iterator()]
            space[key] = CategoricalDistribution(choices)
        else:  # a sweep kind Hydra may add later
            _require(False, f"{key}: {type(value).__name__} is not a search space the optuna sweeper knows")
    return space, fixed


def _tell(optuna: Any, study: Any, trial: Any, ret: Any) -> None:
    """Record one job's outcome in its trial."""
    if ret.status != JobStatus.COMPLETED:
        error = ret._return_value if ret.status == JobStatus.FAILED else None
        log.warning(f"optuna: trial {trial.number} failed: {error!r}; the study goes on")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return
    value = ret.return_value
    record = getattr(value, "record", {}) or {}
    for key in ("status", "run_dir", "error"):
        if record.get(key) is not None:
            trial.set_user_attr(key, str(record[key]))
    if record.get("budget_end") == "pruned":
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    number = float(value)
    if math.isnan(number):
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return
    study.tell(trial, number)


def _finished(study: Any) -> list[Any]:
    """The trials that count towards n_trials: finished, less those a stopped sweep abandoned (run again)."""
    return [t for t in study.get_trials(deepcopy=False) if t.state.is_finished() and not t.user_attrs.get("retried")]


def _requeue_unrun(optuna: Any, study: Any, trials: list[Any], results: Any) -> int:
    """After an interrupted batch: each trial's outcome as usual where its job completed; one that did not run (or
    was stopped) is failed and its values queued again, so a resumed study runs it."""
    left = 0
    for trial, ret in zip(trials, results):
        if ret.status == JobStatus.COMPLETED and (getattr(ret.return_value, "record", {}) or {}).get("status") == "ok":
            _tell(optuna, study, trial, ret)
            continue
        trial.set_user_attr("retried", True)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, skip_if_exists=False)
        left += 1
    return left


def _retry_abandoned(optuna: Any, study: Any) -> int:
    """Trials left running by a sweep on this host whose process is gone (killed, Ctrl-C): failed, and the same values
    asked again first. A trial of a sweep still running (another process on this host, or another host) is left."""
    host = socket.gethostname()
    retried = 0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner = str(trial.user_attrs.get("sweeper", ""))
        owner_host, _, pid = owner.rpartition(":")
        if owner_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        study._storage.set_trial_user_attr(trial._trial_id, "retried", True)
        study._storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, skip_if_exists=False)
        retried += 1
    return retried


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _quote(value: str) -> str:
    """A single-quoted Hydra override value (paths may hold characters the grammar reads otherwise)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    import json

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
