"""speedrun.core.train.fit: warm-up, then the shell's hooks in their order (after_warmup with warm-up's timed steps,
its settings taken and an EMA started where they turn one on; before_clock before the first timed step), then
training to the budget; and the TrainSettings the shell builds from a Plan."""

from __future__ import annotations

import dataclasses

import torch

from speedrun.config import to_config
from speedrun.core.optim import EMASettings
from speedrun.core.train import Hooks, Stage, Stepper, TrainSettings, TrainState, fit
from speedrun.plan import resolve
from speedrun.plan.settings import train_settings
from support.devices import fake_device

TINY = [
    "model=tiny",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "model.n_kv_head=1",
    "model.seq_len=64",
    "hardware.micro_batch=2",
    "budget.tokens_per_step=128",
    "budget.max_steps=3",
    "budget.warmup_steps=1",
]


def tiny_run(compose, tmp_path):
    """(plan, stepper, make_batches) of the tiny model on random tokens, uncompiled."""
    from speedrun.core.attention import get_backend
    from speedrun.core.data import TokenStream
    from speedrun.data.shards import write_shard
    from speedrun.run.build import build_model

    plan = dataclasses.replace(resolve(to_config(compose(TINY)), fake_device("cpu")), compile=False)
    torch.manual_seed(0)
    model, forward, _, optimizers = build_model(plan, get_backend("sdpa", kernel="math"), bos_id=1)
    shard = tmp_path / "fineweb_train_000000.bin"
    write_shard(shard, torch.randint(0, 1024, (20_000,), dtype=torch.int32).numpy().astype("uint16"))

    def make_batches(seq_len, micro_batch, position=0):
        stream = TokenStream([shard], seq_len, micro_batch)
        stream.load_state_dict({"position": position})
        return stream

    return plan, Stepper(model, forward, optimizers, train_settings(plan)), make_batches


def test_fit_runs_the_hooks_between_warm_up_and_the_clock(compose, tmp_path):
    plan, stepper, make_batches = tiny_run(compose, tmp_path)
    assert stepper.ema is None  # the plan has no EMA: after_warmup's settings turn one on
    seen, records = [], []
    with_ema = dataclasses.replace(stepper.settings, ema=EMASettings(decay=0.5))

    def after_warmup(step_times, state):
        seen.append(("after_warmup", dict(step_times), state.compile_seconds > 0, state.steps))
        return with_ema

    def before_clock(state):
        seen.append(("before_clock", stepper.settings is with_ema, stepper.ema is not None, state.steps))

    state = fit(
        stepper,
        make_batches,
        state=TrainState(),
        report=lambda kind, values: records.append(values) if kind == "metrics" else None,
        hooks=Hooks(after_warmup=after_warmup, before_clock=before_clock),
        time_steps=True,
    )
    (name, step_times, warmed, steps), clock = seen
    assert (name, list(step_times), warmed, steps) == ("after_warmup", [(0, False)], True, 0)
    assert step_times[(0, False)] > 0  # the timed warm-up step
    assert clock == ("before_clock", True, True, 0)  # the new settings and their EMA, no step timed yet
    assert state.steps == 3 and [r["step"] for r in records] == [1, 2, 3]
    assert stepper.ema is not None and stepper.ema.decay == 0.5


def test_fit_without_hooks_trains_as_train_does(compose, tmp_path):
    _, stepper, make_batches = tiny_run(compose, tmp_path)
    lines: list[str] = []
    state = fit(stepper, make_batches, state=TrainState(), report=lambda kind, v: lines.append(v.get("text", "")))
    assert any(line.startswith("warm-up done") for line in lines)  # warm-up's and the loop's lines, reported
    assert (state.steps, state.budget_end) == (3, "steps")


def test_train_settings_are_the_plans_fields(compose):
    plan = resolve(to_config(compose(TINY)), fake_device("cpu"))
    s = train_settings(plan)
    assert isinstance(s, TrainSettings) and all(isinstance(stage, Stage) for stage in s.stages)
    assert [dataclasses.astuple(st) for st in s.stages] == [
        (st.seq_len, st.until, st.micro_batch) for st in plan.stages
    ]
    assert (s.device, s.grad_accum, s.tokens_per_step, s.warmup_steps, s.model) == (
        plan.device,
        plan.grad_accum,
        plan.tokens_per_step,
        plan.warmup_steps,
        plan.model,
    )
    assert (s.budget.steps, s.optim.grad_clip, s.schedule.warmdown_frac, s.logger.flush_every_steps) == (
        plan.budget.steps,
        plan.optim.grad_clip,
        plan.schedule.warmdown_frac,
        plan.logger.flush_every_steps,
    )
