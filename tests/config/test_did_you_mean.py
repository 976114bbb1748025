"""A misspelt key or option is answered with the closest valid ones and the fix, before Hydra composes."""

from __future__ import annotations

import pytest

from speedrun.run.cli_step import key_paths, unknown_override
from support.cli import run_cli


@pytest.mark.parametrize(
    "arg,message",
    [
        ("budgett.train_seconds=10", "did you mean budget.train_seconds"),
        ("budget.train_second=10", "did you mean budget.train_seconds"),
        (
            "attn=flexx",
            "attn=flexx is no option of attn (auto, fa3, flex, math, sdpa); did you mean flex? fix: attn=flex",
        ),
        ("ablate=none,xsaa", "fix: ablate=xsa"),
    ],
)
def test_a_typo_names_the_closest_and_the_fix(arg, message):
    problem = unknown_override([arg])
    assert problem is not None and message in problem and "\n" not in problem


def test_the_fix_keeps_the_value():
    assert unknown_override(["budgett.train_seconds=10"]).endswith("fix: budget.train_seconds=10")


@pytest.mark.parametrize(
    "args",
    [
        ["budget.train_seconds=10", "attn=sdpa,flex", "experiment=pgolf_record", "debug=smoke", "ablate=none"],
        ["+extra.key=1", "~ema", "hydra.run.dir=x", "-m", "--cfg", "job", "seed=range(0,3)"],
        ["model.arch=pkg.mod:Cls", "model.own_knob=1"],
    ],
)
def test_valid_overrides_and_hydras_own_are_left_alone(args):
    arch = "pkg.mod:Cls" if "model.arch=pkg.mod:Cls" in args else None
    assert unknown_override(args, model_arch=arch) is None


def test_the_schema_paths_reach_nested_fields():
    assert {"budget.train_seconds", "hardware.name", "seed", "model.loop.num"} <= set(key_paths())


@pytest.mark.slow
def test_the_command_line_refuses_before_any_work(tmp_path):
    proc = run_cli(["budgett.train_seconds=10"], cwd=tmp_path, fork=True)
    assert proc.returncode == 1 and "+budgett" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: unknown key 'budgett.train_seconds'; did you mean budget.train_seconds or track.train_seconds "
        "or ttt.max_seconds? fix: budget.train_seconds=10"
    ]
    assert list(tmp_path.iterdir()) == []
