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
