"""model.arch end to end: a model of one's own, defined outside the package (tests/external/tiny_lm.py), runs
through `python -m run` as the built-in GPT does (train, eval, GPTQ, TTT, the record), with its own typed knob
checked at compose."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from support.cli import run_cli

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
ARCH = "external.tiny_lm:TinyLM"
SMOKE = ["debug=smoke", "budget.warmup_steps=0", "eval.tokens=2048"]


def with_tests_on_path() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}


def test_an_external_model_trains_evaluates_quantizes_test_time_trains_and_is_recorded(tmp_path):
    db, run_dir = tmp_path / "r.sqlite", tmp_path / "run"
    args = [*SMOKE, f"model.arch={ARCH}", "model.mlp_gain=0.5", "quant=int6", "ttt=lora", "ttt.chunk_size=64"]
    proc = run_cli(
        [*args, f"results_db={db}", f"hydra.run.dir={run_dir}"], cwd=tmp_path, env_extra=with_tests_on_path()
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["model_arch"] == ARCH and result["model_options"] == {"mlp_gain": 0.5}
    for key in ("val_bpb", "val_bpb_quant", "val_bpb_ttt"):
        assert 0 < result[key] < 20, (key, result[key])
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["model_arch"] == ARCH and plan["model_options"] == [["mlp_gain", 0.5]]
    ((status, arch),) = sqlite3.connect(db).execute("SELECT status, model_arch FROM runs")
    assert (status, arch) == ("ok", ARCH)


@pytest.mark.parametrize(
    "args,needle",
    [
        ([f"model.arch={ARCH}", "model.no_such_knob=1"], "Could not override 'model.no_such_knob'"),
        (["model.mlp_gain=0.5"], "unknown key 'model.mlp_gain'"),  # the built-in GPT has no such knob
        ([f"model.arch={ARCH}", "model.mlp_gain=abc"], "model.mlp_gain"),  # typed: a float
    ],
)
def test_a_models_own_knobs_are_checked_at_compose(tmp_path, args, needle):
    proc = run_cli([*SMOKE, *args, "--plan"], cwd=tmp_path, env_extra=with_tests_on_path())
    assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
