"""Step-counted settings in units of the run (speedrun.run.run_steps): the run's steps from each kind of budget
(a time budget's projected from warm-up's step times against the hand computation), ema.horizon and
optim.muon_momentum_warmup_frac turned into the decay and the steps used, the record's fractions giving back its
own settings on its home budget, the warnings for settings longer than the run, the refusals, and a whole run that
records what it used."""

from __future__ import annotations

import dataclasses
import json

import pytest

from speedrun.config import to_config
from speedrun.errors import ConfigError, PlanError
from speedrun.plan import resolve
from speedrun.run import run_steps
from speedrun.run.run_steps import RunSteps
from support.devices import fake_device

HOME_STEPS = 4_900
"""The record's steps on its own budget (600 s on 8 GPUs), which pgolf_record's fractions come from."""


def plan_of(compose, *overrides):
    return resolve(to_config(compose(["debug=smoke", *overrides])), fake_device("cpu"))


def test_the_runs_steps_by_budget(compose):
    assert run_steps.known_steps(plan_of(compose, "budget.max_steps=40")) == RunSteps(40, "steps")
    tokens = plan_of(compose, "budget.max_steps=null", "budget.tokens=100000", "schedule.progress=time")
    assert run_steps.known_steps(tokens) == RunSteps(-(-100_000 // tokens.tokens_per_step), "tokens")
    both = plan_of(compose, "budget.max_steps=5", "budget.tokens=100000")
    assert run_steps.known_steps(both) == RunSteps(5, "steps")  # whichever ends first
    timed = plan_of(compose, "budget.max_steps=null", "budget.train_seconds=30", "schedule.progress=time")
    assert run_steps.known_steps(timed) is None and run_steps.needs_projection(timed)
    assert not run_steps.needs_projection(plan_of(compose, "budget.max_steps=40"))


def test_a_time_budget_is_projected_stretch_by_stretch(compose):
    """Stages until 0.1, 0.7, 1.0 of the time and the layer loop on from 0.35: five stretches, each at the step time
    warm-up measured for its context length and loop state."""
    plan = plan_of(
        compose,
        "experiment=pgolf_progressive",
        "budget.max_steps=null",
        "budget.train_seconds=300",
        "schedule.progress=time",
        "model.loop.start=0",
        "model.loop.end=1",
        "model.loop.num=1",
        "model.loop.enable_at=0.35",
    )
    assert [st.until for st in plan.stages] == [0.1, 0.7, 1.0] and plan.model.loop.on
    times = {(0, False): 0.5, (1, False): 0.6, (2, False): 0.8, (0, True): 0.9, (1, True): 1.0, (2, True): 1.2}
    expect = 300 * (0.1 / 0.5 + 0.25 / 0.6 + 0.35 / 1.0 + 0.3 / 1.2)
    assert run_steps.project_steps(plan, 300.0, times) == RunSteps(int(expect), "projected")
    constant = plan_of(compose, "budget.max_steps=null", "budget.train_seconds=60", "schedule.progress=time")
    assert run_steps.project_steps(constant, 60.0, {(0, False): 0.25}) == RunSteps(240, "projected")


def test_fractions_become_the_decay_and_steps_used(compose):
    plan = plan_of(compose, "budget.max_steps=300", "ema.horizon=0.05", "optim.muon_momentum_warmup_frac=0.3")
    resolved, warnings = run_steps.resolve(plan, RunSteps(300, "steps"))
    assert resolved.ema.decay == pytest.approx(1 - 1 / (0.05 * 300)) and resolved.ema.horizon is None
    assert resolved.optim.muon_momentum_warmup_steps == 90 and resolved.optim.muon_momentum_warmup_frac is None
    assert warnings == []
    keys = run_steps.result_keys(plan, resolved, RunSteps(300, "steps"))
    assert keys == {
        "run_steps": 300,
        "run_steps_source": "steps",
        "ema_decay": resolved.ema.decay,
        "ema_horizon": 0.05,
        "muon_momentum_warmup_steps": 90,
        "muon_momentum_warmup_frac": 0.3,
    }
    # a horizon of a step or less averages nothing: off
    short, _ = run_steps.resolve(plan, RunSteps(10, "steps"))
    assert short.ema.decay == 0.0 and not short.ema.on


def test_pgolf_record_fractions_are_the_records_settings_on_its_home_budget(compose):
    plan = plan_of(compose, "experiment=pgolf_record", "budget.max_steps=300")
    assert plan.ema.decay is None and plan.ema.horizon is not None
    home, warnings = run_steps.resolve(plan, RunSteps(HOME_STEPS, "projected"))
    assert home.ema.decay == pytest.approx(0.9965, abs=2e-6) and home.optim.muon_momentum_warmup_steps == 1500
    assert warnings == []
    one_gpu, warnings = run_steps.resolve(plan, RunSteps(308, "projected"))  # one H200, 300 s
    assert 0.94 < one_gpu.ema.decay < 0.95 and one_gpu.optim.muon_momentum_warmup_steps == 94
    assert warnings == []
    assert 0.9965**308 > 0.10  # the record's own decay there: the case the warnings are for


def test_settings_longer_than_the_run_are_one_line_warnings(compose):
    plan = plan_of(compose, "budget.max_steps=300", "ema.decay=0.9965", "optim.muon_momentum_warmup_steps=1500")
    _, warnings = run_steps.resolve(plan, RunSteps(308, "projected"))
    assert len(warnings) == 2 and all("\n" not in w and w.startswith("warning: ") for w in warnings)
    assert "optim.muon_momentum_warmup_steps=1500 is longer than the run's 308 steps (projected" in warnings[0]
    assert "optim.muon_momentum_warmup_frac" in warnings[0]
    assert "ema.decay=0.9965 over the run's 308 steps (projected from warm-up) keeps 34% of" in warnings[1]
    assert "ema.horizon" in warnings[1]
    fine = plan_of(compose, "budget.max_steps=300", "ema.decay=0.9", "optim.muon_momentum_warmup_steps=100")
    assert run_steps.resolve(fine, RunSteps(300, "steps"))[1] == []


@pytest.mark.parametrize(
    "overrides,error,needle",
    [
        (["ema.decay=0.9", "ema.horizon=0.05"], ConfigError, "ema.decay=0.9 and ema.horizon=0.05 both set the EMA"),
        (
            ["optim.muon_momentum_warmup_steps=90", "optim.muon_momentum_warmup_frac=0.3"],
            ConfigError,
            "optim.muon_momentum_warmup_steps=90 and optim.muon_momentum_warmup_frac=0.3 both set",
        ),
        (["ema.horizon=1.5"], ConfigError, r"ema.horizon=1.5 must be in \(0, 1\]"),
        (
            [
                "budget.max_steps=null",
                "budget.train_seconds=0",
                "budget.tokens=null",
                "ema.horizon=0.05",
                "schedule.progress=time",
                "budget.flops=1e12",
            ],  # fmt: skip
            PlanError,
            "ema.horizon=0.05 count in the run's steps, and this run has no step, token or time budget",
        ),
        (
            [
                "budget.max_steps=null",
                "budget.train_seconds=30",
                "schedule.progress=time",
                "budget.warmup_steps=0",
                "optim.muon_momentum_warmup_frac=0.3",
            ],  # fmt: skip
            PlanError,
            "budget.warmup_steps=0 skips it: set budget.warmup_steps=1 or more",
        ),
    ],
)
def test_refusals(compose, overrides, error, needle):
    with pytest.raises(error, match=needle):
        plan_of(compose, *overrides)


def test_a_run_records_the_steps_and_settings_it_used(tmp_path, compose, data_cache, caplog):
    from speedrun.run.job_record import RunContext
    from speedrun.run.runner import run_job

    overrides = [
        "debug=smoke",
        "budget.max_steps=5",
        "budget.tokens_per_step=512",
        "eval.tokens=1024",
        "quant=off",
        "ema.horizon=0.4",
        "optim.muon_momentum_warmup_frac=0.6",
        f"data.cache_dir={data_cache}",
        f"results_db={tmp_path / 'r.sqlite'}",
    ]
    with caplog.at_level("INFO"):
        result = run_job(compose(overrides), RunContext(tmp_path / "run", overrides, None, tmp_path))
    assert result["status"] == "ok", result.get("error")
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (saved["run_steps"], saved["run_steps_source"]) == (5, "steps")
    assert saved["ema_decay"] == pytest.approx(0.5) and saved["ema_horizon"] == 0.4  # 1 - 1 / (0.4 x 5)
    assert (saved["muon_momentum_warmup_steps"], saved["muon_momentum_warmup_frac"]) == (3, 0.6)
    assert saved["ema_init_share"] == pytest.approx(0.5**5)
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["ema"] == {"decay": 0.5, "horizon": None} and plan["optim"]["muon_momentum_warmup_steps"] == 3
    assert "run steps: 5 (budget.max_steps): ema.horizon 0.4 -> ema.decay 0.5, " in caplog.text


def test_the_plan_says_the_fractions(compose):
    text = plan_of(compose, "budget.max_steps=9", "ema.horizon=0.05", "optim.muon_momentum_warmup_frac=0.3").describe()
    assert "EMA over 0.05 of the run's steps" in text and "momentum warm-up over 0.3 of the run's steps" in text
    assert dataclasses.asdict(plan_of(compose, "budget.max_steps=9").optim)["muon_momentum_warmup_steps"] == 500
