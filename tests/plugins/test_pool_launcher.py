"""The sweep's launchers (src/hydra_plugins): the pool's slots and the overrides it forwards, the configs that pick
the pool, the sweeper and the summary (or SLURM), and the pool running stand-in jobs (no torch): one job per GPU at a
time, fail-fast, keep going, a SIGTERM or a second Ctrl-C that stops its jobs. Real sweeps through `python -m run
-m`: tests/e2e/test_sweep.py."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hydra_plugins.speedrun_plugins import job_pool
from hydra_plugins.speedrun_plugins import pool_launcher as pl


def db_rows(cwd: Path) -> list[dict]:
    con = sqlite3.connect(cwd / "outputs" / "results.sqlite")
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM runs ORDER BY started_at")]


# ---------------------------------------------------------------------------------------------------------
# units: slots, forwarded overrides, configs


def test_pool_slots_follow_the_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert pl.pool_slots(None, 1, 1) == ["2", "3"]
    assert pl.pool_slots(None, 2, 1) == ["2", "2", "3", "3"]
    assert pl.pool_slots(1, 1, 1) == ["2"]
    with pytest.raises(ValueError, match="only 2 GPU"):
        pl.pool_slots(3, 1, 1)
    assert pl.pool_slots([0, 5], 1, 1) == ["0", "5"] and pl.pool_slots("0,1", 1, 1) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert pl.pool_slots(None, 1, 1) == [None]  # no GPU: sequential
    assert pl.pool_slots(None, 1, 3) == [None, None, None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert pl.pool_slots(None, 1, 1) == [None]


def test_only_job_level_hydra_overrides_reach_a_job():
    kept = pl._forwarded(
        [
            "hydra.mode=MULTIRUN",
            "hydra/launcher=pool",
            "hydra.launcher.gpus=[0]",
            "hydra.sweeper.resume=true",
            "hydra.sweep.dir=x",
            "hydra.run.dir=y",
            "hydra.verbose=true",
            "hydra.job_logging.root.level=WARNING",
        ]
    )
    assert kept == ["hydra.verbose=true", "hydra.job_logging.root.level=WARNING"]


def test_a_sweeps_config_dirs_reach_its_jobs():
    sources = [
        {"path": "hydra.conf", "schema": "pkg", "provider": "hydra"},
        {"path": "/repo/conf", "schema": "file", "provider": "main"},
        {"path": "/home/me/myconf", "schema": "file", "provider": "command-line"},
        {"path": "", "schema": "structured", "provider": "schema"},
    ]
    config = OmegaConf.create({"hydra": {"runtime": {"config_sources": sources}}})
    assert pl._config_dirs(config) == ["--config-dir", "/home/me/myconf"]
    assert pl._config_dirs(OmegaConf.create({"hydra": {"runtime": {"config_sources": sources[:2]}}})) == []


def test_the_default_config_sweeps_with_the_pool_the_sweeper_and_the_summary(compose):
    hydra = compose(["seed=1"], return_hydra_config=True).hydra
    assert hydra.launcher._target_.endswith("pool_launcher.PoolLauncher") and hydra.launcher.cpu_jobs == 1
    assert hydra.sweeper._target_.endswith("sweeper.SpeedrunSweeper") and hydra.sweeper.resume is False
    assert hydra.sweeper.resume_across_code is False
    assert hydra.callbacks.sweep_summary._target_ == "speedrun.report.sweep.SweepSummary"
    assert compose(["hydra.sweeper.fail_fast=true"], return_hydra_config=True).hydra.launcher.fail_fast is True


def test_the_slurm_launcher_config_composes(compose):
    pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher",
        reason="hydra-submitit-launcher is not installed (pip install -e '.[slurm]')",
    )
    launcher = compose(
        ["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], return_hydra_config=True
    ).hydra.launcher
    # submitit's SLURM launcher, extended so a preempted job requeues with resume=<run dir> (test_preemption.py)
    assert launcher._target_ == "hydra_plugins.speedrun_plugins.slurm_launcher.SpeedrunSlurmLauncher"
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.partition) == (1, 1, "gpu")


# ---------------------------------------------------------------------------------------------------------
# the pool with stand-in jobs (no torch): parallelism, GPU assignment, fail-fast


def _fake_jobs(tmp_path: Path, scripts: list[str]) -> list[job_pool.Job]:
    jobs = []
    for i, code in enumerate(scripts):
        job_dir = tmp_path / str(i)
        body = (
            "import json, os, sys, time\n"
            f"d = {str(job_dir)!r}\n"
            "def done(status, **kw):\n"
            "    json.dump(dict(status=status, gpu=os.environ.get('CUDA_VISIBLE_DEVICES'), **kw),"
            " open(os.path.join(d, 'result.json'), 'w'))\n" + code
        )
        config = OmegaConf.create(
            {"hydra": {"job": {"name": "fake", "num": i}, "runtime": {"output_dir": str(job_dir)}}}
        )
        jobs.append(
            job_pool.Job(
                num=i, overrides=[f"job={i}"], config=config, job_dir=job_dir, cmd=[sys.executable, "-c", body]
            )
        )
    return jobs


def test_pool_runs_one_job_per_gpu_at_a_time(tmp_path):
    sleep = "t0 = time.time(); time.sleep(1.0); done('ok', t0=t0, t1=time.time())\n"
    jobs = _fake_jobs(tmp_path, [sleep] * 4)
    start = time.time()
    rets = job_pool.Pool(["0", "1"], fail_fast=False, echo=False, stop_timeout_s=10).run(jobs)
    wall = time.time() - start
    results = [json.loads((tmp_path / str(i) / "result.json").read_text()) for i in range(4)]
    assert all(r.status.name == "COMPLETED" for r in rets)
    assert sorted(r["gpu"] for r in results) == ["0", "0", "1", "1"]
    for gpu in ("0", "1"):  # never two jobs on one GPU at once
        spans = sorted((r["t0"], r["t1"]) for r in results if r["gpu"] == gpu)
        assert spans[0][1] <= spans[1][0]
    assert wall < 3.6, f"4 x 1 s jobs on 2 slots took {wall:.1f}s"
    assert (tmp_path / "0" / "console.log").exists()


def test_pool_fail_fast_stops_running_jobs_and_starts_no_more(tmp_path):
    scripts = [
        "time.sleep(0.3); done('failed', error='boom'); sys.exit(1)\n",
        "import signal\n"
        "signal.signal(signal.SIGTERM, lambda *a: (done('interrupted'), sys.exit(1)))\n"
        "time.sleep(30); done('ok')\n",
        "done('ok')\n",
    ]
    jobs = _fake_jobs(tmp_path, scripts)
    start = time.time()
    rets = job_pool.Pool(["0", "1"], fail_fast=True, echo=False, stop_timeout_s=10).run(jobs)
    assert time.time() - start < 15
    assert [type(r._return_value).__name__ for r in rets] == ["JobFailed", "JobFailed", "JobNotRun"]
    assert rets[1]._return_value.status == "interrupted" and not (tmp_path / "2").exists()


def test_keep_going_runs_every_job_after_a_failure(tmp_path):
    jobs = _fake_jobs(tmp_path, ["sys.exit(3)\n", "done('ok')\n"])
    rets = job_pool.Pool([None], fail_fast=False, echo=False, stop_timeout_s=10).run(jobs)
    assert [r.status.name for r in rets] == ["FAILED", "COMPLETED"]
    assert "exited with code 3" in str(rets[0]._return_value)


STARTED, STOPPED = 120.0, 120.0
"""Seconds a driver's job may take to start, and the driver to end once signalled: generous, since a loaded machine
starts Python slowly; a signal sent before the job started would test nothing, so the tests wait for it."""


def as_from_a_shell() -> None:
    """In the driver's child before exec: Ctrl-C and SIGTERM unblocked and at their defaults, as a shell starts a
    command. A blocked or ignored signal survives exec, and a pytest worker may hold one from an earlier test (the
    suite then saw the pool sleep through both Ctrl-Cs)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def wait_for_start(marker: Path, proc: subprocess.Popen) -> None:
    """Until the job wrote ``marker`` (it runs, with its signal handlers set); fails naming the driver's output."""
    deadline = time.time() + STARTED
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if not marker.exists():
        proc.kill()
        raise AssertionError(f"the job never started within {STARTED:g} s: {proc.communicate()[0]}")


def test_sigterm_to_the_sweep_stops_its_jobs_instead_of_orphaning_them(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from pathlib import Path\n"
        "from test_pool_launcher import _fake_jobs, job_pool\n"
        "scripts = ['import signal\\n"
        'signal.signal(signal.SIGTERM, lambda *a: (done("interrupted"), sys.exit(1)))\\n'
        'open(os.path.join(d, "started"), "w").close(); time.sleep(60); done("ok")\\n\', "done(\'ok\')\\n"]\n'
        "rets = job_pool.Pool([None], fail_fast=False, echo=False, stop_timeout_s=10)"
        ".run(_fake_jobs(Path(sys.argv[1]), scripts))\n"
        "print([type(r._return_value).__name__ + ':' + getattr(r._return_value, 'status', '') for r in rets])\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(tmp_path / "jobs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=as_from_a_shell,
    )
    wait_for_start(tmp_path / "jobs" / "0" / "started", proc)
    proc.terminate()
    out, _ = proc.communicate(timeout=STOPPED)
    assert "['JobFailed:interrupted', 'JobNotRun:not_run']" in out, out


def test_a_second_ctrl_c_kills_a_job_that_will_not_stop_and_the_pool_records_it(tmp_path):
    """The job ignores SIGTERM (and the terminal's SIGINT): after the first Ctrl-C the pool waits; the second kills
    it at once, and the pool still returns a record of every job instead of raising."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from pathlib import Path\n"
        "from test_pool_launcher import _fake_jobs, job_pool\n"
        "scripts = ['import signal\\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN)\\n"
        'open(os.path.join(d, "started"), "w").close(); time.sleep(60); done("ok")\\n\', "done(\'ok\')\\n"]\n'
        "t0 = time.time()\n"
        "rets = job_pool.Pool([None], fail_fast=False, echo=False, stop_timeout_s=50)"
        ".run(_fake_jobs(Path(sys.argv[1]), scripts))\n"
        "print([type(r._return_value).__name__ + ':' + getattr(r._return_value, 'status', '') for r in rets])\n"
        "print(rets[0]._return_value)\n"
        "print(f'stopped in {time.time() - t0:.0f} s')\n"
    )
    # in tmp_path: the pool writes the killed job's row into outputs/results.sqlite of its working dir
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(tmp_path / "jobs")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=as_from_a_shell,
    )
    wait_for_start(tmp_path / "jobs" / "0" / "started", proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)  # the pool is waiting for the job, which ignored its SIGTERM
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=STOPPED)
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert "['JobFailed:interrupted', 'JobNotRun:not_run']" in out, out
    assert "interrupted: killed by a second Ctrl-C while it stopped" in out and "stopped in 50 s" not in out, out
    row = db_rows(tmp_path)[0]
    assert (row["status"], row["error"]) == ("interrupted", "killed by a second Ctrl-C while it stopped")
