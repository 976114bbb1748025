"""Checkpoints and resume: a run stopped by SIGTERM mid-training and resumed ends exactly where an uninterrupted run
ends (fp32 on CPU), in the same row; refusals are clear; files are atomic, pruned and load with weights_only;
checkpoint.every_seconds counts timed training's clock. Through the CLI: tests/e2e/test_nothing_lost.py."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from speedrun.errors import ConfigError
from speedrun.paths import REPO_ROOT
from speedrun.records.identity import code_fingerprint
from speedrun.run import periodic
from speedrun.run.periodic import LoopExtras

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

    from speedrun.core.train import Stepper

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
    from speedrun.run import checkpoint

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
    # as if stopped at that step: a finished run is never resumed, so the twin's record says interrupted
    from speedrun.records.store import ResultsDB

    result = {**json.loads((twin / "result.json").read_text()), "status": "interrupted", "phase": "train"}
    (twin / "result.json").write_text(json.dumps(result))
    ResultsDB(tmp_path / "r.sqlite").upsert(str(twin.resolve()), {"status": "interrupted"})
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
    from speedrun.run.resume import find_resume

    target = make(tmp_path)
    with pytest.raises(ConfigError, match=needle):
        find_resume({"resume": str(target)}, [f"resume={target}"], tmp_path / "new", tmp_path)


def test_resume_refuses_overrides_the_run_did_not_have(tmp_path):
    from speedrun.run.checkpoint import save_checkpoint
    from speedrun.run.resume import find_resume

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


def test_a_run_killed_before_its_first_checkpoint_is_not_said_to_have_had_checkpointing_off(tmp_path):
    from speedrun.errors import ConfigError
    from speedrun.run.resume import accepted_resume

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("checkpoint:\n  every_steps: 1\n  every_seconds: null\n")
    with pytest.raises(ConfigError, match="ended before its first checkpoint"):
        accepted_resume(str(run_dir), [], tmp_path)
    (run_dir / ".hydra" / "config.yaml").write_text("checkpoint:\n  every_steps: null\n  every_seconds: null\n")
    with pytest.raises(ConfigError, match="were off"):
        accepted_resume(str(run_dir), [], tmp_path)


def test_checkpoints_are_atomic_pruned_and_load_with_weights_only(tmp_path):
    from speedrun.run.checkpoint import (
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
    from speedrun.run.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, {"format": 1, "progress": {"steps": 1}, "evil": Path("/")}, {"steps": 1}, keep=1)
    assert load_checkpoint(tmp_path) is None  # refused (warned), no older one to fall back to


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rng_state_restores_from_a_checkpoint_loaded_onto_the_gpu(tmp_path):
    """A multi-GPU resume loads the checkpoint with map_location=<its GPU>, which moves every tensor there, the numpy
    keys too; restoring must bring them back to the host (the first 2-GPU resume on an H200 failed here). After the
    restore, torch, CUDA, numpy and Python draw what they drew right after the save."""
    import random

    import numpy as np

    from speedrun.run.checkpoint import rng_state, set_rng_state

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


# ---------------------------------------------------------------------------------------------------------
# the checkpoint clock: checkpoint.every_seconds counts timed training's wall clock, not the warm-up's compile
# before it


def test_the_first_checkpoint_comes_due_every_seconds_after_training_starts(monkeypatch, tmp_path):
    """A 2-GPU pgolf_record run on H200s compiled for 125 s and, with the clock started at construction, wrote its
    first checkpoint at step 1. The clock starts with the loop (LoopExtras.start): a step right after a long warm-up
    is not due, one every_seconds later is."""
    now = [1000.0]
    monkeypatch.setattr(periodic.time, "monotonic", lambda: now[0])
    plan = SimpleNamespace(
        checkpoint=SimpleNamespace(every_seconds=60, every_steps=None, on_signal=True),
        eval=SimpleNamespace(every_seconds=None, every_steps=None),
    )
    extras = LoopExtras(plan, tmp_path, stepper=SimpleNamespace(), evaluator=None, meta={}, on_metrics=print)
    now[0] += 125.0  # the warm-up's compile
    extras.start()
    now[0] += 1.0  # step 1
    extras.agree(1.0)
    assert not extras.wall_due
    now[0] += 58.0
    extras.agree(59.0)
    assert not extras.wall_due
    now[0] += 2.0
    extras.agree(61.0)
    assert extras.wall_due


def test_train_starts_the_checkpoint_clock_once_before_its_first_step(compose):
    """The clock is started by train() itself (a LoopExtras left unstarted would never checkpoint by the wall clock):
    once, before the first step is agreed on."""
    import torch

    from speedrun.config import to_config
    from speedrun.core.attention import get_backend
    from speedrun.core.train import Stepper, TrainState, train
    from speedrun.plan import resolve
    from speedrun.run.build import build_model
    from support.devices import fake_device

    plan = resolve(
        to_config(compose(["debug=smoke", "budget.max_steps=2", "budget.tokens_per_step=512"])), fake_device("cpu")
    )
    torch.manual_seed(0)
    model, forward, _, optimizers = build_model(plan, get_backend("sdpa", kernel="math"), bos_id=1)
    calls: list[str] = []

    class Extras:  # what train() asks of LoopExtras, recording the order of the calls
        def start(self):
            calls.append("start")

        def deferring(self):
            import contextlib

            return contextlib.nullcontext()

        def agree(self, seconds):
            calls.append("agree")
            return seconds

        def due(self, state, seconds):
            return False

        def finish(self, state):
            calls.append("finish")

    class Batches:
        def __init__(self, seq_len, micro_batch, position=0):
            self.shape, self.position = (micro_batch, seq_len), position

        def __next__(self):
            self.position += self.shape[0] * self.shape[1]
            x = torch.randint(0, plan.model.vocab_size, self.shape)
            return x, torch.roll(x, -1, 1)

        def state_dict(self):
            return {"position": self.position}

    state = train(
        Stepper(model, forward, optimizers, plan), Batches, state=TrainState(), log=lambda _: None,
        on_metrics=lambda _: None, between_steps=Extras(),
    )  # fmt: skip
    assert state.steps == 2
    assert calls[0] == "start" and calls.count("start") == 1 and "agree" in calls
