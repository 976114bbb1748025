"""Budgets that mean the same on any card: tokens and FLOPs beside seconds and steps, whichever ends first; the LR
schedule and the stages follow the budget that governs; the record says which budget ended the run."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import fake_device
from speedrun.config import to_config
from speedrun.plan import resolve
from speedrun.training.budget import Budget, Clock
from speedrun.training.loop import lr_multiplier

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
    from speedrun.data.loader import TokenStream
    from speedrun.data.shards import write_shard
    from speedrun.model.attention import get_backend
    from speedrun.training.build import build_model
    from speedrun.training.loop import Stepper, TrainState, train

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
