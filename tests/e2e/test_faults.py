"""Faults a run dir must survive, injected at a chosen moment into real CPU runs: kill -9 mid-training, a second
owner, a disk that fills or refuses writes, a database that fills, and run dirs tampered with (a copied dir naming
another machine's paths, bit flips in a checkpoint, orphan temp files, changed code, a model class or an
interpolation planted in the stored config). Each test asserts the row, the files and the console."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cli import Forked, run_cli, run_python

pytestmark = pytest.mark.slow

# debug=smoke with 2 micro-batches a step (512 tokens, not its 6144), no warm-up step and a short eval: what these
# tests check is what a run leaves on disk and in its row, not what it trains to
SMOKE = ["debug=smoke", "budget.warmup_steps=0", "budget.tokens_per_step=512", "eval.tokens=1024"]


@pytest.fixture(scope="module")
def smoke(data_cache):
    """The smoke run's overrides, with the pytest session's dataset (built here once, so no fault hits its build)."""
    from speedrun.data import ensure_embedded_dataset

    ensure_embedded_dataset(Path(data_cache), vocab_size=1024)
    return [*SMOKE, f"data.cache_dir={data_cache}"]


DRIVER = str(Path(__file__).with_name("fault_driver.py"))
"""Run forked from this process (support.cli.run_python, Forked): the faults it patches in stay in the child."""


def rows(db: Path) -> dict[str, dict]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return {r["run_id"]: dict(r) for r in con.execute("SELECT * FROM runs")}
    finally:
        con.close()


def one_line(proc: subprocess.CompletedProcess, needle: str, code: int = 1) -> str:
    """The single console line naming the problem; no traceback."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    (line,) = [ln for ln in out.splitlines() if needle in ln]
    return line


def wait_for(path_glob: str, where: Path, count: int, proc: Forked, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while len(list(where.glob(path_glob))) < count:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.time() < deadline, f"no {count} x {path_glob} in {where}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def killed(tmp_path_factory, smoke):
    """A run killed with SIGKILL once two checkpoints exist; while it was alive, a second run asked for its dir and
    a resume asked to continue it (their outcomes are kept for the tests)."""
    cwd = tmp_path_factory.mktemp("killed")
    db, run_dir = cwd / "r.sqlite", cwd / "run"
    args = [*smoke, "checkpoint.every_steps=1", f"results_db={db}"]
    # stalled after its 2nd of 4 steps (fault_driver): alive until killed whatever the machine's load, and a resume
    # of it trains the few steps left, not the hundreds a long run would need to outlive its rivals
    proc = Forked([DRIVER, "stall_after_checkpoints:2", *args, f"hydra.run.dir={run_dir}"], cwd)
    wait_for("checkpoints/step_*.json", run_dir, 2, proc)
    # one after the other, each forked from this process (run_cli fork=True) while the stalled owner holds the dir
    outcomes = {
        "same_dir": run_cli([*args, f"hydra.run.dir={run_dir}"], cwd=cwd, timeout=120, fork=True),
        "resume": run_cli([f"resume={run_dir}", f"results_db={db}"], cwd=cwd, timeout=120, fork=True),
    }
    # the stall held: no step past the 2nd was checkpointed while the two rivals ran
    saved = sorted(p.name for p in run_dir.glob("checkpoints/step_*.json"))
    assert saved == ["step_00000001.json", "step_00000002.json"], f"the run did not stall at its 2nd step: {saved}"
    assert proc.poll() is None, "the run ended before it could be killed"
    row_alive = rows(db)[str(run_dir.resolve())]
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    return cwd, db, run_dir, outcomes, row_alive


def test_a_second_owner_is_refused_in_one_line_and_leaves_the_run_alone(killed):
    cwd, db, run_dir, outcomes, row_alive = killed
    run_id = str(run_dir.resolve())
    line = one_line(outcomes["same_dir"], "is in use by pid")
    assert str(row_alive["pid"]) in line
    line = one_line(outcomes["resume"], "is in use by pid")
    # the owner's row kept its own process and status; each refusal has a row of its own, outside the owner's
    assert row_alive["status"] == "running" and row_alive["pid"] not in (None, os.getpid())
    refused = [r for r in rows(db).values() if r["run_id"] != run_id]
    assert len(refused) == 2 and {r["status"] for r in refused} == {"failed"}
    assert all("in use by pid" in r["error"] for r in refused)
    assert any(r["run_id"].startswith(run_id + "/refused_attempts/") for r in refused)  # a row named under it
    # a refused command writes nothing into the owner's dir: no .hydra/<time>/ of its own, no line in its run.log
    assert [p.name for p in (run_dir / ".hydra").iterdir() if p.is_dir()] == []
    assert not (run_dir / "refused_attempts").exists() and "in use by pid" not in (run_dir / "run.log").read_text()


def test_a_killed_run_reads_lost_and_the_next_run_on_its_database_says_so(killed, smoke, tmp_path):
    from speedrun.records.store import effective_status

    _, shared_db, run_dir, _, _ = killed
    db = tmp_path / "r.sqlite"  # a copy: the next run adds its own row, which the shared database must not get
    shutil.copyfile(shared_db, db)
    row = rows(db)[str(run_dir.resolve())]
    assert row["status"] == "running" and row["heartbeat_at"] and row["host"]
    assert effective_status(row) == "lost"  # its pid is gone from this host
    # the next run on that database (here one refused for a bad value, after its record opened) writes it down
    proc = run_cli([*smoke, "checkpoint.keep=0", f"results_db={db}"], cwd=tmp_path, fork=True)
    one_line(proc, "checkpoint.keep=0")
    row = rows(db)[str(run_dir.resolve())]
    assert row["status"] == "lost" and f"pid {row['pid']}" in row["error"]


def test_a_copied_tampered_run_dir_resumes_into_this_commands_database_from_the_step_that_loads(killed, tmp_path):
    """The dir moves to another place and another working directory; its checkpoints name another machine's
    directory and other code; its newest checkpoint has bit flips; killed writers left temp files."""
    from speedrun.records.atomic import TEMP_SUFFIX

    _, _, run_dir, _, _ = killed
    copy = tmp_path / "moved" / "run"
    shutil.copytree(run_dir, copy)
    elsewhere = tmp_path / "home-alice-otherbox"
    steps = sorted((copy / "checkpoints").glob("step_*.json"))
    for meta_path in steps:
        meta = json.loads(meta_path.read_text())
        meta.update(cwd=str(elsewhere), code_fingerprint="0123456789abcdef")
        meta_path.write_text(json.dumps(meta))
    newest = steps[-1].with_suffix(".pt")
    data = bytearray(newest.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 512):
        data[i] ^= 0x5A
    newest.write_bytes(bytes(data))
    orphans = [
        copy / f".result.json.999999{TEMP_SUFFIX}",
        copy / "checkpoints" / f".step_00000009.pt.999999{TEMP_SUFFIX}",
    ]
    for orphan in orphans:
        orphan.write_text("half")
    here = tmp_path / "here"
    here.mkdir()

    refused = run_cli([f"resume={copy}"], cwd=here, fork=True)  # other code: refused, naming both fingerprints
    line = one_line(refused, "code changed since the checkpoint")
    assert "0123456789abcdef" in line and "accept_code_change=true" in line

    proc = run_cli([f"resume={copy}", "accept_code_change=true"], cwd=here, fork=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("trying an older one") == 1 and "Traceback" not in out
    assert not elsewhere.exists()
    assert not any(o.exists() for o in orphans)
    (row,) = [r for r in rows(here / "outputs" / "results.sqlite").values() if r["run_id"] == str(copy.resolve())]
    older = int(steps[-2].stem.split("_")[1])
    assert row["status"] == "ok" and row["resumed_from_step"] == older
    assert row["config"] and row["started_at"] and row["overrides"] is not None
    assert row["resume_code_change"].startswith("0123456789abcdef -> ")


def test_a_model_class_or_an_interpolation_planted_in_a_run_dir_is_refused_before_anything_runs(
    killed, tmp_path, monkeypatch
):
    _, _, run_dir, _, _ = killed
    planted = tmp_path / "planted"
    shutil.copytree(run_dir, planted)
    for meta_path in (planted / "checkpoints").glob("step_*.json"):
        meta = json.loads(meta_path.read_text())
        meta["config"]["model"]["arch"] = "evilmod:Evil"
        meta_path.write_text(json.dumps(meta))
    (planted / "evilmod.py").write_text("from pathlib import Path\nPath('IMPORTED').write_text('ran')\n")
    proc = run_cli(["resume=."], cwd=planted)
    one_line(proc, "model.arch=evilmod:Evil")
    assert not (planted / "IMPORTED").exists()

    # an interpolation is refused, never resolved (checked without a process: the same function the run calls)
    from speedrun.errors import ConfigError
    from speedrun.run.resume import accepted_resume

    monkeypatch.setenv("SPEEDRUN_TEST_SECRET", "hunter2")
    for meta_path in (planted / "checkpoints").glob("step_*.json"):
        meta = json.loads(meta_path.read_text())
        meta["config"]["name"] = "${oc.env:SPEEDRUN_TEST_SECRET}"
        meta_path.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="interpolation") as refused:
        accepted_resume(str(planted), [], tmp_path)
    assert "hunter2" not in str(refused.value)


def _file_size_limit(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_fails_the_run_in_one_line_and_leaves_no_half_written_file(tmp_path, smoke):
    """A file-size limit below a checkpoint's size: the first checkpoint's write fails as on a full disk."""
    db, run_dir = tmp_path / "db" / "r.sqlite", tmp_path / "run"
    args = [*smoke, "budget.max_steps=3", "checkpoint.every_steps=1", f"results_db={db}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(
        [sys.executable, "-m", "run", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_file_size_limit(600_000),
    )
    line = one_line(proc, "File too large")
    assert "hydra.run.dir=" in line  # the fix
    row = rows(db)[str(run_dir.resolve())]
    assert row["status"] == "failed" and "checkpoint" in row["error"]
    assert json.loads((run_dir / "result.json").read_text())["status"] == "failed"
    assert not list(run_dir.rglob("*tmp"))
    assert (run_dir / ".owner.lock").read_text() == ""  # released


def test_a_database_that_fills_mid_run_ends_the_run_non_zero_in_one_line(tmp_path, smoke):
    db = tmp_path / "r.sqlite"
    args = [*smoke, "budget.max_steps=2", f"results_db={db}", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_python([DRIVER, "db_full_after:1", *args], cwd=tmp_path, timeout=300)
    line = one_line(proc, "its record could not be written")
    assert "database or disk is full" in proc.stdout + proc.stderr
    assert "result.json" in line
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "ok"  # the run dir holds it


def test_a_read_only_outputs_dir_is_one_line_before_anything_is_written(tmp_path):
    proc = run_python([DRIVER, f"erofs:{tmp_path}", *SMOKE], cwd=tmp_path, timeout=120)
    line = one_line(proc, "Read-only file system")
    assert "outputs" in line
    assert not (tmp_path / "outputs" / "runs").exists()


# ---------------------------------------------------------------------------------------------------------
# A run dir cannot reach outside itself: what it holds is data, and a finished run is never written again.


@pytest.fixture(scope="module")
def finished(default_smoke_run):
    """The pytest session's finished smoke run (conftest's default_smoke_run, shared: tests tamper with copies)."""
    assert default_smoke_run.proc.returncode == 0, default_smoke_run.proc.stdout[-3000:]
    return default_smoke_run


def copy_of(finished, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(cwd, database, run dir): the finished run and its database copied into tmp_path/outputs, as a user's tree
    holds them."""
    run_dir = tmp_path / "outputs" / "runs" / "done"
    shutil.copytree(finished.run_dir, run_dir, symlinks=True)
    shutil.copyfile(finished.db, tmp_path / "outputs" / "results.sqlite")
    return tmp_path, tmp_path / "outputs" / "results.sqlite", run_dir


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def export_main(args: list, capsys) -> tuple[int, str]:
    from speedrun.export.cli import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_export_force_never_deletes_the_run_dir_the_database_or_outputs(finished, tmp_path, monkeypatch, capsys):
    cwd, db, run_dir = copy_of(finished, tmp_path)
    monkeypatch.chdir(cwd)  # outputs/results.sqlite, the default database, is the one beside the run
    before, outputs = snapshot(run_dir), snapshot(cwd / "outputs")
    own = cwd / "own"
    own.mkdir()
    (own / "notes.txt").write_text("mine")
    for out, says in [
        (run_dir, "is the run dir"),
        (run_dir / "sub", "lies inside the run dir"),
        (cwd / "outputs", "holds"),
        (run_dir.parent, "holds the run dir"),
        (db, "is the results database"),
        (own, "holds files an export does not write (notes.txt)"),
    ]:
        code, text = export_main([run_dir, "--out", out, "--force"], capsys)
        assert code == 1 and says in text and len(text.strip().splitlines()) == 1, (out, text)
    assert snapshot(cwd / "outputs") == outputs and snapshot(run_dir) == before
    assert (own / "notes.txt").read_text() == "mine"
    # an earlier export is what --force replaces
    code, text = export_main([run_dir, "--out", cwd / "sub"], capsys)
    assert code == 0, text
    code, text = export_main([run_dir, "--out", cwd / "sub"], capsys)
    assert code == 1 and "--force" in text
    assert export_main([run_dir, "--out", cwd / "sub", "--force"], capsys)[0] == 0


def test_a_plan_json_name_never_reads_a_file_outside_conf(finished, tmp_path, capsys):
    _, _, run_dir = copy_of(finished, tmp_path)
    secret = tmp_path / "secret"
    secret.with_suffix(".yaml").write_text("stolen_key: do-not-publish\n")
    (run_dir / "train_gpt.py").unlink()  # a raw-rule run: the export builds the file from plan.json's choices
    plan = json.loads((run_dir / "plan.json").read_text())
    plan["model_name"] = str(secret)
    (run_dir / "plan.json").write_text(json.dumps(plan))
    code, text = export_main([run_dir, "--out", tmp_path / "sub", "--force"], capsys)
    # the file is built from plan.json's settings, which name no file: the model's name is a label, never opened
    assert code == 0, text
    published = "".join(p.read_text(errors="replace") for p in (tmp_path / "sub").iterdir())
    assert "stolen_key" not in published and "do-not-publish" not in published
    from speedrun.config.track_rules import load_attribution, load_records, load_track

    with pytest.raises(ValueError, match="no track"):  # a track name a run recorded, aimed outside conf/track/
        load_track(str(secret))
    assert load_records(str(secret)) == () and load_attribution(str(secret)) == ()


def test_a_symlink_in_a_run_dir_is_never_followed_by_a_run_a_resume_or_an_export(
    finished, killed, smoke, tmp_path, capsys
):
    from speedrun.errors import ConfigError
    from speedrun.run.resume import accepted_resume

    cwd, db, run_dir = copy_of(finished, tmp_path)
    target = tmp_path / "precious.txt"
    target.write_text("precious\n")
    (run_dir / "run.log").unlink()
    (run_dir / "run.log").symlink_to(target)
    (run_dir / ".owner.lock").unlink()
    (run_dir / ".owner.lock").symlink_to(target)
    before = snapshot(run_dir)
    # a fresh run given that dir: refused before its lock is opened, nothing appended to the link's target
    proc = run_cli([*smoke, f"results_db={db}", f"hydra.run.dir={run_dir}"], cwd=cwd, fork=True)
    line = one_line(proc, "holds symlinks")
    assert ".owner.lock -> " in line and "run.log -> " in line
    assert target.read_text() == "precious\n" and snapshot(run_dir) == before
    assert sorted(p.name for p in (run_dir / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    # the export publishes no link's target
    code, text = export_main([run_dir, "--out", tmp_path / "sub"], capsys)
    assert code == 1 and "holds symlinks" in text and not (tmp_path / "sub").exists()
    # a resume of an interrupted run whose run.log is a link: refused by the check Hydra's resolver makes
    _, _, killed_dir, _, _ = killed
    copy = tmp_path / "killed"
    shutil.copytree(killed_dir, copy, symlinks=True)
    (copy / "run.log").unlink()
    (copy / "run.log").symlink_to(target)
    with pytest.raises(ConfigError, match="holds symlinks"):
        accepted_resume(str(copy), [], tmp_path)


def test_a_finished_run_is_never_resumed_and_a_refused_command_writes_nothing_into_it(killed, smoke, tmp_path):
    _, _, killed_dir, _, _ = killed
    run_dir = tmp_path / "done"
    shutil.copytree(killed_dir, run_dir, symlinks=True)
    result = json.loads((run_dir / "result.json").read_text())
    result.update(status="ok", phase="done", val_loss=5.0, val_bpb=3.0)  # training ended, then evaluation
    (run_dir / "result.json").write_text(json.dumps(result))
    (run_dir / ".owner.lock").write_text("")
    before = snapshot(run_dir)
    db = tmp_path / "r.sqlite"
    proc = run_cli([f"resume={run_dir}", f"results_db={db}"], cwd=tmp_path, fork=True)
    line = one_line(proc, "holds a finished run (status ok)")
    assert "never written again" in line and "speedrun.export" in line
    assert snapshot(run_dir) == before
    # a fresh run refused that dir is told to go elsewhere, not to resume it, and writes nothing there either
    proc = run_cli(
        [*smoke, "checkpoint.every_steps=1", f"results_db={db}", f"hydra.run.dir={run_dir}"], cwd=tmp_path, fork=True
    )
    line = one_line(proc, "holds a finished run (status ok)")
    assert "resume=" not in line and "hydra.run.dir=" in line
    assert snapshot(run_dir) == before and sorted(os.listdir(run_dir)) == sorted(os.listdir(killed_dir))


def test_a_folder_that_is_no_run_dir_is_refused_and_keeps_its_files(smoke, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "train_gpt.py").write_text("print('my own script')\n")
    (folder / "result.json").write_text('{"score": 1}\n')
    (folder / ".notes.tmp").write_text("draft\n")
    before = snapshot(folder)
    proc = run_cli([*smoke, f"results_db={tmp_path / 'r.sqlite'}", f"hydra.run.dir={folder}"], cwd=tmp_path, fork=True)
    line = one_line(proc, "is not a speedrun run dir")
    assert "new or empty folder" in line
    assert snapshot(folder) == before and sorted(os.listdir(folder)) == [".notes.tmp", "result.json", "train_gpt.py"]


def test_a_row_and_its_result_json_never_disagree_for_long(finished, tmp_path, capsys):
    """A run whose last row write failed (its row says running, its pid is gone, result.json says ok) is not lost:
    the next run's mark_lost takes result.json's status, and `report --resync` rewrites such rows."""
    from speedrun.records.store import LOST_AFTER_SECONDS, ResultsDB, process_identity
    from speedrun.report.cli import main as report_main

    cwd, db_path, run_dir = copy_of(finished, tmp_path)
    db = ResultsDB(db_path)
    (row,) = db.rows()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    me = process_identity()
    here = {**me, "run_dir": str(run_dir), "pid": int(dead.stdout), "heartbeat_at": time.time()}
    db.upsert(row["run_id"], {**here, "status": "running"})
    assert db.mark_lost() == [] and db.rows()[0]["status"] == "ok"  # the dead pid's result.json says ok
    # live runs are not lost: one in another pid namespace of this kernel, one of a machine whose clock differs
    db.upsert("container", {**here, "status": "running", "pid_ns": "pid:[1]", "run_dir": str(tmp_path / "c")})
    other = {**here, "boot_id": "another-kernel", "heartbeat_at": time.time() - 700, "run_dir": str(tmp_path / "o")}
    db.upsert("skewed", {**other, "status": "running"})
    assert db.mark_lost() == [] and db.mark_lost(now=time.time() + 60) == []
    # once their heartbeats stood still for LOST_AFTER_SECONDS: this kernel's clock, the other's as seen here
    assert sorted(db.mark_lost(now=time.time() + LOST_AFTER_SECONDS + 5)) == ["container", "skewed"]
    # a row marked lost by an older speedrun is rewritten from result.json by `report --resync`
    db.upsert(row["run_id"], {"status": "lost", "error": "lost: pid 1"})
    assert report_main(["--db", str(db_path), "--resync"]) == 0
    assert f"{row['run_id']}: lost -> ok" in capsys.readouterr().out
    fixed = {r["run_id"]: r for r in db.rows()}[row["run_id"]]
    assert fixed["status"] == "ok" and fixed["error"] is None and fixed["val_bpb"] == row["val_bpb"]


def test_a_sweep_dir_is_owned_by_one_sweep_whose_summary_counts_its_own_jobs(finished, tmp_path):
    from hydra_plugins.speedrun_plugins.sweeper import SWEEP_LOCK, SweepDirRefused, own_sweep_dir
    from speedrun.report.manifest import JobEntry, job_result

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    own_sweep_dir(sweep)  # the first sweep: held until this process ends
    with pytest.raises(SweepDirRefused, match="in use by pid .* wait for that sweep to end") as refused:
        own_sweep_dir(sweep)  # a second sweep on the same dir (its own open file: flock refuses it too)
    assert len(str(refused.value).splitlines()) == 1 and str(os.getpid()) in str(refused.value)
    assert sorted(os.listdir(sweep)) == [SWEEP_LOCK]  # refused before anything else is written
    # a job refused its dir, which holds another sweep's ok run: its summary row is its own failure
    job = JobEntry(index=0, overrides=["seed=0"], state="launched", status="failed", error="ConfigError: in use")
    job.run_dir = str(finished.run_dir)
    assert job_result(job) == {"status": "failed", "error": "ConfigError: in use"}


@pytest.mark.parametrize(
    "newest", ['{"steps": "abc", "config": {}}', '{"steps": 3, "config": []}', "[1, 2]", '{"steps": 3, "conf']
)
def test_a_malformed_checkpoint_json_falls_back_to_the_older_one_or_is_one_line(killed, tmp_path, newest):
    from speedrun.errors import ConfigError
    from speedrun.run.resume import accepted_resume

    _, _, killed_dir, _, _ = killed
    copy = tmp_path / "run"
    shutil.copytree(killed_dir, copy, symlinks=True)
    metas = sorted((copy / "checkpoints").glob("step_*.json"))
    older = json.loads(metas[-2].read_text())
    metas[-1].write_text(newest)
    assert accepted_resume(str(copy), [], tmp_path)[1]["steps"] == older["steps"]  # as a bad .pt falls back
    for meta in metas:
        meta.write_text(newest)
    with pytest.raises(ConfigError, match="unreadable") as refused:
        accepted_resume(str(copy), [], tmp_path)
    assert len(str(refused.value).splitlines()) == 1


def test_a_swapped_or_garbage_tokenizer_in_the_dataset_cache_is_one_line_never_used(smoke, data_cache, tmp_path):
    from speedrun.data import ensure_embedded_dataset
    from speedrun.data.prepare import embedded_dir
    from speedrun.errors import DataError

    cache = tmp_path / "cache"
    shutil.copytree(data_cache, cache, ignore=shutil.ignore_patterns(".*"))
    model = embedded_dir(cache, 1024) / "tokenizer.model"  # the shared cache may hold other vocabularies too
    data = bytearray(model.read_bytes())
    data[-40] ^= 0x01  # one piece's score differs: another tokenizer of the same size
    model.write_bytes(bytes(data))
    with pytest.raises(DataError, match="is not the tokenizer .* was built with") as refused:
        ensure_embedded_dataset(cache, vocab_size=1024)
    assert "delete" in str(refused.value) and len(str(refused.value).splitlines()) == 1
    from speedrun.data.tokenizer import open_tokenizer as load_tokenizer

    model.write_bytes(b"garbage")
    with pytest.raises(DataError, match="not a valid SentencePiece model"):
        load_tokenizer(model)


def test_a_path_holding_quotes_or_backslashes_reaches_a_job_and_the_ranks_unchanged():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra_plugins.speedrun_plugins.pool_launcher import quote
    from speedrun.config.quoting import hydra_quote
    from speedrun.distributed.launch import _quote
    from speedrun.errors import ConfigError

    parser = OverridesParser.create()
    for path in ["/home/o'brien/sweep", "/data/a\\b", "/trailing\\", "/x\\'y", "/a b/c=d,e[f]{g}"]:
        assert parser.parse_override(f"hydra.sweep.dir={quote(path)}").value() == path  # a sweep's jobs
        assert parser.parse_override(f"hydra.run.dir={_quote(path)}").value() == path  # a run's ranks
    with pytest.raises(ConfigError, match="interpolation"):
        hydra_quote("/tmp/${oc.env:HOME}")


def test_the_bench_records_a_command_a_shell_reads_back_word_for_word(tmp_path):
    import shlex

    from speedrun.bench.checks import CHECKS
    from speedrun.bench.runner import reproduce
    from speedrun.bench.steps import Options

    check = next(c for c in CHECKS.values() if c.peers)
    odd = tmp_path / "it's a dir" / "train_gpt.py"
    opts = Options(peers=dict.fromkeys(check.peers, odd), overrides=("model.n_layer=2",))
    words = shlex.split(reproduce(check, opts, dict.fromkeys(check.peers, odd)))
    assert [w for w in words if w.endswith(str(odd))] == [f"{p}={odd}" for p in check.peers]
    assert words[:4] == ["python", "-m", "speedrun.bench", check.name]


def test_speedrun_variables_left_in_the_shell_are_said_at_the_start_of_a_run():
    from speedrun.run.runner import environment_notes

    assert environment_notes({"SPEEDRUN_GPU_SHARED": "0", "PATH": "/bin"}) == []  # the pool's own default
    notes = environment_notes({"SPEEDRUN_GPU_SHARED": "1", "SPEEDRUN_START_GATE": "/tmp/gate"})
    assert len(notes) == 2 and "gpu_shared" in notes[0] and "/tmp/gate" in notes[1]
    assert all("unset it" in n for n in notes)


def test_rank_variables_left_in_the_shell_are_one_line():
    from speedrun.distributed.environment import world_from_env
    from speedrun.errors import ConfigError

    with pytest.raises(ConfigError, match="MASTER_ADDR and MASTER_PORT not.*unset RANK and WORLD_SIZE"):
        world_from_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="not numbers"):
        world_from_env({"RANK": "zero", "WORLD_SIZE": "2"})
    ranked = world_from_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert (ranked.rank, ranked.world_size) == (1, 2)  # torchrun's full set still starts a rank


def test_a_module_planted_in_a_run_dir_is_not_imported_by_a_command_started_there(tmp_path):
    (tmp_path / "result.json").write_text('{"status": "ok"}\n')  # a run dir, as a user may cd into one
    (tmp_path / "hydra.py").write_text("raise SystemExit('planted module imported')\n")
    proc = run_cli(["--help"], cwd=tmp_path)
    assert proc.returncode == 0 and "planted" not in proc.stdout + proc.stderr, proc.stderr[-2000:]


def test_a_damaged_wrapper_payload_or_a_non_numeric_result_is_one_line_at_export(finished, tmp_path, capsys):
    _, _, run_dir = copy_of(finished, tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    (run_dir / "result.json").write_text(json.dumps({**result, "artifact_bytes": "lots"}))
    code, text = export_main([run_dir, "--out", tmp_path / "a", "--force"], capsys)
    assert code == 1 and "artifact_bytes is 'lots', not a number" in text and len(text.strip().splitlines()) == 1
    (run_dir / "result.json").write_text(json.dumps(result))
    wrapped = run_dir / "train_gpt.py"
    lines = wrapped.read_bytes().split(b"\n")
    at = next(i for i, ln in enumerate(lines) if ln.startswith(b'P="'))
    lines[at] = lines[at][:40] + b"garbage" + lines[at][47:]  # bytes of the compressed payload changed
    wrapped.write_bytes(b"\n".join(lines))
    code, text = export_main([run_dir, "--out", tmp_path / "b", "--force"], capsys)
    assert code == 1 and "payload is damaged" in text and len(text.strip().splitlines()) == 1, text


def test_the_report_reads_a_wal_database_on_a_read_only_disk(finished, tmp_path, monkeypatch):
    from speedrun.report import run_rows

    _, db, _ = copy_of(finished, tmp_path)
    real = sqlite3.connect

    class ReadOnlyDisk:  # what a plain open gives when the database's -shm cannot be created
        text_factory = None

        def execute(self, *args):
            raise sqlite3.OperationalError("unable to open database file")

        def close(self):
            pass

    def connect(target, *args, uri=False, **kwargs):
        return real(target, *args, uri=uri, **kwargs) if uri else ReadOnlyDisk()

    monkeypatch.setattr(run_rows.sqlite3, "connect", connect)
    found, skipped = run_rows.read_rows(db)
    assert [r["status"] for r in found] == ["ok"] and skipped == []


def test_a_result_json_that_could_not_be_written_is_written_again_with_the_rows_status(tmp_path, monkeypatch):
    from speedrun.records.store import ResultsDB, empty_result
    from speedrun.run import job_record
    from speedrun.run.runner import RunContext

    db, run_dir = ResultsDB(tmp_path / "r.sqlite"), tmp_path / "run"
    result = {**empty_result(), "status": "ok", "phase": "done", "run_dir": str(run_dir)}
    job = job_record.JobRecord(RunContext(run_dir, [], None, tmp_path), result, {}, db, str(run_dir))
    real, calls = job_record.write_json, []

    def full_once(path, obj):  # the disk is full for the first write (a quantized artifact's temp filled it)
        calls.append(obj["status"])
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real(path, obj)

    monkeypatch.setattr(job_record, "write_json", full_once)
    job.finish(db, time.time())
    (row,) = db.rows()
    assert row["status"] == "failed" and "result.json could not be written" in row["error"]
    assert json.loads((run_dir / "result.json").read_text())["status"] == "failed" == calls[-1]
