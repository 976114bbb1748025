"""Checkpoints and resume: a run stopped by SIGTERM mid-training and resumed ends exactly where an uninterrupted run
ends (fp32 on CPU), in the same row; refusals are clear; files are atomic, pruned and load with weights_only."""

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
import torch

from speedrun.errors import ConfigError
from speedrun.paths import REPO_ROOT
from speedrun.records.identity import code_fingerprint

# A tiny CPU run on a step budget (the time budget never governs), with a flush every 3 steps so that the
# signal lands between flushes, and periodic validation so its records are checked too.
RUN = [
    "debug=smoke",
    "budget.max_steps=12",
    "budget.train_seconds=600",
    "budget.tokens_per_step=1024",
    "eval.tokens=2048",
    "quant=off",
    "logger.flush_every_steps=3",
    "eval.every_steps=4",
]


def run(compose, tmp_path: Path, name: str, overrides: list[str]):
    from speedrun.run.runner import RunContext, run_job

    return run_job(compose(overrides), RunContext(tmp_path / name, overrides, None, tmp_path))


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sigterm_checkpoints_and_resume_matches_an_uninterrupted_run_exactly(
    compose, tmp_path, data_cache, monkeypatch
):
    common = [*RUN, f"data.cache_dir={data_cache}", f"results_db={tmp_path / 'r.sqlite'}"]
    full = run(compose, tmp_path, "full", common)

    from speedrun.training.loop import Stepper

    calls = {"n": 0}
    original = Stepper.__call__

    def stepping(self, batches):
        out = original(self, batches)
        calls["n"] += 1
        if calls["n"] == 1 + 5:  # one warm-up step, then during the 5th training step
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(Stepper, "__call__", stepping)
    with pytest.raises(KeyboardInterrupt, match="checkpoint"):
        run(compose, tmp_path, "cut", common)
    monkeypatch.setattr(Stepper, "__call__", original)
    cut = tmp_path / "cut"
    assert [p.name for p in sorted((cut / "checkpoints").glob("*.pt"))] == ["step_00000005.pt"]
    assert json.loads((cut / "result.json").read_text())["status"] == "interrupted"

    # the database is the resuming command's own (the run dir never names it): the same one, given again
    resumed = run(compose, tmp_path, "elsewhere", [f"resume={cut}", f"results_db={tmp_path / 'r.sqlite'}"])
    assert resumed["run_dir"] == str(cut.resolve()) and not (tmp_path / "elsewhere" / "result.json").exists()
    for key in ("status", "steps", "tokens", "train_loss", "val_loss", "val_bpb", "budget_end"):
        assert resumed[key] == full[key], key
    assert resumed["resumed_from_step"] if "resumed_from_step" in resumed else True
    # the curve too: every train and validation record of the uninterrupted run, once, with the same values
    strip = [
        {k: v for k, v in r.items() if "elapsed" not in k and k not in ("tokens_per_s", "progress", "val_seconds")}
        for r in records(tmp_path / "full")
    ]
    again = [
        {k: v for k, v in r.items() if "elapsed" not in k and k not in ("tokens_per_s", "progress", "val_seconds")}
        for r in records(cut)
    ]
    assert again == strip
    con = sqlite3.connect(tmp_path / "r.sqlite")
    rows = con.execute("SELECT run_id, status, steps, resumed_from_step, overrides FROM runs").fetchall()
    assert sorted(r[0] for r in rows) == sorted([str((tmp_path / "full").resolve()), str(cut.resolve())])
    (row,) = [r for r in rows if r[0] == str(cut.resolve())]
    assert row[1:4] == ("ok", 12, 5) and "resume=" not in row[4]  # the original overrides stay


def test_the_equivalence_check_can_fail(compose, tmp_path, data_cache):
    """A resume that lost the optimizer state would not match: the comparison above is sensitive to it."""
    from speedrun.training import checkpoint

    common = [
        *RUN,
        "budget.max_steps=6",
        "checkpoint.every_steps=3",
        f"data.cache_dir={data_cache}",
        f"results_db={tmp_path / 'r.sqlite'}",
    ]
    full = run(compose, tmp_path, "full", common)
    run(compose, tmp_path, "twin", common)
    twin = tmp_path / "twin"
    for path in checkpoint.list_checkpoints(twin)[1:]:  # keep only step 3; drop its Muon momentum
        path.with_suffix(".json").unlink()
        path.unlink()
    (path,) = checkpoint.list_checkpoints(twin)
    payload = torch.load(path, weights_only=True)
    for state in payload["optimizers"]:
        state["state"] = {}
    torch.save(payload, path)
    meta_path = path.with_suffix(".json")  # re-hashed: an edit on purpose, not the bit flips a checksum catches
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "sha256": checkpoint.file_sha256(path)}))
    broken = run(compose, tmp_path, "again", [f"resume={twin}"])
    assert broken["steps"] == full["steps"] and broken["val_loss"] != full["val_loss"]


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda d: d / "absent", "no such directory"),
        (lambda d: (d / "stranger").mkdir() or d / "stranger", "not a speedrun run dir"),
        (
            lambda d: ((d / "bare").mkdir(), (d / "bare" / "plan.json").write_text("{}"))[0] or d / "bare",
            "holds no checkpoint",
        ),
    ],
)
def test_resume_of_a_missing_foreign_or_checkpointless_dir_is_a_clear_error(tmp_path, make, needle):
    from speedrun.training.resume import find_resume

    target = make(tmp_path)
    with pytest.raises(ConfigError, match=needle):
        find_resume({"resume": str(target)}, [f"resume={target}"], tmp_path / "new", tmp_path)


def test_a_refused_resume_is_a_failed_row_and_exit_1(tmp_path):
    from conftest import run_cli

    proc = run_cli(["resume=nowhere/run", f"results_db={tmp_path / 'r.sqlite'}"], cwd=tmp_path)
    assert proc.returncode == 1 and "no such directory" in proc.stdout + proc.stderr
    ((status, error),) = sqlite3.connect(tmp_path / "r.sqlite").execute("SELECT status, error FROM runs")
    assert status == "failed" and "resume=nowhere/run" in error


def test_resume_refuses_overrides_the_run_did_not_have(tmp_path):
    from speedrun.training.checkpoint import save_checkpoint
    from speedrun.training.resume import find_resume

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text("{}")
    save_checkpoint(
        run_dir,
        {"format": 1, "progress": {"steps": 3}},
        {"config": {"seed": 0}, "overrides": ["seed=0"], "steps": 3, "code_fingerprint": code_fingerprint(REPO_ROOT)},
        keep=2,
    )
    assert find_resume({"resume": str(run_dir)}, [f"resume={run_dir}", "seed=0"], tmp_path, tmp_path).steps == 3
    with pytest.raises(ConfigError, match="seed=1"):
        find_resume({"resume": str(run_dir)}, [f"resume={run_dir}", "seed=1"], tmp_path, tmp_path)


def test_checkpoints_are_atomic_pruned_and_load_with_weights_only(tmp_path):
    from speedrun.training.checkpoint import (
        list_checkpoints,
        load_checkpoint,
        rng_state,
        save_checkpoint,
        set_rng_state,
    )

    for step in (1, 2, 3):
        payload = {
            "format": 1,
            "progress": {"steps": step, "stages": [{"seq_len": 8}]},
            "rng": rng_state(),
            "model": {"w": torch.full((2,), float(step))},
        }
        save_checkpoint(tmp_path, payload, {"steps": step}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002.pt", "step_00000003.pt"]
    assert not list((tmp_path / "checkpoints").glob(".*tmp"))
    # a half-written newest file (no .json yet) does not count; a corrupt one falls back to the previous
    (tmp_path / "checkpoints" / "step_00000004.pt").write_bytes(b"partial")
    (tmp_path / "checkpoints" / "step_00000003.pt").write_bytes(b"garbage")
    loaded = load_checkpoint(tmp_path)
    assert loaded["model"]["w"].tolist() == [2.0, 2.0]
    torch.manual_seed(0)
    set_rng_state(loaded["rng"])
    first = torch.rand(3)
    set_rng_state(loaded["rng"])
    assert torch.equal(torch.rand(3), first)


def test_a_pickled_object_is_refused_on_load(tmp_path):
    """weights_only=True: a checkpoint carrying an arbitrary object does not unpickle it."""
    from speedrun.training.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, {"format": 1, "progress": {"steps": 1}, "evil": Path("/")}, {"steps": 1}, keep=1)
    assert load_checkpoint(tmp_path) is None  # refused (warned), no older one to fall back to


@pytest.mark.slow
def test_sigterm_from_outside_writes_a_checkpoint_and_resume_finishes_the_row(tmp_path, data_cache):
    steps = 120  # the first part stops near step 13 (its first progress line); the resume trains the rest
    # one thread: on a shared machine, spinning OpenMP threads make each step many times slower
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    # many short steps (one micro-batch each, ~60 a second here) and early progress lines: still training when the
    # signal comes
    args = [
        "debug=smoke",
        f"budget.max_steps={steps}",
        "budget.train_seconds=600",
        "budget.tokens_per_step=256",
        "logger.log_every_seconds=0.2",
        "eval.tokens=2048",
        "quant=off",
        f"data.cache_dir={data_cache}",
        "hydra.run.dir=outputs/cut",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "run", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen, deadline = [], time.time() + 240
    try:
        for line in proc.stdout:
            seen.append(line)
            if "tok/s" in line or time.time() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(seen) + (out or "")
    assert proc.returncode != 0 and "checkpoint at step" in text, text[-3000:]
    run_dir = tmp_path / "outputs" / "cut"
    assert list((run_dir / "checkpoints").glob("step_*.pt"))
    con = sqlite3.connect(tmp_path / "outputs" / "results.sqlite")
    assert con.execute("SELECT status FROM runs").fetchall() == [("interrupted",)]
    # the first part's wall time, made long, so the resumed row's wall_seconds can only pass by adding it
    first = json.loads((run_dir / "result.json").read_text())
    assert first["wall_seconds"] > 0
    (run_dir / "result.json").write_text(json.dumps({**first, "wall_seconds": 1000.0}))
    t0 = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "run", "resume=outputs/cut"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.time() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert con.execute("SELECT run_id, status, steps FROM runs").fetchall() == [(str(run_dir.resolve()), "ok", steps)]
    (wall,) = con.execute("SELECT wall_seconds FROM runs").fetchone()
    assert 1000.0 < wall < 1000.0 + elapsed  # both parts: the report's overhead_s (wall - train) stays >= 0
    assert json.loads((run_dir / "result.json").read_text())["wall_seconds"] == wall
    assert (run_dir / ".hydra" / "resume" / "overrides.yaml").exists() and "resume" not in (
        run_dir / ".hydra" / "overrides.yaml"
    ).read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rng_state_restores_from_a_checkpoint_loaded_onto_the_gpu(tmp_path):
    """A multi-GPU resume loads the checkpoint with map_location=<its GPU>, which moves every tensor there, the numpy
    keys too; restoring must bring them back to the host (the first 2-GPU resume on an H200 failed here). After the
    restore, torch, CUDA, numpy and Python draw what they drew right after the save."""
    import random

    import numpy as np

    from speedrun.training.checkpoint import rng_state, set_rng_state

    torch.manual_seed(3)
    np.random.seed(3)  # noqa: NPY002 - the global legacy RNG is what checkpoints save
    random.seed(3)
    path = tmp_path / "rng.pt"
    torch.save(rng_state(), path)

    def draw() -> tuple:
        return (torch.rand(3), torch.rand(3, device="cuda").cpu(), np.random.rand(3), random.random())  # noqa: NPY002

    expected = draw()
    state = torch.load(path, map_location="cuda", weights_only=True)
    assert state["numpy"][1].device.type == "cuda"  # the case under test: the keys arrive on the GPU
    set_rng_state(state)
    got = draw()
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert np.array_equal(got[2], expected[2]) and got[3] == expected[3]
