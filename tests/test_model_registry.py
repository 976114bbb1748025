"""model.arch: a model of one's own, defined outside the package (tests/external/tiny_lm.py), runs through the
same pipeline as the built-in GPT (train, eval, GPTQ, TTT, the record), with its own typed knob; a class that
misses part of the contract is refused by name before any data is built."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from conftest import run_cli
from speedrun.errors import PlanError

TESTS = Path(__file__).resolve().parent
ARCH = "external.tiny_lm:TinyLM"
SMOKE = ["debug=smoke", "budget.warmup_steps=0", "eval.tokens=2048"]


def with_tests_on_path() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_the_contract_check_names_what_is_missing(monkeypatch):
    from speedrun.model.registry import model_class

    monkeypatch.syspath_prepend(str(TESTS))
    with pytest.raises(PlanError, match="Incomplete lacks head, param_groups"):
        model_class("external.tiny_lm:Incomplete")
    with pytest.raises(PlanError, match="cannot import no_such_pkg"):
        model_class("no_such_pkg.mod:Model")
    with pytest.raises(PlanError, match="not a registered model"):
        model_class("gpt2")
    from speedrun.model.gpt import GPT

    assert model_class("gpt") is GPT and model_class("speedrun.model.gpt:GPT") is GPT


def test_own_options_are_the_fields_beyond_model_config(monkeypatch):
    from speedrun.model.registry import model_schema, own_options

    monkeypatch.syspath_prepend(str(TESTS))
    from external.tiny_lm import TinyLM, TinyLMConfig

    assert model_schema(TinyLM) is TinyLMConfig
    assert own_options(TinyLMConfig(mlp_gain=2.0)) == {"mlp_gain": 2.0}


def test_arch_is_read_from_the_command_line_before_hydra():
    from speedrun.model.registry import arch_from_argv

    assert arch_from_argv(["run", "seed=1", f"model.arch={ARCH}"]) == ARCH
    assert arch_from_argv(["run", "model.arch=a:B", "model.arch=c:D"]) == "c:D"  # the last one wins, as in Hydra
    assert arch_from_argv(["run", "seed=1"]) is None
