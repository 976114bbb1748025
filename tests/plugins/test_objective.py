"""What a job returns to Hydra's sweeper (speedrun.records.objective): the ``objective`` key of its result, the
worst value for a run that is not ok, through the pool launcher's stand-in jobs (no torch) too; and an objective no
run records refused before any job starts. Real Optuna sweeps: tests/e2e/test_optuna_sweep.py."""

from __future__ import annotations

import math
import pickle
import sys
from enum import Enum
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from hydra_plugins.speedrun_plugins import job_pool, sweeper
from hydra_plugins.speedrun_plugins import pool_launcher as pl
from speedrun.config import to_config
from speedrun.config.objective import DEFAULT_OBJECTIVE
from speedrun.errors import ConfigError
from speedrun.records.objective import Objective, maximising, objective_of
from speedrun.run.cli_step import unknown_override
from speedrun.task import task

OK = {"status": "ok", "val_bpb": 1.25, "val_loss": 2.5, "val_bpb_ttt": None, "steps": 7}


def test_an_ok_run_returns_its_objective_key_and_carries_its_record():
    assert objective_of(OK) == 1.25 and objective_of(OK, "val_loss") == 2.5 and objective_of(OK, "steps") == 7.0
    o = objective_of(OK, "val_loss")
    assert isinstance(o, Objective) and isinstance(o, float) and o.record == OK and o.key == "val_loss"
    back = pickle.loads(pickle.dumps(o))  # submitit's launcher pickles what the job returns
    assert back == 2.5 and back.record == OK and back.key == "val_loss"


@pytest.mark.parametrize("status", ["failed", "diverged", "oom", "interrupted", None])
def test_a_run_that_is_not_ok_is_the_worst_for_the_direction(status):
    record = {**OK, "status": status}
    assert objective_of(record) == math.inf and objective_of(record, maximise=True) == -math.inf
    assert objective_of(record).record["status"] == status


def test_an_ok_run_without_a_number_for_the_key_is_the_worst(caplog):
    assert objective_of(OK, "val_bpb_ttt") == math.inf  # e.g. ttt=off: no TTT score
    assert objective_of({**OK, "val_bpb": float("nan")}) == math.inf
    assert objective_of({**OK, "val_bpb": True}) == math.inf
    assert "objective=val_bpb_ttt" in caplog.text and "worst" in caplog.text


class Direction(Enum):  # as a sweeper's config may spell a direction (hydra-optuna-sweeper did)
    minimize = 1
    maximize = 2


def test_the_direction_is_read_from_each_sweeper():
    assert not maximising(None) and not maximising(OmegaConf.create({"resume": False}))  # the speedrun sweeper
    assert maximising(OmegaConf.create({"direction": "maximize"}))
    assert not maximising(OmegaConf.create({"direction": "minimize"}))
    assert maximising({"direction": Direction.maximize}) and not maximising({"direction": Direction.minimize})
    assert maximising(OmegaConf.create({"direction": ["maximize", "minimize"]}))
    assert maximising(OmegaConf.create({"optim": {"maximize": True}}))  # Nevergrad
    assert maximising(OmegaConf.create({"ax_config": {"experiment": {"minimize": False}}}))  # Ax
    assert not maximising(OmegaConf.create({"ax_config": {"experiment": {"minimize": True}}}))


def test_the_direction_of_a_composed_optuna_sweep(compose):
    pytest.importorskip("optuna", reason="pip install -e '.[optuna]'")
    assert not maximising(compose(["hydra/sweeper=optuna"], return_hydra_config=True).hydra.sweeper)
    up = compose(["hydra/sweeper=optuna", "hydra.sweeper.direction=maximize"], return_hydra_config=True)
    assert maximising(up.hydra.sweeper)


def _jobs(tmp_path: Path, scripts: list[str], objective: str = "val_bpb", maximise: bool = False) -> list:
    jobs = []
    for i, code in enumerate(scripts):
        job_dir = tmp_path / str(i)
        body = f"import json, sys\nd = {str(job_dir)!r}\n{code}"
        config = OmegaConf.create(
            {
                "results_db": str(tmp_path / "r.sqlite"),
                "hydra": {"job": {"name": "fake", "num": i}, "runtime": {"output_dir": str(job_dir)}},
            }
        )
        cmd = [sys.executable, "-c", body]
        jobs.append(job_pool.Job(i, [f"job={i}"], config, job_dir, cmd, objective=objective, maximise=maximise))
    return jobs


def _writes(status: str, exit_code: int = 0) -> str:
    record = {**OK, "status": status, "error": None if status == "ok" else "boom"}
    return f"json.dump({record!r}, open(d + '/result.json', 'w'))\nsys.exit({exit_code})\n"


def test_the_pool_returns_each_jobs_objective_and_the_worst_for_a_failure(tmp_path):
    scripts = [_writes("ok"), _writes("failed", 1), _writes("diverged"), "sys.exit(3)\n", _writes("oom", 1)]
    rets = job_pool.Pool([None], fail_fast=False, echo=False, stop_timeout_s=10).run(
        _jobs(tmp_path, scripts, objective="val_loss")
    )
    assert [r.status.name for r in rets] == ["COMPLETED", "FAILED", "COMPLETED", "FAILED", "FAILED"]
    # what Hydra's adaptive sweepers read: a number for every job, never a raise
    assert [float(r.return_value) for r in rets] == [2.5, math.inf, math.inf, math.inf, math.inf]
    assert rets[0].return_value.record["val_loss"] == 2.5
    # what the speedrun sweeper reads is unchanged: the status and the JobFailed
    assert [type(r._return_value).__name__ for r in rets[1::2]] == ["JobFailed", "JobFailed"]
    assert rets[4]._return_value.status == "oom"
    assert rets[3].return_value.record["status"] == "failed"  # died without a record: the pool's
    entries = [SimpleNamespace() for _ in rets]
    assert [sweeper._record(e, r) for e, r in zip(entries, rets)] == [False, True, False, True, True]
    assert [e.status for e in entries] == ["ok", "failed", "diverged", "failed", "oom"]


def test_a_maximising_sweep_scores_a_failure_minus_inf(tmp_path):
    (ret,) = job_pool.Pool([None], fail_fast=False, echo=False, stop_timeout_s=10).run(
        _jobs(tmp_path, [_writes("failed", 1)], maximise=True)
    )
    assert ret.return_value == -math.inf


def test_an_interrupted_job_is_no_result_and_raises_as_hydras_does(tmp_path):
    (ret,) = job_pool.Pool([None], fail_fast=False, echo=False, stop_timeout_s=10).run(
        _jobs(tmp_path, [_writes("interrupted", 1)])
    )
    with pytest.raises(job_pool.JobFailed, match="interrupted"):
        ret.return_value  # noqa: B018 - the property raises


def test_an_objective_no_run_records_is_refused_before_anything_runs(compose, tmp_path, caplog):
    assert to_config(compose([])).objective == DEFAULT_OBJECTIVE
    # the task function, before the run (src/run.py: a single run, or every trial of a sweep in one process)
    for bad in ("val_bpq", "attn"):
        with pytest.raises(SystemExit) as e:
            task(OmegaConf.create({"objective": bad}))
        assert e.value.code == 1
    assert "objective=val_bpq is not a numeric result key" in caplog.text and "fix: objective=val_bpb" in caplog.text
    assert "objective=attn is not a numeric result key" in caplog.text
    # on the command line, before Hydra composes (src/run.py)
    assert "fix: objective=val_bpb" in (unknown_override(["-m", "objective=val_bpq"]) or "")
    assert unknown_override(["objective=tokens_per_s", "objective=choice(val_bpb,val_loss)"]) is None
    assert "objective=seed" in (unknown_override(["objective=val_bpb,seed"]) or "")
    # set anywhere else (a recipe, a sweeper's params): the pool refuses it before it starts any job
    config = compose(["objective=attn"], return_hydra_config=True)
    launcher = pl.PoolLauncher()
    launcher.config = config
    launcher.hydra_context = SimpleNamespace(config_loader=SimpleNamespace(load_sweep_config=lambda c, o: config))
    with pytest.raises(ConfigError, match=r"job #0 \(seed=1\): objective=attn"):
        launcher._prepare(0, ["seed=1"], tmp_path, [])
    assert not (tmp_path / "0").exists()


def test_after_ctrl_c_the_pool_runs_nothing_more_for_a_sweeper_that_asks_again(compose, tmp_path, monkeypatch):
    """The speedrun sweeper stops at an interrupted launcher; an adaptive one (Optuna) may ask for its next trials:
    they are not run."""
    monkeypatch.chdir(tmp_path)
    config = compose([f"hydra.sweep.dir={tmp_path / 'sweep'}"], return_hydra_config=True)
    launcher = pl.PoolLauncher(cpu_jobs=1)
    launcher.config, launcher.interrupted = config, True
    launcher.hydra_context = SimpleNamespace(config_loader=SimpleNamespace(load_sweep_config=lambda c, o: config))
    rets = launcher.launch([["seed=1"], ["seed=2"]], initial_job_idx=0)
    assert [type(r._return_value).__name__ for r in rets] == ["JobNotRun", "JobNotRun"]
    assert not list((tmp_path / "sweep").iterdir())  # no job dir: nothing started
    with pytest.raises(job_pool.JobNotRun):
        rets[0].return_value  # noqa: B018 - the property raises: no result for the sweeper
