"""Budgets that mean the same on any card: tokens and FLOPs beside seconds and steps, whichever ends first; the LR
schedule and the stages follow the budget that governs; the record says which budget ended the run. Time to target
(budget.target_val_loss / target_val_bpb): a run stops at the first periodic evaluation at or below its target and
records when it got there; one that never gets there ends ok at its budget; the refusals. The report's --target
table: tests/report/test_report_target.py."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from speedrun.config import to_config
from speedrun.core.optim import lr_multiplier
from speedrun.core.train import Budget, Clock
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from support.devices import fake_device

TINY = [
    "model=tiny",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "model.n_kv_head=1",
    "model.seq_len=64",
    "hardware.micro_batch=2",
    "budget.tokens_per_step=256",
    "budget.warmup_steps=0",
    "schedule.warmdown_frac=0.5",
]


def plan_for(compose, *overrides):
    plan = resolve(to_config(compose([*TINY, *overrides])), fake_device("cpu"))
    return dataclasses.replace(plan, compile=False)


def train_plan(plan, tmp_path):
    """Train a plan on random tokens; returns (TrainState, metrics records)."""
    from speedrun.core.attention import get_backend
    from speedrun.core.data import TokenStream
    from speedrun.core.train import Stepper, TrainState, train
    from speedrun.data.shards import write_shard
    from speedrun.run.build import build_model

    torch.manual_seed(0)
    model, forward, _, optimizers = build_model(plan, get_backend("sdpa", kernel="math"), bos_id=1)
    shard = tmp_path / "fineweb_train_000000.bin"
    write_shard(shard, torch.randint(0, 1024, (40_000,), dtype=torch.int32).numpy().astype("uint16"))

    def make_batches(seq_len, micro_batch, position=0):
        stream = TokenStream([shard], seq_len, micro_batch)
        stream.load_state_dict({"position": position})
        return stream

    records = []
    state = train(
        Stepper(model, forward, optimizers, plan),
        make_batches,
        state=TrainState(),
        log=lambda _: None,
        on_metrics=records.append,
    )
    return state, records


def test_budget_tokens_ends_at_the_right_step_and_drives_the_warm_down(compose, tmp_path):
    plan = plan_for(compose, "budget.tokens=2600")
    assert plan.budget.seconds is None and plan.budget.tokens == 2600  # no default time budget cuts it short
    state, records = train_plan(plan, tmp_path)
    assert state.steps == 11 == math.ceil(2600 / 256) and state.tokens == 11 * 256 and state.budget_end == "tokens"
    assert [r["step"] for r in records] == list(range(1, 12))  # dense: one record per step
    # the LR multiplier of step k is the schedule at the tokens done before it, as a fraction of budget.tokens
    expected = [round(lr_multiplier((k - 1) * 256 / 2600, plan.schedule), 6) for k in range(1, 12)]
    assert [r["lr_mult"] for r in records] == expected
    assert expected[5] == 1.0 and expected[6] < 1.0 and expected[-1] < 0.1  # it did warm down, over the last half


def test_budget_flops_counts_each_step_at_its_stage_length(compose, tmp_path):
    plan = plan_for(compose)
    per_token = {L: plan.model.flops_per_token(L) for L in (32, 64)}
    flops = 4 * 256 * per_token[32] + 3 * 256 * per_token[64]  # stages switch at half the FLOPs: 4 short steps
    plan = plan_for(
        compose,
        "schedule=progressive",
        "schedule.seq_len=[32@0.5,64@1.0]",
        "schedule.progress=step",
        f"budget.flops={float(flops)}",
    )
    state, _ = train_plan(plan, tmp_path)
    assert state.budget_end == "flops" and state.flops == pytest.approx(flops)
    assert [(s["seq_len"], s["start_step"]) for s in state.stages] == [(32, 0), (64, 4)] and state.steps == 7


def test_whichever_budget_ends_first_is_recorded(compose, tmp_path):
    state, _ = train_plan(plan_for(compose, "budget.tokens=100000", "budget.max_steps=3"), tmp_path)
    assert (state.steps, state.budget_end) == (3, "steps")
    state, _ = train_plan(plan_for(compose, "budget.train_seconds=0.000001", "budget.max_steps=50"), tmp_path)
    assert state.budget_end == "time" and state.steps <= 2


def test_budget_fractions_and_order():
    b = Budget(train_seconds=100.0, max_steps=10, tokens=1000, flops=None)
    assert b.progress(50, 2, 100, 0) == 0.5
    assert b.ended_by(50, 2, 100, 0) is None
    assert b.ended_by(100, 10, 100, 0) == "time"  # several spent at once: the first in time, steps, tokens, flops
    assert b.ended_by(10, 2, 1000, 0) == "tokens"
    assert Budget(None).progress(1e9, 10**9, 10**12, 1e30) == 0.0  # no budget set: never ends by itself
    assert b.stage_fraction("step", 0, 5, 0, 0) == 0.5 and b.stage_fraction("time", 0, 5, 900, 0) == 0.9


def test_the_clock_pauses_and_starts_at_an_offset():
    import time

    clock = Clock(start_seconds=5.0)
    with clock.paused():
        time.sleep(0.05)
    assert 5.0 <= clock.elapsed() < 5.04 and clock.paused_seconds >= 0.05


def test_card_independent_budgets_in_the_plan(compose):
    plan = plan_for(compose, "budget.tokens=1000", "budget.train_seconds=30")
    assert plan.budget.seconds == 30 and "30 s or 1000 tokens" in plan.describe()
    plan = plan_for(
        compose,
        "budget.flops=1e12",
        "schedule=progressive",
        "schedule.seq_len=[32@0.5,64@1.0]",
        "schedule.progress=step",
    )  # step progress follows the FLOPs budget: no max_steps needed
    assert plan.budget.flops == 1e12 and plan.budget.seconds is None
    from speedrun.errors import ConfigError

    with pytest.raises(ConfigError, match="budget.tokens"):
        plan_for(compose, "budget.tokens=0")


# ---------------------------------------------------------------------------------------------------------
# time to target

# A tiny CPU run: 12 steps at most, a periodic evaluation every 3 (the first at step 3)
TARGET_RUN = [
    "debug=smoke",
    "budget.max_steps=12",
    "budget.train_seconds=600",
    "budget.tokens_per_step=1024",
    "eval.tokens=2048",
    "eval.periodic_tokens=1024",
    "quant=off",
    "eval.every_steps=3",
]
TARGET_KEYS = ("time_to_target", "steps_to_target", "tokens_to_target")


def run_to(compose, tmp_path: Path, data_cache: Path, name: str, *overrides: str) -> dict:
    from speedrun.run.runner import RunContext, run_job

    args = [*TARGET_RUN, f"data.cache_dir={data_cache}", f"results_db={tmp_path / 'r.sqlite'}", *overrides]
    return run_job(compose(args), RunContext(tmp_path / name, args, None, tmp_path))


def val_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "val"]


def test_a_reached_target_stops_training_at_that_evaluation(compose, tmp_path, data_cache):
    # any model scores under 100 bits per byte: the first periodic evaluation (step 3) reaches it
    result = run_to(compose, tmp_path, data_cache, "reach", "budget.target_val_bpb=100")
    assert result["status"] == "ok" and result["reached"] is True and result["budget_end"] == "target"
    assert (result["target_metric"], result["target_value"]) == ("val_bpb", 100.0)
    assert result["steps"] == result["steps_to_target"] == 3 < 12
    assert result["tokens_to_target"] == 3 * 1024 == result["tokens"]
    # the time is the loop's train seconds at that evaluation: the evaluation itself is not in it
    assert 0 < result["time_to_target"] <= result["train_seconds"]
    vals = val_records(tmp_path / "reach")
    assert [v["step"] for v in vals] == [3] and vals[0]["val_bpb"] <= 100  # stopped there, not evaluated again
    assert result["time_to_target"] == pytest.approx(vals[0]["elapsed_s"], abs=1e-3)  # the train clock there
    assert math.isfinite(result["val_bpb"])  # the final full evaluation ran as always
    saved = json.loads((tmp_path / "reach" / "result.json").read_text())
    assert {k: saved[k] for k in ("reached", *TARGET_KEYS)} == {k: result[k] for k in ("reached", *TARGET_KEYS)}


def test_an_unreachable_target_ends_ok_at_the_budget(compose, tmp_path, data_cache):
    result = run_to(compose, tmp_path, data_cache, "miss", "budget.target_val_loss=0.001")
    assert result["status"] == "ok" and result["reached"] is False and result["budget_end"] == "steps"
    assert result["steps"] == 12 and all(result[k] is None for k in TARGET_KEYS)
    assert (result["target_metric"], result["target_value"]) == ("val_loss", 0.001)
    assert [v["step"] for v in val_records(tmp_path / "miss")] == [3, 6, 9, 12]


def test_no_target_keys_without_a_target(compose, tmp_path):
    from speedrun.core.train import TrainState
    from speedrun.plan import resolve
    from speedrun.run.loop_setup import target_keys
    from support.devices import fake_device

    plan = resolve(to_config(compose(["debug=smoke"])), fake_device("cpu"))
    assert plan.target_metric is None and target_keys(plan, TrainState()) == {}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["budget.target_val_loss=3.28", "budget.target_val_bpb=1.1"], "both set.*drop one"),
        (["budget.target_val_loss=3.28"], "add eval.every_steps=N or eval.every_seconds=S"),
        (["budget.target_val_bpb=0", "eval.every_steps=10"], "finite number > 0"),
    ],
)
def test_refusals_name_the_fix(compose, overrides, match):
    with pytest.raises(ConfigError, match=match):
        to_config(compose(overrides))


def test_a_target_with_periodic_evaluation_resolves(compose):
    from speedrun.plan import resolve
    from support.devices import fake_device

    cfg = to_config(compose(["budget.target_val_loss=3.28", "eval.every_seconds=30"]))
    assert cfg.budget.target == ("val_loss", 3.28)
    plan = resolve(cfg, fake_device("cpu"))
    assert (plan.target_metric, plan.target_value) == ("val_loss", 3.28)
    assert "until periodic val_loss <= 3.28" in plan.describe()


def test_a_run_resumed_after_reaching_its_target_trains_no_further(compose, tmp_path, monkeypatch):
    # its last checkpoint (written when training finished) holds target_steps: the loop ends at once, on target
    from speedrun.core import train as loop

    plan = plan_for(compose, "budget.max_steps=20", "budget.target_val_loss=3.28", "eval.every_steps=5")
    restored = loop.TrainState(steps=5, tokens=5 * 256, target_steps=5, target_tokens=5 * 256, target_seconds=1.0)
    monkeypatch.setattr(loop, "TrainState", lambda: restored)  # train_plan's fresh state: the restored one
    state, records = train_plan(plan, tmp_path)
    assert (state.steps, state.budget_end, records) == (5, "target", [])
