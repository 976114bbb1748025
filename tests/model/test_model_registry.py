"""model.arch: the registry that finds a model of one's own (tests/external/tiny_lm.py), its own typed options, and
a class that misses part of the contract refused by name before any data is built. The model run end to end:
tests/e2e/test_external_model.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from speedrun.errors import PlanError

TESTS = Path(__file__).resolve().parents[1]
ARCH = "external.tiny_lm:TinyLM"


def test_the_contract_check_names_what_is_missing(monkeypatch):
    from speedrun.plan.model_choice import model_class

    monkeypatch.syspath_prepend(str(TESTS))
    with pytest.raises(PlanError, match="Incomplete lacks head, param_groups"):
        model_class("external.tiny_lm:Incomplete")
    with pytest.raises(PlanError, match="cannot import no_such_pkg"):
        model_class("no_such_pkg.mod:Model")
    with pytest.raises(PlanError, match="not a registered model"):
        model_class("gpt2")
    from speedrun.core.model import GPT

    assert model_class("gpt") is GPT and model_class("speedrun.core.model:GPT") is GPT


def test_own_options_are_the_fields_beyond_model_config(monkeypatch):
    from speedrun.plan.model_choice import model_schema, own_options

    monkeypatch.syspath_prepend(str(TESTS))
    from external.tiny_lm import TinyLM, TinyLMConfig

    assert model_schema(TinyLM) is TinyLMConfig
    assert own_options(TinyLMConfig(mlp_gain=2.0)) == {"mlp_gain": 2.0}


def test_arch_is_read_from_the_command_line_before_hydra():
    from speedrun.plan.model_choice import arch_from_argv

    assert arch_from_argv(["run", "seed=1", f"model.arch={ARCH}"]) == ARCH
    assert arch_from_argv(["run", "model.arch=a:B", "model.arch=c:D"]) == "c:D"  # the last one wins, as in Hydra
    assert arch_from_argv(["run", "seed=1"]) is None
