"""Progressive context growth: parsing and its errors, stage switching, and no recompilation after warm-up."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speedrun.config import ScheduleConfig, to_config
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from support.devices import fake_device


def plan_for(compose, *overrides):
    return resolve(to_config(compose(list(overrides))), fake_device("cpu"))


def test_stages_hold_tokens_per_micro_batch_constant(compose):
    plan = plan_for(
        compose,
        "schedule=progressive",
        "model=tiny",
        "hardware.micro_batch=8",
        "schedule.seq_len=[64@0.2,128@0.5,256@1.0]",
    )
    assert [(s.seq_len, s.micro_batch, s.until) for s in plan.stages] == [(64, 32, 0.2), (128, 16, 0.5), (256, 8, 1.0)]
    assert plan.model.seq_len == 256  # RoPE sized for the longest length
    assert {s.seq_len * s.micro_batch for s in plan.stages} == {plan.micro_batch * plan.model.seq_len}


def test_the_string_form_parses_like_the_list(compose):
    plan = plan_for(
        compose, "schedule=progressive", "model=tiny", 'schedule.seq_len="128@0.5,512@1.0"', "hardware.micro_batch=4"
    )
    assert [(s.seq_len, s.until) for s in plan.stages] == [(128, 0.5), (512, 1.0)] and plan.model.seq_len == 512


@pytest.mark.parametrize(
    "spec,needle",
    [
        ('"256@0.5,128@1.0"', "strictly increasing"),
        ('"128@0.7,256@0.5"', "fractions must be positive and strictly increasing"),
        ('"128@0.5,256@0.9"', "last stage must run to 1.0"),
        ('"100@0.5,256@1.0"', "do not divide the micro-batch tokens"),
        ('"128-0.5,256@1.0"', "write LENGTH@FRACTION"),
    ],
)
def test_bad_schedules_are_refused_at_resolve_time(compose, spec, needle):
    with pytest.raises(ConfigError, match=needle):
        plan_for(compose, "schedule=progressive", "model=tiny", f"schedule.seq_len={spec}")


def test_step_progress_needs_max_steps_and_constant_refuses_lengths(compose):
    with pytest.raises(ConfigError, match="set budget.max_steps"):
        plan_for(compose, "schedule=progressive", "schedule.progress=step")
    with pytest.raises(ConfigError, match="schedule=progressive"):
        plan_for(compose, 'schedule.seq_len="128@1.0"')


def test_every_length_is_compiled_in_warm_up_and_nothing_recompiles(compose, tmp_path):
    """A compiled tiny GPT trains through three context stages (switching by step); dynamo's graph counter does
    not move after warm-up, the stages start where the schedule says, and each stage's batches have its shape."""
    from speedrun.core.attention import get_backend
    from speedrun.core.data import TokenStream
    from speedrun.core.train import Stepper, TrainState, train, warm_up
    from speedrun.data.shards import write_shard
    from speedrun.run.build import build_model

    plan = plan_for(
        compose,
        "schedule=progressive",
        "model=tiny",
        "model.n_layer=2",
        "model.d_model=64",
        "hardware.micro_batch=2",
        "budget.tokens_per_step=1024",
        "budget.max_steps=12",
        "schedule.progress=step",
        "schedule.seq_len=[64@0.25,128@0.5,256@1.0]",
    )
    plan = dataclasses.replace(plan, compile=False)
    plan = dataclasses.replace(
        plan, schedule=ScheduleConfig(name="progressive", seq_len=plan.schedule.seq_len, rewarmup_steps=2)
    )
    torch.manual_seed(0)
    attention = get_backend("sdpa", kernel="math")
    model, _, _, optimizers = build_model(plan, attention, bos_id=1)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", dynamic=False)
    shapes = []

    def forward(x, y):
        shapes.append(tuple(x.shape))
        return compiled(x, y)

    shard = tmp_path / "fineweb_train_000000.bin"
    write_shard(shard, torch.randint(0, 1024, (50_000,), dtype=torch.int32).numpy().astype("uint16"))

    def make_batches(seq_len, micro_batch, position=0):
        stream = TokenStream([shard], seq_len, micro_batch)
        stream.load_state_dict({"position": position})
        return stream

    stepper = Stepper(model, forward, optimizers, plan)
    state = TrainState()
    warm_up(stepper, make_batches, state, lambda _: None)
    warm_shapes = set(shapes)
    assert warm_shapes == {(2, 256), (4, 128), (8, 64)}
    train(stepper, make_batches, state=state, log=lambda _: None, on_metrics=lambda _: None)
    assert state.steps == 12 and not state.diverged
    assert [(s["seq_len"], s["start_step"]) for s in state.stages] == [(64, 0), (128, 3), (256, 6)]
    assert state.recompiles == 0
    assert set(shapes[len(warm_shapes) * 2 :]) <= warm_shapes


def test_the_recompile_counter_can_fail():
    """The counter the test above relies on does move when a new shape compiles."""
    from speedrun.core.compile import graphs_compiled

    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    f(torch.ones(3))
    before = graphs_compiled()
    f(torch.ones(5))
    assert graphs_compiled() > before
