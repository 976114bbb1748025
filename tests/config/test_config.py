"""The real config tree: every option of every group composes, and mistakes fail at compose time. What a user types
is read as meant or refused at compose time, in one line naming the key and the fix: counts in scientific notation,
optimizer and schedule values out of range, a tokenizer without its shards."""

from __future__ import annotations

import dataclasses

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from speedrun.config import CONF_DIR, GROUPS, Config, OptimConfig, ScheduleConfig, to_config
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from support.devices import fake_device

OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]


def test_every_group_has_options():
    for group in GROUPS:
        assert list((CONF_DIR / group).glob("*.yaml")), f"conf/{group}/ has no options"


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_into_the_typed_config(compose, group, option):
    cfg = to_config(compose([f"{group}={option}", *WITH.get((group, option), [])]))
    assert isinstance(cfg, Config)
    assert getattr(cfg, group).name == PRESETS.get((group, option), option)


WITH = {
    ("track", "pgolf_10min_16mb"): ["data=fineweb_sp8192"],
    ("track", "pgolf_non_record_16mb"): ["data=fineweb_sp8192"],
    ("track", "mng_124m"): ["data=fineweb10B_gpt2"],
}
"""Options that compose only beside another: a contest's track refuses the default embedded corpus."""
PRESETS = {
    ("quant", "record"): "int6",
    ("quant", "pr2014"): "int6",
    ("ttt", "pr2014"): "record",
    ("track", "none"): None,
}
"""Options that preset the levers of a scheme and carry that scheme's name: quant=record is int6 as the 2026-04-29
record exports it (quant.name picks the quantizer; the artifact is model.int6.<compressor>), quant=pr2014 as PR #2014
does, and ttt=pr2014 is the records' TTT (ttt.name=record) with PR #2014's settings. track=none holds no rules, so
its name is None."""


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
    cfg = to_config(compose([f"experiment={experiment}", "quant=off", "ttt=off"]))
    target = "h100" if cfg.hardware.name in ("auto", "t4") else cfg.hardware.name
    plan = resolve(cfg, fake_device(target))
    assert (plan.quant.name, plan.ttt.name) == ("off", "off")


def test_t4_colab_recipe(compose):
    plan = resolve(to_config(compose(["experiment=t4_colab"])), fake_device("t4"))
    assert (plan.model.seq_len, plan.micro_batch, plan.precision, plan.grad_scaler) == (512, 16, "fp16", True)
    assert plan.attn_kernel == "sdpa:efficient" and plan.model.vocab_size == 8192 and not plan.emulated


# ---------------------------------------------------------------------------------------------------------
# what a user types: counts, optimizer and schedule values, a tokenizer without its shards

COUNTS = ["budget.tokens", "budget.tokens_per_step", "eval.tokens", "eval.periodic_tokens", "quant.cap_bytes"]


def typed(compose, *overrides):
    return to_config(compose(list(overrides)))


def field_of(cfg, key):
    group, name = key.split(".")
    return getattr(getattr(cfg, group), name)


def refusal(compose, *overrides) -> str:
    with pytest.raises(ConfigError) as e:
        typed(compose, *overrides)
    message = str(e.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize("spelling", ["2e9", "2E9", "2_000_000_000", "2000000000", "'2e9'"])
def test_a_count_takes_scientific_notation_and_underscores_and_stays_an_int(compose, spelling):
    # every count spelt so in one composition (one Hydra compose per spelling, not one per key and spelling)
    cfg = typed(compose, *(f"{key}={spelling}" for key in COUNTS))
    for key in COUNTS:
        value = field_of(cfg, key)
        assert value == 2_000_000_000 and type(value) is int, (key, value)


def test_budget_flops_takes_any_spelling_as_a_float(compose):
    for spelling in ("1e17", "100_000_000_000_000_000", "100000000000000000"):
        assert typed(compose, f"budget.flops={spelling}").budget.flops == 1e17


def test_the_plan_sees_int_counts(compose):
    plan = resolve(
        typed(compose, "budget.tokens=2e9", "budget.tokens_per_step=4.096e3", "eval.tokens=8.192e3"), fake_device("cpu")
    )
    assert (plan.budget.tokens, plan.tokens_per_step, plan.eval.tokens) == (2_000_000_000, 4096, 8192)
    assert all(type(v) is int for v in (plan.budget.tokens, plan.tokens_per_step, plan.eval.tokens))


@pytest.mark.parametrize("key", COUNTS)
@pytest.mark.parametrize("value", ["2.5", "2.5e0", "abc", "true"])
def test_a_count_that_is_not_a_whole_number_is_refused_naming_the_key_and_the_spellings(compose, key, value):
    message = refusal(compose, f"{key}={value}")
    assert f"{key}=" in message and "not a whole number" in message and "2e9" in message


def test_the_range_of_a_count_is_still_checked(compose):
    assert "budget.tokens=0 must be >= 1" in refusal(compose, "budget.tokens=0e0")
    assert "eval.tokens=-5 must be >= 0" in refusal(compose, "eval.tokens=-5")


# An invalid value of every numeric field of the optim and schedule groups, and the words of the valid range.
OPTIM_NUMERIC = [f.name for f in dataclasses.fields(OptimConfig) if f.type in ("float", "int")]
SCHEDULE_NUMERIC = ["rewarmup_steps", "warmup_frac", "warmdown_frac", "min_lr"]


@pytest.mark.parametrize("key", [f"optim.{k}" for k in OPTIM_NUMERIC] + [f"schedule.{k}" for k in SCHEDULE_NUMERIC])
def test_every_negative_optim_or_schedule_value_is_refused_at_compose_time(compose, key):
    message = refusal(compose, f"{key}=-1")
    assert message.startswith(f"{key}=-1") and "must be" in message


# (override, the valid range the message names, the fix that composes)
OUT_OF_RANGE = [
    ("optim.matrix_lr=-1", ">= 0", "optim.matrix_lr=0.04"),
    ("optim.head_lr=nan", ">= 0", "optim.head_lr=0.008"),
    ("optim.muon_momentum=1", "in [0, 1)", "optim.muon_momentum=0.95"),
    ("optim.muon_momentum_warmup_start=1.5", "in [0, 1)", "optim.muon_momentum_warmup_start=0.85"),
    ("optim.beta1=1", "in [0, 1)", "optim.beta1=0.9"),
    ("optim.beta2=1.01", "in [0, 1)", "optim.beta2=0.95"),
    ("optim.eps=0", "> 0", "optim.eps=1e-08"),
    ("optim.muon_backend_steps=0", ">= 1", "optim.muon_backend_steps=5"),
    ("optim.grad_clip=-0.5", ">= 0", "optim.grad_clip=0.0"),
    ("optim.name=adamw", "muon is the only optimizer", "optim=muon"),
    ("schedule.warmup_frac=1.5", "in [0, 1]", "schedule.warmup_frac=0.0"),
    ("schedule.warmdown_frac=-0.2", "in [0, 1]", "schedule.warmdown_frac=0.2"),
    ("schedule.rewarmup_steps=-3", ">= 0", "schedule.rewarmup_steps=10"),
]


@pytest.mark.parametrize("override,valid,fix", OUT_OF_RANGE)
def test_optim_and_schedule_values_out_of_range_name_the_key_the_range_and_a_fix(compose, override, valid, fix):
    message = refusal(compose, override)
    key = override.split("=")[0]
    assert key in message and valid in message, message
    if fix.startswith(key):  # the example the message offers is a real way out
        assert fix in message
        typed(compose, override, fix)


def test_warm_up_and_warm_down_together_are_at_most_the_budget(compose):
    message = refusal(compose, "schedule.warmup_frac=0.6", "schedule.warmdown_frac=0.6")
    assert "schedule.warmup_frac=0.6 + schedule.warmdown_frac=0.6 must be <= 1" in message
    typed(compose, "schedule.warmup_frac=0.6", "schedule.warmdown_frac=0.4")


def test_the_optim_and_schedule_defaults_pass_their_own_checks():
    OptimConfig()
    ScheduleConfig()


def test_a_tokenizer_without_shards_is_refused_naming_both_keys(compose):
    message = refusal(compose, "data.tokenizer=my.model")
    assert "data.tokenizer=my.model" in message and "data.path" in message and "drop data.tokenizer" in message
    cfg = typed(compose, "data.tokenizer=my.model", "data.path=shards")  # the fix it names composes
    assert (cfg.data.path, cfg.data.tokenizer) == ("shards", "my.model")
    message = refusal(compose, "data=fineweb_sp1024", "data.path=null")
    assert "data.tokenizer=data/tokenizers/fineweb_1024_bpe.model needs data.path" in message
