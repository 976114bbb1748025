"""The run builds its Config from the plain config tree (speedrun.config.tree), without OmegaConf: for every
experiment, as composed and as debug=smoke shrinks it, the same Config as OmegaConf's, value for value and type for
type; a key the schema lacks and a value no Enum member names are refused, naming them."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from speedrun.artifact.sizes import experiments
from speedrun.config import ModelConfig, config_from_tree, to_config
from speedrun.config.tree import from_tree
from speedrun.errors import ConfigError

CONFIGS = [[], ["model=pgolf_baseline"], ["ttt=lora", "eval=sliding"], ["quant=int6"], ["kernel=tuned"]]
CONFIGS += [["track=pgolf_10min_16mb", "data=fineweb_sp8192"]]  # track.validation: a dict of schemas
CONFIGS += [[f"experiment={name}"] for name in experiments()]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: " ".join(o) or "defaults")
@pytest.mark.parametrize("smoke", [False, True], ids=["", "smoke"])
def test_the_tree_builds_the_config_omegaconf_builds(compose, overrides, smoke):
    composed = compose([*overrides, *(["debug=smoke"] if smoke else [])])
    # as the run holds it: resolved, Enums as their names, through JSON (an exported file carries it so)
    tree = json.loads(json.dumps(OmegaConf.to_container(composed, resolve=True, enum_to_str=True)))
    built, reference = config_from_tree(tree), to_config(composed)
    assert built == reference and repr(built) == repr(reference)  # repr: an int where a float was would show


def test_a_key_or_value_the_schema_lacks_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"model: no such key\(s\) n_layers"):
        from_tree(ModelConfig, {"n_layers": 3}, "model")
    with pytest.raises(ConfigError, match=r"model.mlp_act=swish: not one of relu2, "):
        from_tree(ModelConfig, {"mlp_act": "swish"}, "model")
    assert isinstance(from_tree(ModelConfig, {"logit_softcap": 30}).logit_softcap, float)  # an int widens
