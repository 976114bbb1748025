"""Records: atomic files, the results database under concurrent writers (and with rows another tool wrote), the
result block."""

from __future__ import annotations

import json
import multiprocessing as mp
import sqlite3
import time

from speedrun.records.store import RESULT_KEYS, ResultsDB, empty_result, write_json
from speedrun.tables import format_result_block


def _writer(path, worker):
    db = ResultsDB(path)
    for i in range(10):
        run = f"run-{worker}-{i}"
        db.upsert(run, {**empty_result(), "status": "running", "seed": i})
        db.upsert(run, {"status": "ok", "val_bpb": 1.0 + i, f"extra_{worker}": worker})


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "results.sqlite"
    procs = [mp.get_context("spawn").Process(target=_writer, args=(path, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = ResultsDB(path).rows()
    assert len(rows) == 40
    assert {r["status"] for r in rows} == {"ok"}
    assert all(r["val_bpb"] is not None and r["seed"] is not None for r in rows)
    cols = {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(runs)")}
    assert set(RESULT_KEYS) <= cols and {"extra_0", "extra_3", "overrides", "config"} <= cols


def test_update_keeps_earlier_columns(tmp_path):
    db = ResultsDB(tmp_path / "r.sqlite")
    db.upsert("a", {"status": "running", "overrides": "seed=1", "config": {"seed": 1}})
    db.upsert("a", {"status": "failed", "error": "boom"})
    (row,) = db.rows()
    assert (row["status"], row["error"], row["overrides"]) == ("failed", "boom", "seed=1")
    assert json.loads(row["config"]) == {"seed": 1}


def test_write_json_is_atomic_and_leaves_no_temp(tmp_path):
    write_json(tmp_path / "result.json", {"status": "ok"})
    write_json(tmp_path / "result.json", {"status": "failed"})
    assert json.loads((tmp_path / "result.json").read_text()) == {"status": "failed"}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_result_block_is_grepable():
    block = format_result_block({**empty_result(), "status": "ok", "val_bpb": 1.234567891, "steps": 10})
    lines = dict(line.split(":", 1) for line in block.splitlines())
    assert lines["val_bpb"].strip() == "1.23457" and lines["status"].strip() == "ok"
    starts = {len(line) - len(line.split(":", 1)[1].lstrip()) for line in block.splitlines()}
    assert len(starts) == 1, "values are aligned in one column"


def test_pool_closes_the_row_of_a_job_that_died_without_a_record(tmp_path):
    """SIGKILL / OOM-killer deaths leave no result.json; the pool launcher marks the row so it is not `running`."""
    import types

    from omegaconf import OmegaConf

    from hydra_plugins.speedrun_plugins.job_pool import record_death

    db_path = tmp_path / "results.sqlite"
    job_dir = tmp_path / "sweep" / "3"
    job_dir.mkdir(parents=True)
    ResultsDB(db_path).upsert(str(job_dir.resolve()), {**empty_result(), "status": "running"})
    job = types.SimpleNamespace(num=3, job_dir=job_dir, config=OmegaConf.create({"results_db": str(db_path)}))
    record_death(job, "failed", "exited with code -9")
    (row,) = ResultsDB(db_path).rows()
    assert (row["status"], row["error"]) == ("failed", "exited with code -9") and row["finished_at"]


def test_gpu_identity_names_the_physical_card(monkeypatch):
    """Runs record the UUID of their card as nvidia-smi prints it and the GPU index they were given, so runs of
    one sweep on a slower card of the same model can be told apart; nothing on CPU."""
    import torch

    from speedrun.records import identity

    class Props:
        uuid = "7cda50be-474a-6647-a2ae-478b685765c6"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert identity.gpu_identity("cuda") == {
        "gpu_uuid": "GPU-7cda50be-474a-6647-a2ae-478b685765c6",
        "cuda_visible_devices": "2",
    }
    assert identity.gpu_identity("cpu") == {"gpu_uuid": None, "cuda_visible_devices": "2"}


def test_a_row_that_is_not_utf8_does_not_stop_the_next_run_from_marking_lost_rows(tmp_path):
    from speedrun.records.store import LOST_AFTER_SECONDS, ResultsDB

    db = ResultsDB(tmp_path / "r.sqlite")
    db.upsert("gone", {"status": "running", "host": "elsewhere", "pid": 1, "heartbeat_at": 0.0})
    db.upsert("alive", {"status": "running", "host": "elsewhere", "pid": 1, "heartbeat_at": time.time()})
    con = sqlite3.connect(db.path)
    con.execute("UPDATE runs SET name = CAST(X'FF00' AS TEXT)")  # bytes another tool wrote
    con.commit()
    con.close()
    # another machine's rows: judged by their heartbeats as this machine sees them, first seen now, lost once the
    # same heartbeat has stood still here for longer than LOST_AFTER_SECONDS
    assert db.mark_lost() == []
    db.upsert("alive", {"heartbeat_at": time.time() + 1})  # it beat meanwhile
    assert db.mark_lost(now=time.time() + LOST_AFTER_SECONDS + 1) == ["gone"]
    statuses = {r["run_id"]: (r["status"], r["error"]) for r in db.rows()}
    assert statuses["alive"] == ("running", None)
    assert statuses["gone"][0] == "lost" and "pid 1 on elsewhere" in statuses["gone"][1]
