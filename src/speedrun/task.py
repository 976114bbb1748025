"""Hydra's task function (src/run.py): one run, and its objective for the sweeper.

Apart from speedrun.main on purpose: an exported train_gpt.py re-runs through speedrun.main alone and packs what that
imports, and a sweep's objective is no part of it (speedrun.artifact.raw_rule.NOT_COUNTED).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

import speedrun
from speedrun.config.objective import DEFAULT_OBJECTIVE, objective_problem
from speedrun.records.objective import maximising, objective_of
from speedrun.records.store import read_result
from speedrun.sweep_trial import TRIAL_ENV

log = logging.getLogger("speedrun")


def task(cfg: Any) -> float:
    """Run the job (speedrun.main) and return its objective for the sweeper, the result's ``cfg.objective`` key
    (val_bpb by default) as a speedrun.records.objective.Objective: a float that also carries the result record,
    which the speedrun sweeper reads. A run that is not ok returns the worst value (inf, or -inf where the sweeper
    maximises), so an adaptive sweep (``hydra/sweeper=optuna``) ranks it last and goes on.

    In a multirun in this process (``hydra/launcher=basic``) a run that recorded its failure (exit status 1) returns
    that worst value rather than ending the sweep; one that could not record itself, Ctrl-C and SIGTERM still end
    it. A single run exits as speedrun.main says. An objective no run records ends the process before the run."""
    key = str(cfg.get("objective") or DEFAULT_OBJECTIVE)
    problem = objective_problem(key)
    if problem is not None:  # before the run: a sweep must not spend its budget on a number it cannot read
        log.error("error: %s", problem)
        sys.exit(1)
    hydra = HydraConfig.get() if HydraConfig.initialized() else None
    maximise = maximising(hydra.sweeper) if hydra is not None else False
    checks: list[Any] = []
    if os.environ.get(TRIAL_ENV):  # a trial of hydra/sweeper=optuna: its periodic validations go to the study
        from speedrun.run.periodic import PRUNE_CHECKS
        from speedrun.sweep_trial import pruning_check

        checks = PRUNE_CHECKS
        checks[:] = [c for c in [pruning_check()] if c is not None]
    try:
        record = speedrun.main(cfg)
    except SystemExit as e:
        recorded = read_result(Path(hydra.runtime.output_dir)) if hydra is not None else None
        if hydra is None or hydra.mode != RunMode.MULTIRUN or e.code != 1 or recorded is None:
            raise
        record = recorded
    finally:
        checks.clear()  # the next job in this process (hydra/launcher=basic) is another trial, or none
    return objective_of(record, key, maximise)
