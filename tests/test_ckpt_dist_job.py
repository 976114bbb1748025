"""A two-rank job (the runner, record and resume, not only the loop) stopped by SIGTERM on one rank and resumed with
resume=<run dir>: on two ranks it completes the same row and ends where an uninterrupted two-rank job ends; on one
process (dist.nproc=1 beside resume=) it continues the same run with the same global batches.

The ranks are spawned with torchrun's environment and each runs speedrun.run.runner.run_job, as `torchrun -m run`
would (without Hydra's process around it: rank 1 gets the private dir run_job makes for a rank > 0)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
from pathlib import Path

import torch

from conftest import start_ranks
from test_dist import _free_port

STOP_AT = 3
RUN = [
    "debug=smoke",
    "budget.max_steps=6",
    "budget.warmup_steps=0",  # every Stepper call is a training step: the signal lands in step STOP_AT
    "checkpoint.every_steps=2",
    "eval.tokens=2048",
    "quant=off",
    "ttt=off",
]


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from speedrun.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def _signal_during_step(step: int) -> None:
    """SIGTERM to this process during training step ``step`` (as SLURM's or a user's kill of one rank)."""
    from speedrun.training.loop import Stepper

    original, calls = Stepper.__call__, [0]

    def stepping(self, batches):
        out = original(self, batches)
        calls[0] += 1
        if calls[0] == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    Stepper.__call__ = stepping  # type: ignore[method-assign]  # this spawned rank's only job


def _job_rank(rank: int, port: int, overrides: list[str], run_dir: str, signal_rank: int | None) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    from speedrun.run.runner import RunContext, run_job

    if rank == signal_rank:
        _signal_during_step(STOP_AT)
    path = Path(run_dir)
    try:
        run_job(_compose(overrides), RunContext(path, overrides, None, path.parent))
    except KeyboardInterrupt:  # the stopped run: recorded as interrupted, which the test reads
        pass


def _two_ranks(overrides: list[str], run_dir: Path, signal_rank: int | None = None) -> None:
    start_ranks(_job_rank, (_free_port(), overrides, str(run_dir), signal_rank))


def _train_records(run_dir: Path) -> list[tuple[int, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["train_loss"]) for r in map(json.loads, lines) if "train_loss" in r]


def _close(run_dir: Path, reference: Path) -> None:
    """Every step's training loss of ``run_dir`` once, each within float rounding of ``reference``'s: the same global
    batches on another number of ranks (test_dist measures 2e-6 relative; here equal to ~1e-7)."""
    got, want = _train_records(run_dir), _train_records(reference)
    assert [step for step, _ in got] == [step for step, _ in want] == list(range(1, 7))
    for (step, a), (_, b) in zip(got, want, strict=True):
        assert abs(a - b) <= 2e-6 * abs(b), (step, a, b)


def test_a_two_rank_job_stopped_on_one_rank_resumes_on_two_or_one(tmp_path, data_cache):
    """The uninterrupted reference is a one-process job (cheaper than two more ranks; tests/test_ckpt_dist.py holds
    two ranks resumed against two ranks uninterrupted, bit for bit)."""
    from speedrun.run.runner import RunContext, run_job

    db = tmp_path / "r.sqlite"
    common = [*RUN, f"data.cache_dir={data_cache}", f"results_db={db}"]
    full, cut, again = tmp_path / "full", tmp_path / "cut", tmp_path / "cut-on-one"
    torch.set_num_threads(1)
    reference = run_job(_compose(common), RunContext(full, common, None, tmp_path))
    assert reference["status"] == "ok" and reference["steps"] == 6

    _two_ranks(common, cut, signal_rank=1)  # rank 1 alone is signalled: both stop after step 3
    stopped = json.loads((cut / "result.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["steps"] == STOP_AT, stopped
    assert "another rank" in stopped["error"] and "step_00000003.pt" in stopped["error"]
    assert sorted(p.name for p in (cut / "checkpoints").glob("*.pt")) == ["step_00000002.pt", "step_00000003.pt"]
    shutil.copytree(cut, again)  # the same checkpoint, resumed on one process below

    _two_ranks([f"resume={cut}", *common], tmp_path / "elsewhere")
    resumed = json.loads((cut / "result.json").read_text())
    assert not (tmp_path / "elsewhere" / "result.json").exists()  # the resume runs in the run dir it continues
    assert (resumed["status"], resumed["steps"], resumed["world_size"]) == ("ok", 6, 2)
    assert abs(resumed["val_loss"] - reference["val_loss"]) <= 1e-5 * reference["val_loss"]
    _close(cut, full)
    con = sqlite3.connect(db)
    row = con.execute("SELECT status, steps, resumed_from_step FROM runs WHERE run_id = ?", (str(cut.resolve()),))
    assert row.fetchone() == ("ok", 6, STOP_AT)

    # one process continues the two-rank checkpoint (dist.nproc=1 beside resume=): the same global batches
    overrides = [f"resume={again}", "dist.nproc=1", f"results_db={db}"]
    one = run_job(_compose(overrides), RunContext(tmp_path / "x", overrides, None, tmp_path))
    assert (one["status"], one["steps"], one["world_size"], one["run_dir"]) == ("ok", 6, 1, str(again.resolve()))
    row = con.execute("SELECT status, resumed_from_step FROM runs WHERE run_id = ?", (str(again.resolve()),))
    assert row.fetchone() == ("ok", STOP_AT)
    _close(again, full)
