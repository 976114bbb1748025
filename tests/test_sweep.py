"""Sweeps: the pool launcher, the sweeper (keep going, fail fast, resume), the summary, and a real 2 x 2 multirun
through `python -m run -m` followed by `python -m speedrun.report` on its database."""

from __future__ import annotations

import csv
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import run_cli
from hydra_plugins.speedrun_plugins import job_pool
from hydra_plugins.speedrun_plugins import pool_launcher as pl

# A tiny CPU run of 4 steps (or 2 s, whichever ends first), no warm-up step and a shorter eval: every job is a real
# run, just short (a 2 s budget alone ran ~10 steps a job, which no assertion here needs)
SWEEP_TINY = [
    "hardware=cpu",
    "model=tiny",
    "hardware.micro_batch=4",
    "budget.tokens_per_step=2048",
    "eval.tokens=2048",
    "logger.log_every_seconds=0.5",
    "budget.train_seconds=2",
    "budget.max_steps=4",
    "budget.warmup_steps=0",
]
GRID = ["model.n_layer=1,2", "optim.matrix_lr=0.04,0.02"]


def db_rows(cwd: Path) -> list[dict]:
    con = sqlite3.connect(cwd / "outputs" / "results.sqlite")
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM runs ORDER BY started_at")]


def sweep_dirs(cwd: Path) -> list[Path]:
    return sorted((cwd / "outputs" / "multirun").glob("*/*"), key=lambda p: p.name)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


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


def test_resume_reuses_only_ok_runs_of_this_card_and_this_code(tmp_path):
    from speedrun.records.identity import SWEEP_REUSE_IGNORED, config_identity
    from speedrun.records.store import ResultsDB
    from speedrun.report.manifest import completed_runs

    db = ResultsDB(tmp_path / "results.sqlite")
    config = {"name": "t", "seed": 0, "sweep": "ignored"}
    ident = config_identity(config, SWEEP_REUSE_IGNORED)
    for i, (status, card, code) in enumerate(
        [("ok", "H100", "c0"), ("ok", "H100", "c1"), ("failed", "H100", "c1"), ("ok", "H200", "c1")]
    ):
        db.upsert(
            f"run{i}",
            {
                "status": status,
                "device_name": card,
                "code_fingerprint": code,
                "started_at": i,
                "config": config,
                "run_dir": f"run{i}",
            },
        )
    assert completed_runs(db.path).reusable[ident]["run_dir"] == "run3"  # no conditions: the latest ok run
    assert completed_runs(db.path, device_name="H100", code="c1").reusable[ident]["run_dir"] == "run1"
    assert completed_runs(db.path, device_name="H100", code="c0").reusable[ident]["run_dir"] == "run0"
    other_code = completed_runs(db.path, device_name="H200", code="c2")
    assert not other_code.reusable and other_code.refused[ident] == "ran other code (code_fingerprint c1, here c2)"
    other_card = completed_runs(db.path, device_name="A100", code=None)  # code=None: resume_across_code
    assert not other_card.reusable and other_card.refused[ident] == "ran on another card (H200)"
    assert completed_runs(db.path, device_name="H200", code=None).reusable[ident]["run_dir"] == "run3"
    # a run recorded before runs kept their code_fingerprint: its code is unknown, it is reused (with a warning)
    db.upsert("run4", {"status": "ok", "device_name": "H200", "started_at": 9, "config": config, "run_dir": "run4"})
    assert completed_runs(db.path, device_name="H200", code="c2").reusable[ident]["run_dir"] == "run4"


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


# ---------------------------------------------------------------------------------------------------------
# a real multirun


@pytest.fixture(scope="module")
def project(tmp_path_factory, data_cache):
    """A working dir in which the tests below run sweeps one after another (they share results.sqlite)."""
    return {"cwd": tmp_path_factory.mktemp("sweep"), "data": data_cache}


def _sweep(project, *args, timeout=600, env=None):
    return run_cli(
        ["-m", *SWEEP_TINY, f"data.cache_dir={project['data']}", *args],
        cwd=project["cwd"],
        timeout=timeout,
        env_extra=env,
    )


@pytest.mark.slow
def test_a_2x2_multirun_records_every_job_and_writes_the_summary(project):
    proc = _sweep(project, *GRID)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    (sweep,) = sweep_dirs(project["cwd"])
    job_dirs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in job_dirs] == ["0", "1", "2", "3"]
    rows = db_rows(project["cwd"])
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {r["sweep"] for r in rows} == {sweep.name}
    assert {r["run_dir"] for r in rows} == {str(p.resolve()) for p in job_dirs}
    combos = {(f"model.n_layer={a}", f"optim.matrix_lr={b}") for a in (1, 2) for b in ("0.04", "0.02")}
    assert {
        tuple(o for o in r["overrides"].split() if o.startswith(("model.n_layer", "optim."))) for r in rows
    } == combos
    assert not any("hydra" in r["overrides"] for r in rows)  # the launcher's plumbing is not a task override
    summary = read_csv(sweep / "summary.csv")
    assert len(summary) == 4 and {(r["model.n_layer"], r["optim.matrix_lr"]) for r in summary} == {
        ("1", "0.04"),
        ("1", "0.02"),
        ("2", "0.04"),
        ("2", "0.02"),
    }
    assert all(r["n"] == "1" and r["failures"] == "0" and float(r["val_bpb_mean"]) > 0 for r in summary)
    assert "| model.n_layer | optim.matrix_lr | n | failures | val_bpb" in (sweep / "summary.md").read_text()
    assert "sweep summary" in out and "| model.n_layer" in out  # the same table on the console
    for d in job_dirs:
        assert (d / "result.json").exists() and (d / "console.log").exists() and (d / ".hydra").is_dir()


@pytest.mark.slow
def test_resuming_the_same_sweep_runs_nothing(project):
    proc = _sweep(project, *GRID, "hydra.sweeper.resume=true", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "4 of 4 combination(s) already completed ok" in out
    first, resumed = sweep_dirs(project["cwd"])
    assert not [p for p in resumed.iterdir() if p.is_dir()]  # no job ran
    assert len(db_rows(project["cwd"])) == 4
    manifest = json.loads((resumed / "sweep.json").read_text())
    assert {j["state"] for j in manifest["jobs"]} == {"reused"}
    assert {j["run_dir"] for j in manifest["jobs"]} == {str(p.resolve()) for p in first.iterdir() if p.is_dir()}
    summary = read_csv(resumed / "summary.csv")
    assert len(summary) == 4 and all(r["n"] == "1" for r in summary)
    from speedrun import report

    db = project["cwd"] / "outputs" / "results.sqlite"
    for selector in (resumed.name, "latest", str(resumed)):  # the report sees the runs the resumed sweep reused
        assert len(report.load_runs(db, sweeps=[selector])) == 4


# one combination of GRID: its composed config is that of the first sweep's job 0, whatever the sweep dir
ONE = ["model.n_layer=1", "optim.matrix_lr=0.04"]


@pytest.mark.slow
def test_a_sweep_resumed_on_another_card_runs_its_jobs_again(project):
    from speedrun.records.identity import DEVICE_NAME_ENV

    before = len(db_rows(project["cwd"]))
    # SPEEDRUN_DEVICE_NAME makes the sweeper believe it is on an H200; the earlier runs recorded this CPU
    proc = _sweep(project, *ONE, "hydra.sweeper.resume=true", env={DEVICE_NAME_ENV: "NVIDIA H200"}, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "0 of 1 combination(s) already completed ok (on NVIDIA H200" in out
    assert "1 combination(s) run again: their earlier ok run ran on another card" in out
    sweep = sweep_dirs(project["cwd"])[-1]
    assert [p.name for p in sweep.iterdir() if p.is_dir()] == ["0"] and len(db_rows(project["cwd"])) == before + 1
    manifest = json.loads((sweep / "sweep.json").read_text())
    assert manifest["device_name"] == "NVIDIA H200" and manifest["jobs"][0]["state"] == "launched"
    assert (
        "ran again, not reused: 1 combination(s) whose earlier ok run ran on another card"
        in (sweep / "summary.md").read_text()
    )


@pytest.mark.slow
def test_a_code_change_reruns_unless_resume_across_code(project):
    from speedrun.records.store import ResultsDB

    db = ResultsDB(project["cwd"] / "outputs" / "results.sqlite")
    grid = [r for r in db.rows() if "model.n_layer=1 optim.matrix_lr=0.02" in r["overrides"]]
    assert len(grid) == 1
    db.upsert(grid[0]["run_id"], {"code_fingerprint": "0123456789abcdef"})  # as if other code had made it
    combo = ["model.n_layer=1", "optim.matrix_lr=0.02", "hydra.sweeper.resume=true"]

    proc = _sweep(project, *combo, "hydra.sweeper.resume_across_code=true", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "1 of 1 combination(s) already completed ok" in out and "any code" in out
    reused = sweep_dirs(project["cwd"])[-1]
    assert not [p for p in reused.iterdir() if p.is_dir()]
    summary = (reused / "summary.md").read_text()
    assert f"reused by resume: 1 run(s), from {Path(grid[0]['run_dir']).parent} (1)" in summary

    proc = _sweep(project, *combo, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "0 of 1 combination(s) already completed ok" in out
    assert "their earlier ok run ran other code (code_fingerprint 0123456789abcdef" in out
    rerun = sweep_dirs(project["cwd"])[-1]
    assert [p.name for p in rerun.iterdir() if p.is_dir()] == ["0"]
    assert json.loads((rerun / "sweep.json").read_text())["jobs"][0]["state"] == "launched"


@pytest.mark.slow
def test_a_failing_job_is_recorded_and_the_sweep_goes_on(project):
    # two slots (CUDA_VISIBLE_DEVICES 0 and 1, harmless on CPU): the failing job runs beside the good one
    proc = _sweep(
        project,
        "model.n_layer=1",
        "data.path=nowhere,null",
        # the failing job fails building its data (after env.json); the other has no tokenizer without a path
        "data.tokenizer=${data.path}",
        "hydra.launcher.gpus=[0,1]",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]  # the summary is written, then the exit status says a job failed
    sweep = sweep_dirs(project["cwd"])[-1]
    rows = [r for r in db_rows(project["cwd"]) if r["sweep"] == sweep.name]
    by_path = {("nowhere" if "data.path=nowhere" in r["overrides"] else "null"): r for r in rows}
    assert by_path["nowhere"]["status"] == "failed" and "nowhere" in by_path["nowhere"]["error"]
    assert by_path["null"]["status"] == "ok"
    failed_dir = Path(by_path["nowhere"]["run_dir"])
    assert "Traceback" in (failed_dir / "error.txt").read_text()
    gpus = {json.loads((Path(r["run_dir"]) / "env.json").read_text())["cuda_visible_devices"] for r in rows}
    assert gpus == {"0", "1"}
    summary = {r["data.path"]: r for r in read_csv(sweep / "summary.csv")}
    assert (summary["nowhere"]["failures"], summary["null"]["failures"], summary["null"]["n"]) == ("1", "0", "1")
    assert "## Failures" in (sweep / "summary.md").read_text() and "failed: " in out


@pytest.mark.slow
def test_fail_fast_stops_at_the_first_failure(project):
    before = len(db_rows(project["cwd"]))
    proc = _sweep(project, "data.path=nowhere,null", "hydra.sweeper.fail_fast=true", timeout=300)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    sweep = sweep_dirs(project["cwd"])[-1]
    assert [p.name for p in sweep.iterdir() if p.is_dir()] == ["0"]
    rows = db_rows(project["cwd"])
    assert len(rows) == before + 1 and rows[-1]["status"] == "failed"
    states = [j["state"] for j in json.loads((sweep / "sweep.json").read_text())["jobs"]]
    assert states == ["launched", "not_run"]


@pytest.mark.slow
def test_the_report_on_the_sweep_database(project, tmp_path):
    from test_report import check_in_browser

    first = sweep_dirs(project["cwd"])[0].name
    out = tmp_path / "report"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speedrun.report",
            "--sweep",
            first,
            "--group-by",
            "model.n_layer",
            "--baseline",
            "model.n_layer=1",
            "--out",
            str(out),
        ],
        cwd=project["cwd"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert "leaderboard (val_bpb" in text and "one-sided Welch t-test" in text and "baseline" in text
    board = read_csv(out / "leaderboard.csv")
    assert sorted(r["model.n_layer"] for r in board) == ["1", "2"] and all(r["n"] == "2" for r in board)
    (other,) = [r for r in board if r["model.n_layer"] == "2"]
    assert 0.0 <= float(other["p"]) <= 1.0
    for name in ("pareto.png", "loss_curves.png", "quant_vs_size.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name
    seen = check_in_browser(out / "report.html", tmp_path)
    assert seen == {"data-images": 3, "data-images-loaded": 3, "data-rows": 2}


def test_sigterm_to_the_sweep_stops_its_jobs_instead_of_orphaning_them(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from pathlib import Path\n"
        "from test_sweep import _fake_jobs, job_pool\n"
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
    )
    deadline = time.time() + 30
    while not (tmp_path / "jobs" / "0" / "started").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert "['JobFailed:interrupted', 'JobNotRun:not_run']" in out, out


def test_a_second_ctrl_c_kills_a_job_that_will_not_stop_and_the_pool_records_it(tmp_path):
    """The job ignores SIGTERM (and the terminal's SIGINT): after the first Ctrl-C the pool waits; the second kills
    it at once, and the pool still returns a record of every job instead of raising."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from pathlib import Path\n"
        "from test_sweep import _fake_jobs, job_pool\n"
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
    )
    deadline = time.time() + 30
    while not (tmp_path / "jobs" / "0" / "started").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)  # the pool is waiting for the job, which ignored its SIGTERM
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert "['JobFailed:interrupted', 'JobNotRun:not_run']" in out, out
    assert "interrupted: killed by a second Ctrl-C while it stopped" in out and "stopped in 50 s" not in out, out
    row = db_rows(tmp_path)[0]
    assert (row["status"], row["error"]) == ("interrupted", "killed by a second Ctrl-C while it stopped")
