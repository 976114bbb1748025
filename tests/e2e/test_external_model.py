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
# 2 micro-batches of 2 x 128 a step (512 tokens, not smoke's 24): every stage runs, on the model's own class
SMOKE = ["debug=smoke", "budget.warmup_steps=0", "budget.tokens_per_step=512", "eval.tokens=2048"]


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
def test_a_models_own_knobs_are_checked_at_compose(tmp_path, args, needle, monkeypatch, capsys):
    """`python -m run ... --plan` exits with print_plan's status (run.py), called here in this process, as
    tests/e2e/test_cli.py's test_plan_refuses_in_one_line does: a fresh interpreter per case cost ~2 s of imports,
    for a check made at compose. The schema it registers for model.arch is replaced by the built-in one after."""
    from speedrun.config import register_configs
    from speedrun.run.cli_step import print_plan

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(TESTS))  # external.tiny_lm, as with_tests_on_path() gives a subprocess
    try:
        code = print_plan(["run", *SMOKE, *args, "--plan"])
    finally:
        register_configs()  # /model_schema back to the built-in GPT's, for what this process composes next
    out, err = capsys.readouterr()
    assert code == 1 and needle in err and "Traceback" not in err, err[-2000:]
    assert list(tmp_path.iterdir()) == []  # composed only: nothing written
