"""The real config tree: every option of every group composes, and mistakes fail at compose time."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from speedrun.config import CONF_DIR, GROUPS, Config, to_config

OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]


def test_every_group_has_options():
    for group in GROUPS:
        assert list((CONF_DIR / group).glob("*.yaml")), f"conf/{group}/ has no options"


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_into_the_typed_config(compose, group, option):
    cfg = to_config(compose([f"{group}={option}"]))
    assert isinstance(cfg, Config)
    assert getattr(cfg, group).name == PRESETS.get((group, option), option)


PRESETS = {("quant", "record"): "int6", ("track", "none"): None}
"""Options that preset the levers of a scheme and carry that scheme's name: quant=record is int6 as the 2026-04-29
record exports it (quant.name picks the quantizer; the artifact is model.int6.<compressor>). track=none holds no
rules, so its name is None."""


def test_hydra_lists_the_options_of_each_group_and_no_schema(compose):
    """What `python -m run --help` and a misspelt choice list: the YAMLs, not the ConfigStore's schemas. Each
    option is still validated against its group's schema."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for group in GROUPS:
            options = loader.get_group_options(group)
            assert options == sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")), (group, options)
    cfg = compose()
    for group, schema in GROUPS.items():
        assert OmegaConf.get_type(cfg[group]) is schema, group


def test_default_config_and_contract_knobs(compose):
    cfg = compose()
    missing = object()
    for key in (
        "seed",
        "name",
        "budget.train_seconds",
        "budget.max_steps",
        "budget.tokens_per_step",
        "eval.tokens",
        "data.path",
    ):
        assert OmegaConf.select(cfg, key, default=missing) is not missing, key
    typed = to_config(compose(["budget.train_seconds=5", "eval.tokens=1024", "seed=3"]))
    assert (typed.budget.train_seconds, typed.eval.tokens, typed.seed) == (5.0, 1024, 3)


def test_typo_in_a_key_fails_at_compose_time(compose):
    with pytest.raises(ConfigCompositionException) as e:
        compose(["budget.train_secnds=5"])
    assert "train_secnds" in str(e.value) + str(e.value.__cause__)


def test_wrong_type_fails_at_compose_time(compose):
    with pytest.raises((ConfigCompositionException, ValidationError)) as e:
        compose(["model.n_layer=many"])
    assert "n_layer" in str(e.value) + str(e.value.__cause__)


def test_unknown_option_fails_with_the_available_ones(compose):
    with pytest.raises(ConfigCompositionException) as e:
        compose(["attn=flash3"])
    assert "sdpa" in str(e.value)  # Hydra lists the available options


def test_every_schema_field_has_a_docstring():
    import ast
    import inspect

    import speedrun.config as module

    tree = ast.parse(inspect.getsource(module))
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Config")):
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                documented = isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                is_group = isinstance(node.annotation, ast.Name) and node.annotation.id.endswith("Config")
                if not is_group:
                    assert documented, f"{cls.name}.{node.target.id} has no docstring"


EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_resolves_on_its_target(compose, experiment):
    from conftest import fake_device
    from speedrun.plan import resolve

    cfg = to_config(compose([f"experiment={experiment}"]))
    assert cfg.name == experiment
    # auto and the T4 recipe (emulated) resolve on an H100
    target = "h100" if cfg.hardware.name in ("auto", "t4") else cfg.hardware.name
    plan = resolve(cfg, fake_device(target))
    assert plan.tokens_per_step == cfg.budget.tokens_per_step


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_trains_without_its_export_or_ttt(compose, experiment):
    """`experiment=X quant=off ttt=off` (training only, as the ablation and resume checks run) is accepted: an
    experiment's export and TTT settings live in their groups (quant=record, ttt=record), which `=off` replaces whole,
    instead of keys that quant=off would leave behind and the config would refuse."""
    from conftest import fake_device
    from speedrun.plan import resolve

    cfg = to_config(compose([f"experiment={experiment}", "quant=off", "ttt=off"]))
    target = "h100" if cfg.hardware.name in ("auto", "t4") else cfg.hardware.name
    plan = resolve(cfg, fake_device(target))
    assert (plan.quant.name, plan.ttt.name) == ("off", "off")


def test_t4_colab_recipe(compose):
    from conftest import fake_device
    from speedrun.plan import resolve

    plan = resolve(to_config(compose(["experiment=t4_colab"])), fake_device("t4"))
    assert (plan.model.seq_len, plan.micro_batch, plan.precision, plan.grad_scaler) == (512, 16, "fp16", True)
    assert plan.attn_kernel == "sdpa:efficient" and plan.model.vocab_size == 8192 and not plan.emulated
