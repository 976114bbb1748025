"""checkpoint.every_seconds counts timed training's wall clock, not the warm-up's compile before it."""

from __future__ import annotations

from types import SimpleNamespace

from speedrun.training import periodic
from speedrun.training.periodic import LoopExtras


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

    from conftest import fake_device
    from speedrun.config import to_config
    from speedrun.model.attention import get_backend
    from speedrun.plan import resolve
    from speedrun.training.build import build_model
    from speedrun.training.loop import Stepper, TrainState, train

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
        on_metrics=lambda _: None, extras=Extras(),
    )  # fmt: skip
    assert state.steps == 2
    assert calls[0] == "start" and calls.count("start") == 1 and "agree" in calls
