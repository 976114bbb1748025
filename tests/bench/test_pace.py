"""Stalls inside timed training (speedrun.bench.pace): what counts as one, from a peer's log and from a speedrun
run's metrics.jsonl."""

from __future__ import annotations

import json

import pytest

from speedrun.bench.metrics import run_metrics
from speedrun.bench.pace import run_points, stall_seconds
from speedrun.bench.parsers import pgolf_record


def _steady(steps: int, every: int, pace: float, start: float = 0.0, first: int = 0) -> list[tuple[int, float]]:
    return [(s, start + (s - first) * pace) for s in range(first + every, first + steps + 1, every)]


def test_a_steady_run_and_a_slower_stage_are_no_stall():
    assert stall_seconds(_steady(100, 10, 0.9)) == 0.0
    # a layer loop making steps 40% slower is a new pace, not a stall
    points = _steady(140, 10, 0.9) + _steady(100, 10, 1.26, start=140 * 0.9, first=140)
    assert stall_seconds(points) == 0.0


def test_a_recompile_between_two_logged_steps_is_counted_beyond_the_usual_pace():
    points = _steady(240, 10, 1.0) + [(242, 240 * 1.0 + 133.0)]  # two steps took 133 s
    assert stall_seconds(points) == pytest.approx(133.0 - 2 * 1.0)
    assert stall_seconds(list(reversed(points))) == pytest.approx(131.0)  # order of the points does not matter


def test_too_few_points_give_no_verdict():
    assert stall_seconds([(1, 1.0), (2, 2.0), (3, 30.0)]) is None
    assert stall_seconds([]) is None


def test_the_record_log_reports_the_stall_its_loop_split_hides():
    lines = ["gptq:reserving 10.0s, effective=290000ms"]
    for step in range(10, 250, 10):
        seconds = step * 0.9 if step <= 140 else 126 + (step - 140) * 1.2
        lines.append(
            f"{step}/20000 train_loss: 2.0 train_time: {seconds / 60:.1f}m tok/s: {int(step * 786432 / seconds)}"
        )
        if step == 140:
            lines.append("layer_loop:enabled step:140 frac:0.434 encoder:[0] decoder:[1]")
    lines.append("stopping_early: wallclock_cap train_time: 345000ms step: 242/20000")
    m = pgolf_record("\n".join(lines) + "\n", {})
    # step 240 at 246 s, step 242 at 345 s: 99 s for two steps, against a median pace of 0.9 s a step
    assert m["stall_seconds"] == pytest.approx(99.0 - 2 * 0.9, abs=0.1)
    assert m["steps"] == 242


def test_a_speedrun_runs_stall_comes_from_its_train_records(tmp_path):
    records = [{"step": s, "train_loss": 2.0, "elapsed_s": s * 0.5} for s in range(1, 40)]
    records[30]["elapsed_s"] += 60.0  # step 31 waited a minute, and every later step after it
    for r in records[31:]:
        r["elapsed_s"] += 60.0
    records.insert(20, {"kind": "val", "step": 20, "val_loss": 2.1, "elapsed_s": 999.0})  # not a train record
    text = "\n".join(json.dumps(r) for r in records) + '\n{"step": 40, "elapsed'  # cut short by a kill
    (tmp_path / "metrics.jsonl").write_text(text)
    assert run_points(tmp_path) == [(r["step"], r["elapsed_s"]) for r in records if "kind" not in r]
    assert run_metrics({}, ("stall_seconds",), tmp_path) == {"stall_seconds": pytest.approx(60.0)}
    assert run_metrics({}, ("stall_seconds",), tmp_path / "missing") == {"stall_seconds": None}
