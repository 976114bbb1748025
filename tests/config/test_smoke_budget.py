"""debug=smoke ends by its steps alone: no time limit that a loaded machine could reach first (a 2-core machine at
load 5 once stopped it after 2 of its 4 steps, and its exported train_gpt.py's re-run then scored differently).
Checked on the default job and on every shipped experiment."""

from __future__ import annotations

import pytest

from speedrun.config import CONF_DIR, to_config
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from support.devices import fake_device

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", [None, *EXPERIMENTS])
def test_smoke_runs_have_a_step_budget_and_no_clock(compose, experiment):
    overrides = ([f"experiment={experiment}"] if experiment else []) + ["debug=smoke", "ttt=off"]
    try:
        plan = resolve(to_config(compose(overrides)), fake_device("cpu"))
    except ConfigError as e:  # a GPU-only recipe is refused on CPU, by design (conf/debug/smoke.yaml)
        pytest.skip(f"{experiment}: refused on CPU: {e}")
    assert plan.budget.seconds is None and plan.budget.steps == 4, plan.budget


def test_smoke_with_a_time_limit_instead_of_steps(compose):
    cfg = compose(["debug=smoke", "budget.max_steps=null", "budget.train_seconds=30", "schedule.progress=time"])
    plan = resolve(to_config(cfg), fake_device("cpu"))
    assert (plan.budget.seconds, plan.budget.steps) == (30, None)
    with pytest.raises(ConfigError, match="budget.train_seconds must be > 0 unless budget.max_steps"):
        to_config(compose(["debug=smoke", "budget.max_steps=null"]))
