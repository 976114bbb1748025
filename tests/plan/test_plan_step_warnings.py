"""`--plan` says a step-counted setting longer than the run (a momentum warm-up past its last step, an EMA that keeps
more than 10% of the initial weights) in one line, before any GPU time, where the budget fixes the run's steps."""

from __future__ import annotations

import json

from speedrun.hardware import profiles
from support.devices import fake_device


def plan(monkeypatch, capsys, tmp_path, *args: str) -> tuple[int, list[str], list[str]]:
    """print_plan of a CPU smoke run: (exit status, stdout lines, stderr lines)."""
    from speedrun.run import cli_step as plan_only

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(profiles, "detect", lambda: fake_device("cpu"))
    code = plan_only.print_plan(["run", "debug=smoke", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def warnings(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("warning:")]


def test_a_warm_up_and_an_ema_longer_than_a_step_budget_each_get_one_line(monkeypatch, capsys, tmp_path):
    code, out, err = plan(
        monkeypatch,
        capsys,
        tmp_path,
        "budget.max_steps=20",
        "ema.decay=0.99",  # 0.99 ** 20 = 82% of the initial weights left in the average
        "optim.muon_momentum_warmup_steps=50",
        "--plan",
    )
    assert code == 0, err
    found = warnings(out)
    assert len(found) == 2, out
    assert found[0].startswith("warning: optim.muon_momentum_warmup_steps=50 is longer than the run's 20 steps")
    assert "optim.muon_momentum_warmup_frac" in found[0]
    assert found[1].startswith("warning: ema.decay=0.99 over the run's 20 steps (budget.max_steps) keeps 82% of")
    assert "ema.horizon" in found[1]
    assert list(tmp_path.iterdir()) == []


def test_settings_that_fit_the_run_and_fractions_of_it_say_nothing(monkeypatch, capsys, tmp_path):
    fractions = [
        "ema.horizon=0.2",  # a 4-step window: 0.75 ** 20 leaves 0.3% of the initial weights
        "ema.decay=null",
        "optim.muon_momentum_warmup_frac=0.3",
        "optim.muon_momentum_warmup_steps=null",
    ]
    for extra in (["ema.decay=0.5", "optim.muon_momentum_warmup_steps=10"], fractions):
        code, out, err = plan(monkeypatch, capsys, tmp_path, "budget.max_steps=20", *extra, "--plan")
        assert code == 0, err
        assert warnings(out) == [], (extra, out)


def test_a_token_budget_counts_its_steps_and_json_keeps_stdout_json(monkeypatch, capsys, tmp_path):
    code, out, err = plan(
        monkeypatch,
        capsys,
        tmp_path,
        "budget.max_steps=null",
        "budget.tokens=2048",  # fewer than one step's tokens: one step
        "ema.decay=0.99",
        "optim.muon_momentum_warmup_steps=0",
        "--plan=json",
    )
    assert code == 0, err
    assert json.loads("\n".join(out))["ema"]["decay"] == 0.99
    found = warnings(err)
    assert len(found) == 1 and found[0].startswith("warning: ema.decay=0.99 over the run's 1 steps (budget.tokens)")


def test_a_time_budget_leaves_the_warnings_to_the_run(monkeypatch, capsys, tmp_path):
    # its steps are projected from warm-up's step times, which the plan does not have
    code, out, err = plan(
        monkeypatch,
        capsys,
        tmp_path,
        "budget.max_steps=null",
        "budget.train_seconds=30",
        "schedule.progress=time",
        "ema.decay=0.9999",
        "--plan",
    )
    assert code == 0, err
    assert warnings(out) == [] and warnings(err) == []
