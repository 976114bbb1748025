"""A run whose loss blows up is recorded diverged, not ok. The divergence verdict on lists of losses, and the training
loop carrying it (every step judged, also when metrics.jsonl keeps one record per flush; kept across a
checkpoint)."""

from __future__ import annotations

import dataclasses
import io
import math

import pytest
import torch

from speedrun.config import to_config
from speedrun.core.train import DIVERGENCE_MARGIN, EARLY_MARGIN, SMOOTH_STEPS, divergence
from speedrun.plan import resolve
from support.devices import fake_device

LN_1024 = math.log(1024)

# what CPU runs printed (metrics.jsonl), start to end
ISSUE_RUN = [6.93, 11.8, 15.0]  # model=pgolf_baseline budget.train_seconds=10: 3 steps, val_loss 17.1
FAST_RUN = [6.928, 7.502]  # tests/run/test_run_outcomes.py: 2 steps of 256 tokens
SMOKE_RUN = [6.929, 6.749, 5.991, 6.095]  # debug=smoke
TINY_BATCHES = [6.928, 7.502, 6.659, 6.972, 7.148, 6.957, 6.401, 6.285, 7.4, 6.872]
TINY_BATCHES += [6.534, 6.081, 6.023, 6.974, 6.748, 6.552, 5.87, 6.139, 6.514, 6.192]


# ---------------------------------------------------------------------------------------------------------
# the verdict


def test_the_issue_run_is_diverged_at_its_end():
    found = divergence(ISSUE_RUN, 1024)
    assert found is not None and found.step == 3
    assert found.reason == (
        "training loss rose from 6.9300 at step 1 to 13.4000 (mean of steps 2-3, last 15.0000), "
        f"above ln(1024) = {LN_1024:.4f} (uniform guessing)"
    )


@pytest.mark.parametrize("losses", [FAST_RUN, SMOKE_RUN, TINY_BATCHES], ids=["fast", "smoke", "tiny-batches"])
def test_short_and_noisy_runs_that_trained_are_not_diverged(losses):
    assert divergence(losses, 1024) is None


def test_a_rise_in_the_middle_that_comes_back_down_is_training():
    assert divergence([6.93] + [5.0] * 50 + [9.5] * 30 + [4.5] * 20, 1024) is None


def test_neither_a_last_spike_nor_a_spike_just_before_the_last_step_decides():
    healthy = [6.93] + [4.0] * 100
    assert divergence(healthy + [14.0], 1024) is None  # the mean of the last steps is fine
    assert divergence(healthy + [40.0, 4.0], 1024) is None  # the last step is fine
    assert divergence(healthy + [14.0] * SMOOTH_STEPS, 1024) is not None  # both are not


def test_the_margin_is_what_a_loss_may_rise_above_its_first():
    first = 6.5  # below ln(1024): only the rise counts
    steady = [first] + [first + DIVERGENCE_MARGIN - 0.01] * SMOOTH_STEPS
    assert divergence(steady, 1024) is None
    found = divergence([first] + [first + DIVERGENCE_MARGIN + 0.01] * SMOOTH_STEPS, 1024)
    assert found is not None and found.reason.startswith("training loss rose from 6.5000 at step 1 to 7.5100")
    assert "uniform" not in found.reason


def test_a_short_run_gets_the_early_margin():
    """Before SMOOTH_STEPS steps a bounce of a nat or two is the start of training; a blow-up is many nats."""
    assert divergence([6.92, 8.20], 1024) is None  # the tiny preset's 2-step sweep job
    assert divergence([6.5, 6.5 + EARLY_MARGIN - 0.01], 1024) is None
    found = divergence([6.5, 6.5 + EARLY_MARGIN + 0.01], 1024)
    assert found is not None and found.reason.startswith(
        "training loss rose from 6.5000 at step 1 to 10.5100 at step 2"
    )


def test_a_run_that_ends_above_uniform_guessing_is_diverged_even_below_its_first_loss():
    found = divergence([14.0, 13.0, 12.5, 12.0], 1024)  # started worse than uniform and stayed there
    assert found is not None and found.step == 4
    assert found.reason.startswith("training loss ended at 12.5000 (mean of steps 2-4, last 12.0000)")
    assert found.reason.endswith("above ln(1024) = 6.9315 (uniform guessing)")
    assert divergence([14.0, 13.0, 12.5, 9.5], 1024) is None  # last step within the early margin of uniform
    long = [14.0] + [8.5] * SMOOTH_STEPS  # a long run: the 1-nat margin
    assert divergence(long, 1024) is not None and divergence(long[:-1] + [7.5], 1024) is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_loss_diverges_at_its_step_whatever_follows(bad):
    found = divergence([6.9, 5.0, bad, 4.0], 1024, start_step=11)
    assert found is not None and found.step == 13
    assert found.reason == f"non-finite training loss ({bad}) at step 13"


def test_nothing_to_judge():
    assert divergence([], 1024) is None
    assert divergence([25.0], 1024) is None  # one step: the run has not trained yet


def test_the_loop_form_last_steps_and_the_first_loss_judges_as_the_whole_run():
    runs = [ISSUE_RUN, SMOKE_RUN, TINY_BATCHES, [6.93] + [5.0] * 40 + [12.0] * 12, [6.93] + [3.0] * 30]
    for losses in runs:
        tail = losses[-SMOOTH_STEPS:]
        start = len(losses) - len(tail) + 1
        assert divergence(tail, 1024, start_step=start, first=(1, losses[0])) == divergence(losses, 1024)


# ---------------------------------------------------------------------------------------------------------
# the training loop


class Batches:
    def __init__(self, *args, position=0, **kwargs):
        self.position = position

    def __next__(self):
        self.position += 1
        return None

    def state_dict(self):
        return {"position": self.position}


def make_batches(seq_len, micro_batch, position=0):
    return Batches(position=position)


class Scripted:
    """A Stepper whose steps return the given losses (device tensors, as the real one does)."""

    def __init__(self, plan, losses):
        from speedrun.core.dist import SINGLE

        self.settings, self.losses, self.optimizers, self.world = plan, iter(losses), [], SINGLE
        self.ema = None  # the loop updates a Stepper's weight average after each step; these steps have none

    def __call__(self, batches):
        next(batches)
        return torch.tensor(next(self.losses))


def plan_for(compose, steps: int, *overrides: str):
    cfg = compose(
        [
            "model=tiny",
            f"budget.max_steps={steps}",
            "budget.train_seconds=600",
            "budget.warmup_steps=0",
            "schedule.progress=step",
            *overrides,
        ]
    )
    return resolve(to_config(cfg), fake_device("cpu"))


def train_on(plan, losses, state=None):
    from speedrun.core.train import TrainState, train

    records = []
    state = train(
        Scripted(plan, losses),
        make_batches,
        state=state or TrainState(),
        log=lambda _: None,
        on_metrics=records.append,
    )
    return state, records


def test_the_loop_records_the_issue_runs_divergence(compose):
    plan = plan_for(compose, 3)
    assert plan.model.vocab_size == 1024
    state, _ = train_on(plan, ISSUE_RUN)
    assert state.diverged and state.diverged_step == 3 and state.steps == 3
    assert state.divergence == divergence(ISSUE_RUN, 1024).reason
    assert (state.first_loss, state.first_loss_step) == (pytest.approx(6.93), 1)


def test_a_healthy_run_is_not_diverged_and_keeps_its_last_losses(compose):
    losses = [6.93] + [5.0] * 10 + [9.0] * 5 + [4.0] * 14
    state, records = train_on(plan_for(compose, len(losses)), losses)
    assert not state.diverged and state.diverged_step is None and state.divergence is None
    assert state.recent_losses == pytest.approx(losses[-SMOOTH_STEPS:])
    assert [r["step"] for r in records] == list(range(1, len(losses) + 1))  # dense: every step written


def test_a_non_finite_loss_is_caught_at_the_next_flush_and_named_by_its_step(compose):
    losses = [6.93, 6.0, 5.5, 5.0, float("nan"), 4.0, 4.0, 4.0, 4.0, 4.0]
    state, records = train_on(plan_for(compose, 10, "logger.flush_every_steps=4"), losses)
    assert state.diverged and state.diverged_step == 5 and state.steps == 8  # the flush after steps 5-8
    assert state.divergence == "non-finite training loss (nan) at step 5"
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5] and math.isnan(records[-1]["train_loss"])


def test_every_step_is_judged_when_metrics_keep_one_record_per_flush(compose):
    # dense=false writes the last record of each flush only: the loss of the steps between is still seen
    losses = [6.93, 5.0, 5.0, float("inf"), 5.0, 5.0]
    state, records = train_on(plan_for(compose, 6, "logger.dense=false", "logger.flush_every_steps=6"), losses)
    assert state.diverged_step == 4 and len(records) == 1
    rising = [6.93, 5.0, 5.0, 5.0, 5.0, 5.0] + [9.0] * SMOOTH_STEPS
    plan = plan_for(compose, len(rising), "logger.dense=false", "logger.flush_every_steps=5")
    state, records = train_on(plan, rising)
    assert state.diverged and state.divergence.startswith("training loss rose from 6.9300 at step 1 to 9.0000")
    assert len(records) < len(rising)


def test_a_resumed_run_is_judged_against_the_first_loss_of_the_whole_run(compose):
    from speedrun.core.train import TrainState

    state, _ = train_on(plan_for(compose, 5), [6.93, 6.0, 5.0, 4.5, 4.0])
    assert not state.diverged
    # a checkpoint keeps the progress as plain values and loads them with weights_only=True
    buf = io.BytesIO()
    torch.save({"progress": dataclasses.asdict(state)}, buf)
    buf.seek(0)
    progress = torch.load(buf, weights_only=True)["progress"]
    resumed = TrainState(**{k: v for k, v in progress.items() if k != "budget_end"})
    resumed, _ = train_on(plan_for(compose, 20), [8.5] * 15, state=resumed)
    assert resumed.steps == 20 and resumed.diverged and resumed.diverged_step == 20
    assert resumed.divergence.startswith("training loss rose from 6.9300 at step 1 to 8.5000 (mean of steps 11-20")
