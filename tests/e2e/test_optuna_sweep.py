"""Adaptive sweeps through `python -m run -m hydra/sweeper=optuna` on CPU (speedrun's own sweeper on Optuna's API,
hydra_plugins/speedrun_plugins/optuna_sweeper.py): the study minimises the numbers the runs return (their
``objective`` result key), a refused trial scores the worst value and the study goes on, through the pool launcher (a
process per job) and in the sweep's own process (hydra/launcher=basic); a study in a sqlite file that a killed sweep
left after 2 of its 3 trials finishes the third when the same command runs again; a trial whose periodic
validation is worse than the median of the trials before it is pruned; and the objective keys are the numbers a real
run records."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from speedrun.config.objective import OBJECTIVES
from support.cli import run_cli

optuna = pytest.importorskip("optuna", reason="pip install -e '.[optuna]'")
pytestmark = pytest.mark.slow

# a grid over three values, one of them refused by the schema (a negative learning rate): every trial runs, in order
# of the sampler's choosing, and the refused one fails in a second
# quant=off: the objectives here are val_loss and val_bpb, scored before any export, so no trial exports; 512 tokens a
# step (2 micro-batches of 2 x 128, not smoke's 24): the study compares the runs' numbers, whatever their size
TRIAL = ["debug=smoke", "budget.tokens_per_step=512", "quant=off"]
OPTUNA = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.sampler=grid", *TRIAL, "budget.max_steps=2"]


def _rows(cwd: Path) -> list[dict]:
    con = sqlite3.connect(cwd / "outputs" / "results.sqlite")
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM runs ORDER BY started_at")]


def _study(cwd: Path) -> tuple[Path, dict]:
    (sweep,) = (cwd / "outputs" / "multirun").glob("*/*")
    return sweep, yaml.safe_load((sweep / "optimization_results.yaml").read_text())


def _lr(row: dict) -> float:
    (lr,) = (o.split("=")[1] for o in row["overrides"].split() if o.startswith("optim.matrix_lr="))
    return float(lr)


def _meet_before_training(tmp_path: Path, runs: int = 2, wait_s: float = 60) -> dict[str, str]:
    """Environment in which a run's first Stepper call waits (at most ``wait_s``) until ``runs`` runs have reached
    theirs. With two slots the two trials that train then overlap whichever slot the refused trial took first (it
    ends in about a second, and the second trainer's start-up may outlast a smoke run's few seconds); one run at a
    time would keep the first waiting out ``wait_s`` and finishing before the other starts."""
    inject = tmp_path / "meet"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os, time\n"
        "import speedrun.core.train as t\n"
        "call, first = t.Stepper.__call__, [True]\n"
        "def meeting(self, batches):\n"
        "    if first[0]:\n"
        "        first[0] = False\n"
        f"        open(os.path.join({str(inject)!r}, f'at-step-{{os.getpid()}}'), 'w').close()\n"
        f"        deadline = time.time() + {wait_s}\n"
        f"        while len([n for n in os.listdir({str(inject)!r}) if n.startswith('at-step-')]) < {runs}:\n"
        "            if time.time() > deadline:\n"
        "                break\n"
        "            time.sleep(0.05)\n"
        "    return call(self, batches)\n"
        "t.Stepper.__call__ = meeting\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")])}


def test_an_optuna_sweep_through_the_pool_minimises_the_objective_the_runs_return(tmp_path, data_cache):
    # the study asks for its 3 trials at once (n_jobs); the pool runs 2 at a time
    args = ["optim.matrix_lr=choice(0.02,0.04,-1.0)", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=3"]
    args.append("hydra.launcher.cpu_jobs=2")
    proc = run_cli(
        [*OPTUNA, *args, "objective=val_loss", f"data.cache_dir={data_cache}"],
        cwd=tmp_path,
        timeout=300,
        env_extra=_meet_before_training(tmp_path),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]  # the study ends, then the summary's exit status says a job failed
    sweep, study = _study(tmp_path)
    rows = _rows(tmp_path)
    assert len(rows) == 3 and {r["sweep"] for r in rows} == {sweep.name}  # the database keeps every trial
    ok = [r for r in rows if r["status"] == "ok"]
    (refused,) = (r for r in rows if r["status"] != "ok")
    assert refused["status"] == "failed" and "optim.matrix_lr=-1.0 must be >= 0" in refused["error"]
    assert _lr(refused) == -1.0 and sorted(_lr(r) for r in ok) == [0.02, 0.04]
    # two trials ran at once: with two slots the two that train overlap (they meet before their first step)
    assert max(r["started_at"] for r in ok) < min(r["finished_at"] for r in ok)
    # the study saw each run's val_loss (not its val_bpb), and the refused trial as no better than any
    best = min(ok, key=lambda r: r["val_loss"])
    assert study["best_value"] == pytest.approx(best["val_loss"], rel=1e-12)
    assert study["best_params"] == {"optim.matrix_lr": _lr(best)}
    assert best["val_loss"] != best["val_bpb"]
    assert "failed: optim.matrix_lr=-1.0" in out and "Best value" in out


def test_an_optuna_sweep_in_one_process_goes_on_past_a_refused_trial(tmp_path, data_cache):
    """hydra/launcher=basic runs every trial in the sweep's process, where a refused run ends with sys.exit(1): the
    task turns its record into the worst value instead of ending the study. The sweep starts no process of its own
    here, so it is forked from this one (run_cli fork=True), as the pruning test's are."""
    args = ["hydra/launcher=basic", "optim.matrix_lr=choice(-1.0,0.03)", "hydra.sweeper.n_trials=2"]
    proc = run_cli([*OPTUNA, *args, f"data.cache_dir={data_cache}"], cwd=tmp_path, timeout=300, fork=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    _, study = _study(tmp_path)
    rows = _rows(tmp_path)
    assert sorted(r["status"] for r in rows) == ["failed", "ok"]
    (ok,) = (r for r in rows if r["status"] == "ok")
    assert study["best_value"] == pytest.approx(ok["val_bpb"], rel=1e-12)
    assert study["best_params"] == {"optim.matrix_lr": 0.03}


def test_every_objective_a_run_records_is_a_number(default_smoke_run):
    assert default_smoke_run.proc.returncode == 0, default_smoke_run.proc.stderr[-2000:]
    result = json.loads((default_smoke_run.run_dir / "result.json").read_text())
    recorded = [k for k in OBJECTIVES if k in result]
    # the smoke run measures these (TTT's, a target's and the GPU's are null or absent without them)
    for key in ("val_bpb", "val_loss", "val_bpb_quant", "artifact_bytes", "tokens_per_s", "train_seconds", "steps"):
        assert isinstance(result.get(key), (int, float)), key
    for key in recorded:
        value = result[key]
        assert value is None or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ), f"{key}={value!r}"


def _sweep_command(args: list[str], data_cache: Path) -> list[str]:
    return [sys.executable, "-m", "run", *args, f"data.cache_dir={data_cache}"]


def _trials(storage: str, name: str = "default") -> list:
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def test_a_study_stopped_after_two_of_three_trials_finishes_the_third_from_its_storage(tmp_path, data_cache):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra/launcher=basic",  # one process: the kill below stops the sweep and its running trial together
        *TRIAL,
        "budget.max_steps=2",
        "optim.matrix_lr=interval(0.01,0.05)",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.pruner=none",
        f"hydra.sweeper.storage={storage}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(
        _sweep_command(args, data_cache), cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.time() + 300
        while not list((tmp_path / "outputs" / "multirun").glob("*/*/2")):  # the third trial's job has started
            assert first.poll() is None and time.time() < deadline, (tmp_path / "first.log").read_text()[-4000:]
            time.sleep(0.1)
    finally:
        first.send_signal(signal.SIGKILL)  # no handler runs: the study keeps trial 3 as running
        first.wait()
        log.close()
    before = _trials(storage)
    assert [t.state.name for t in before] == ["COMPLETE", "COMPLETE", "RUNNING"]
    abandoned = before[2].params

    proc = subprocess.run(_sweep_command(args, data_cache), cwd=tmp_path, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "2 of 3 trial(s) done, 1 left running by a stopped sweep to run again" in out
    assert "alembic" not in out.lower()  # Optuna 2's storage printed its migration plugins' set-up, 7 lines a start
    after = _trials(storage)
    done = [t for t in after if t.state.name == "COMPLETE"]
    # the first two as they were, and the third run again with the values the killed sweep had asked for
    assert [(t.number, t.value, t.params) for t in done[:2]] == [(t.number, t.value, t.params) for t in before[:2]]
    assert len(done) == 3 and done[2].params == abandoned
    assert after[2].state.name == "FAIL" and after[2].user_attrs["retried"] is True
    # the seeded sampler proposed three different learning rates
    assert len({t.params["optim.matrix_lr"] for t in done}) == 3
    first_sweep, second_sweep = sorted((tmp_path / "outputs" / "multirun").glob("*/*"))  # named by start time
    assert not (second_sweep / "1").exists()  # the restart ran one trial
    rerun = json.loads((second_sweep / "0" / "result.json").read_text())
    assert rerun["status"] == "ok" and rerun["val_bpb"] == pytest.approx(done[2].value, rel=1e-12)
    study = yaml.safe_load((second_sweep / "optimization_results.yaml").read_text())
    assert study["best_value"] == pytest.approx(min(t.value for t in done), rel=1e-12)


def test_a_trial_worse_than_the_median_at_a_periodic_validation_is_pruned(tmp_path, data_cache):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    common = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra/launcher=basic",
        "debug=smoke",  # smoke's 6144 tokens a step: at 512 the trained run's step-2 validation was no better
        "quant=off",
        "budget.max_steps=6",
        "eval.every_steps=2",
        "hydra.sweeper.pruner_startup_trials=1",
        f"hydra.sweeper.storage={storage}",
    ]
    good = run_cli([*common, "hydra.sweeper.n_trials=1", f"data.cache_dir={data_cache}"], cwd=tmp_path, fork=True)
    assert good.returncode == 0, (good.stdout + good.stderr)[-4000:]
    # every learning rate 0: the model never moves, so its first validation is worse than the trained run's
    frozen = [f"optim.{k}=0" for k in ("matrix_lr", "scalar_lr", "embed_lr", "tied_embed_lr", "head_lr")]
    bad = run_cli(
        [*common, *frozen, "hydra.sweeper.n_trials=2", f"data.cache_dir={data_cache}"], cwd=tmp_path, fork=True
    )
    out = bad.stdout + bad.stderr
    assert bad.returncode == 0, out[-4000:]
    first, second = _trials(storage)
    assert first.state.name == "COMPLETE" and sorted(first.intermediate_values) == [2, 4, 6]
    assert second.state.name == "PRUNED" and sorted(second.intermediate_values) == [2]
    assert "pruned at step 2" in out
    (run_dir,) = [Path(p) for p in [second.user_attrs["run_dir"]]]
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["status"], result["budget_end"], result["steps"]) == ("ok", "pruned", 2)
