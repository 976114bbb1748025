"""A run that is a trial of an Optuna sweep (hydra/sweeper=optuna) reports each periodic validation to its trial and
stops training when the study's pruner says so.

The sweeper sets ``SPEEDRUN_OPTUNA_TRIAL=<trial number>:<study file>`` in the job's environment (hydra.job.env_set);
the study file names the storage, the study and the metric (the run's ``objective``: val_bpb or val_loss, what a
periodic validation measures). speedrun.task installs the check before the run; the training loop calls it after
each periodic validation (speedrun.run.periodic.PRUNE_CHECKS) and a pruned trial ends training there,
recorded as ``budget_end: pruned``. Single-process runs only: several ranks would each need the verdict.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("speedrun")

TRIAL_ENV = "SPEEDRUN_OPTUNA_TRIAL"
PERIODIC_METRICS = ("val_bpb", "val_loss")


def pruning_check(value: str | None = None) -> Callable[[int, Any], bool] | None:
    """The check for this process's trial ($SPEEDRUN_OPTUNA_TRIAL), or None when the run is no trial, its metric
    is not one a periodic validation measures, or the study cannot be opened (the trial then runs unpruned)."""
    value = os.environ.get(TRIAL_ENV) if value is None else value
    if not value:
        return None
    number, _, path = value.partition(":")
    try:
        study_info = json.loads(Path(path).read_text())
        metric = str(study_info["metric"])
        if metric not in PERIODIC_METRICS:
            return None
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        pruner = study_info.get("pruner") or {}
        if pruner.get("name") == "median":
            chosen: Any = optuna.pruners.MedianPruner(
                n_startup_trials=int(pruner["n_startup_trials"]), n_warmup_steps=int(pruner["n_warmup_steps"])
            )
        else:  # the validations are still reported: optuna-dashboard plots them
            chosen = optuna.pruners.NopPruner()
        study = optuna.load_study(study_name=study_info["study"], storage=study_info["storage"], pruner=chosen)
        trial = optuna.trial.Trial(study, _trial_id(study, int(number)))
    except Exception as e:  # noqa: BLE001 - pruning is an economy: a run that cannot report still runs whole
        log.warning(f"optuna trial {value}: cannot report validations to the study ({e}); the trial is not pruned")
        return None

    def check(step: int, res: Any) -> bool:
        trial.report(float(getattr(res, metric)), step)
        return bool(trial.should_prune())

    return check


def _trial_id(study: Any, number: int) -> int:
    for frozen in study.get_trials(deepcopy=False):
        if frozen.number == number:
            return int(frozen._trial_id)
    raise LookupError(f"no trial {number} in study {study.study_name!r}")
