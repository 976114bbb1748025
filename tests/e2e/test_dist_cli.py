"""Two ranks end to end on CPU (gloo) through the real entry points: torchrun, `python -m run dist.nproc=2` (torch's
elastic launch) and submitit's local executor (the SLURM path, a forced requeue included). One run dir and one row
per run, written by rank 0; a rank that raises fails the run with its error, in bounded time; Ctrl-C leaves an
interrupted row."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cli import run_cli

pytestmark = pytest.mark.slow

SMOKE = ["debug=smoke"]  # conf/debug/smoke.yaml: 4 steps of a tiny model, 6144 tokens a step (12 x 2 x 128 per rank)
# smoke with one micro-batch of 2 x 128 per rank a step (512 tokens, not 6144): for the tests that check how the ranks
# start, fail and stop, not what they train to
QUICK = [*SMOKE, "budget.tokens_per_step=512"]
LONG = ["budget.max_steps=1000000", "budget.train_seconds=300"]  # still training when the failure or signal comes


def rows(cwd: Path) -> list[dict]:
    con = sqlite3.connect(cwd / "outputs" / "results.sqlite")
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM runs")]


def run_dirs(cwd: Path) -> list[Path]:
    return sorted(p.parent for p in (cwd / "outputs").glob("**/.hydra"))


def test_torchrun_two_ranks_make_one_run_like_one_process(tmp_path, data_cache, default_smoke_run):
    """torchrun starts both ranks with the same command line: rank 1 creates no run dir of its own, rank 0 records
    world_size 2, and the run trains and scores as one process with twice the accumulation (fp32)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    # smoke's 4 steps end it (it has no time limit), the same data as conftest's default_smoke_run
    args = [*SMOKE, f"data.cache_dir={data_cache}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "run", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    (row,) = rows(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert row["status"] == result["status"] == "ok" and row["run_id"] == str(run_dir.resolve())
    assert (result["world_size"], result["nodes"], len(result["gpu_names"])) == (2, 1, 2)
    assert json.loads(row["plan"])["dist"] == {
        "world_size": 2,
        "nodes": 1,
        "nproc": 2,
        "backend": "gloo",
        "launch": "torchrun",
        "timeout_s": 600.0,
        "nvls": None,  # NCCL's own NVLink-multicast default
    }
    assert result["tokens"] == result["steps"] * 6144  # tokens (and tokens_per_s) are global
    # one process, the same overrides (plus its own run dir and database): conftest.default_smoke_run
    single = default_smoke_run.proc
    assert single.returncode == 0, single.stderr[-3000:]
    con = sqlite3.connect(default_smoke_run.db)
    con.row_factory = sqlite3.Row
    (one,) = [dict(r) for r in con.execute("SELECT * FROM runs")]
    assert one["steps"] == row["steps"] == 4 and abs(one["val_bpb"] - row["val_bpb"]) < 1e-4


def _injector(tmp_path: Path, rank: int) -> dict[str, str]:
    """Environment that makes rank ``rank`` raise at its third step (warm-up is the first) of a real run: a
    sitecustomize on PYTHONPATH, imported by every process at start-up, wraps the Stepper in that rank only."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os\n"
        f"if os.environ.get('RANK') == '{rank}':\n"
        "    import speedrun.core.train as t\n"
        "    call, n = t.Stepper.__call__, [0]\n"
        "    def failing(self, batches):\n"
        "        n[0] += 1\n"
        "        if n[0] == 3:\n"
        f"            raise RuntimeError('injected failure on rank {rank}')\n"
        "        return call(self, batches)\n"
        "    t.Stepper.__call__ = failing\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")])}


def _stall_until_signalled(tmp_path: Path) -> dict[str, str]:
    """Environment in which each task (rank) of a job's first start under submitit's local executor stalls in its
    third Stepper call (warm-up is the first) until a stop signal reaches it, or for at most 2 minutes: the signal
    then lands mid-training whatever the machine's speed, and the ranks wait without training (a 30 s training
    budget kept both cores busy, and left the requeued job ~10 s of it). A marker file per rank, holding that
    task's pid, tells the requeued start, which runs through, and the test whom to signal (_signal_stalled)."""
    inject = tmp_path / "stall"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('SUBMITIT_LOCAL_GLOBALID'):  # a task of submitit's local executor\n"
        "    import time\n"
        "    import torch.distributed as dist\n"
        "    import speedrun.core.train as t\n"
        "    import speedrun.run.preempt as p\n"
        "    handler, call, n, signalled = p.StopRequests._handler, t.Stepper.__call__, [0], []\n"
        "    def noting(self, signum, frame):\n"
        "        signalled.append(signum)\n"
        "        return handler(self, signum, frame)\n"
        "    def stalling(self, batches):\n"
        "        n[0] += 1\n"
        f"        marker = os.path.join({str(inject)!r}, f'stalled-rank{{dist.get_rank()}}')\n"
        "        if n[0] == 3 and not os.path.exists(marker):\n"
        "            with open(marker + '.tmp', 'w') as f:\n"
        "                f.write(str(os.getpid()))\n"
        "            os.replace(marker + '.tmp', marker)\n"
        "            deadline = time.time() + 120\n"
        "            while not signalled and time.time() < deadline:\n"
        "                time.sleep(0.1)\n"
        "        return call(self, batches)\n"
        "    p.StopRequests._handler = noting\n"
        "    t.Stepper.__call__ = stalling\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")])}


def _signal_stalled(proc: subprocess.Popen, stall: Path, ranks: int, timeout: float = 240) -> None:
    """Once every task of the first start stalls (its marker from _stall_until_signalled names its pid), send each
    the signal that submitit's local executor sends a job's tasks before its timeout (LocalJobEnvironment's
    preemption signal, SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise), as the executor would. Returns
    without signalling when the sweep ends first or the tasks do not stall within ``timeout``."""
    from submitit.local.local import LocalJobEnvironment

    markers = [stall / f"stalled-rank{rank}" for rank in range(ranks)]
    deadline = time.time() + timeout
    while not all(m.exists() for m in markers):
        if proc.poll() is not None or time.time() > deadline:
            return
        time.sleep(0.1)
    for marker in markers:
        os.kill(int(marker.read_text()), LocalJobEnvironment._usr_sig())


@pytest.mark.parametrize("failing", [1, 0])
def test_a_rank_that_raises_fails_the_run_with_its_error(tmp_path, data_cache, failing):
    start = time.time()
    proc = run_cli(
        [*QUICK, *LONG, "dist.nproc=2", f"data.cache_dir={data_cache}"],
        cwd=tmp_path,
        timeout=240,
        env_extra=_injector(tmp_path, failing),
    )
    wall = time.time() - start
    assert proc.returncode != 0
    # not a collective timeout (600 s); the whole run, start-up included, took 145 s at load 12
    assert wall < 300, f"the ranks took {wall:.0f}s to stop"
    (run_dir,) = run_dirs(tmp_path)
    (row,) = rows(tmp_path)
    expected = f"rank {failing}: RuntimeError: injected failure on rank {failing}"
    assert row["status"] == "failed" and row["error"] == expected, (row["error"], proc.stdout[-3000:])
    assert json.loads((run_dir / "result.json").read_text())["error"] == expected
    assert f"injected failure on rank {failing}" in (run_dir / "error.txt").read_text()  # that rank's traceback
    assert row["steps"] >= 1 and row["world_size"] == 2


def test_ctrl_c_leaves_an_interrupted_row(tmp_path, data_cache):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [*QUICK, *LONG, "dist.nproc=2", f"data.cache_dir={data_cache}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "run", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    try:
        deadline = time.time() + 240
        for line in proc.stdout:  # until rank 0 logs training progress
            seen.append(line)
            if "tok/s" in line or time.time() > deadline:
                break
        assert any("tok/s" in line for line in seen), "".join(seen)[-3000:]
        sent = time.time()
        proc.send_signal(signal.SIGINT)  # to the launching process only: it stops the ranks
        rest, _ = proc.communicate(timeout=90)
        assert time.time() - sent < 60
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    (run_dir,) = run_dirs(tmp_path)
    (row,) = rows(tmp_path)
    assert row["status"] == "interrupted" and row["steps"] > 0 and row["finished_at"] is not None
    assert json.loads((run_dir / "result.json").read_text())["status"] == "interrupted"
    # the ranks stopped together at a step boundary, after one checkpoint of that step (rank 0's file)
    (checkpoint,) = (run_dir / "checkpoints").glob("step_*.pt")
    assert checkpoint.name == f"step_{row['steps']:08d}.pt" and checkpoint.name in row["error"]
    # the launching process's last line points to rank 0's row and how to continue it
    last = [line for line in rest.splitlines() if "interrupted:" in line][-1]
    assert "(interrupted); continue it with `python -m run resume=" in last and "no row" not in last, last


def test_a_bad_dist_request_is_refused_before_any_rank_starts(tmp_path):
    # 6400 tokens do not split into 2 ranks x 2 x 128 tokens
    proc = run_cli([*SMOKE, "dist.nproc=2", "budget.tokens_per_step=6400"], cwd=tmp_path, fork=True)
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "does not split over 2 ranks" in out and "starting 2 ranks" not in out
    (row,) = rows(tmp_path)
    assert row["status"] == "failed" and row["error"].startswith("PlanError")


# The forced requeue below is in this file, not one of its own: pytest-xdist's loadfile hands out files with the most
# tests first, so a one-test file came last and ran alone at the end of the suite (~45 s).


def test_the_slurm_path_runs_two_tasks_as_one_run_and_requeues_it(tmp_path, data_cache):
    """hydra/launcher=slurm_local: submitit's local executor runs the job as 2 tasks with submitit's job
    environment, which speedrun maps to the rendezvous as it would on a SLURM cluster: one run (launch submitit,
    world size 2) in the sweep's job dir, shared by both tasks. (The plain path and the requeue are one run: a
    second run of the plain path took ~17 s of the suite and checked nothing that this one does not.)
    A forced requeue, end to end: the timeout signal that submitit's local executor sends both tasks 30 s before
    hydra.launcher.timeout_min=1 runs out (SIGUSR2) comes mid-training (each rank of the first start stalls in its
    second training step until its signal comes: _stall_until_signalled); the test sends it to both tasks as soon
    as both stall (_signal_stalled), rather than leave them idle until the executor's 30 s, which still come if the
    test's do not. Submitit takes any such signal for a timeout with timeout_min=1 (it counts 48 s of a minute as
    guaranteed only past 10 minutes), and says so in the run's log against the minute the launcher asked for. Both
    ranks stop at the same step with one checkpoint; global rank 0's submitit handler requeues; the task ends with
    the local executor's requeue status, so the executor starts the job again, which finds the checkpoint in its run
    dir and trains the rest of smoke's 4 steps. One row, ok, resumed_from_step its checkpoint's step. The requeued
    job, signalled by the executor 30 s after its own start, must finish before that: its start-up, 2 steps and the
    final eval."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    args = ["-m", "hydra/launcher=slurm_local", "dist.nproc=2", *QUICK, "hydra.launcher.timeout_min=1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **_stall_until_signalled(tmp_path)}
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "run", *args, f"data.cache_dir={data_cache}"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=err,
            text=True,
        )
        try:
            _signal_stalled(proc, tmp_path / "stall", ranks=2)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    console = (tmp_path / "stdout.txt").read_text()[-3000:] + (tmp_path / "stderr.txt").read_text()[-3000:]
    assert proc.returncode == 0, console
    (row,) = rows(tmp_path)
    assert row["status"] == "ok" and row["world_size"] == 2 and row["resumed_from_step"] > 0, row
    assert json.loads(row["plan"])["dist"]["launch"] == "submitit"
    (run_dir,) = run_dirs(tmp_path)
    assert run_dir.name == "0"  # the sweep's job dir, shared by both tasks (and by the requeued job)
    log = (run_dir / "run.log").read_text()
    stopped = f"checkpoints/step_{row['resumed_from_step']:08d}.pt; job requeued"
    assert stopped in log and f"resumed from {run_dir}" in log and log.count("Caught signal SIGUSR2") == 1
    assert "Job has timed out. Ran 0 minutes out of requested 1 minutes." in log  # timeout_min reached submitit


def test_periodic_validation_and_a_target_on_two_ranks(tmp_path, data_cache):
    """`python -m run dist.nproc=2 eval.every_steps=2` with a target every evaluation reaches: both ranks evaluate
    at step 2 (sharded, all-reduced), agree the target is reached and stop there together; rank 0 alone writes the
    val record (one, in the run's metrics.jsonl) and the time-to-target keys."""
    args = [*QUICK, "dist.nproc=2", "eval.every_steps=2", "budget.target_val_bpb=1000", f"data.cache_dir={data_cache}"]
    proc = run_cli(args, cwd=tmp_path, fork=True)  # the launching process forked; its ranks are new interpreters
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["world_size"] == 2
    assert (result["budget_end"], result["reached"], result["steps_to_target"], result["steps"]) == (
        "target",
        True,
        2,
        2,
    )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    vals = [r for r in records if "val_bpb" in r]
    assert [r["step"] for r in vals] == [2] and vals[0]["val_bpb"] <= 1000
