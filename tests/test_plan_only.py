"""`python -m run ... --plan=json`: the resolved Plan, as plan.json holds it, without a run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def plan_cli(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "run", *args, "--plan=json"], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_plan_prints_the_resolved_plan_and_writes_nothing(tmp_path):
    proc = plan_cli(["debug=smoke", "budget.tokens_per_step=8192", "seed=3"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout)
    assert plan["seed"] == 3 and plan["tokens_per_step"] == 8192
    assert plan["device"] == "cpu" and plan["precision"] == "fp32"  # `auto` resolved for this machine
    assert plan["micro_batch"] * plan["grad_accum"] * plan["model"]["seq_len"] == 8192
    assert list(tmp_path.iterdir()) == []  # no run dir, no results database


@pytest.mark.parametrize(
    "args,needle",
    [
        (["precision=fp16"], "precision=fp16 needs a CUDA GPU"),  # the resolver's refusal
        (["attn=nope"], "attn=nope is no option of attn"),  # caught before compose (did_you_mean)
        (["seed=abc"], "Error merging override seed=abc"),  # Hydra's compose error
        (["-m", "seed=0,1"], "--plan takes overrides only"),
    ],
)
def test_plan_refuses_in_one_line(tmp_path, args, needle, monkeypatch, capsys):
    """print_plan, which `python -m run ... --plan` exits with (run.py; the test above runs the command itself), in
    this process: an exception it let through would fail here as a traceback would on the console, and a fresh
    interpreter per case cost ~3 s of imports."""
    from speedrun.run.plan_only import print_plan

    monkeypatch.chdir(tmp_path)
    code = print_plan(["run", *args, "--plan"])
    out, err = capsys.readouterr()
    assert code == 1 and out == "", out[-2000:]
    assert err.strip().splitlines() == [f"error: {err.strip()[7:]}"] and needle in err
    assert list(tmp_path.iterdir()) == []
