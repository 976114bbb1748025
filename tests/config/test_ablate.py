"""conf/ablate/: each option sets exactly the keys it names back to the schema's default, on top of the recipe.

An ablation sweep (`python -m run -m experiment=pgolf_record ablate=none,xsa,loop seed=0,1`) is only honest if
`ablate=xsa` changes XSA and nothing else, and changes it to what a run without the lever has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from speedrun.config import CONF_DIR, Config

ABLATIONS = sorted(p.stem for p in (Path(CONF_DIR) / "ablate").glob("*.yaml"))


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """{"model.xsa_last_n": 11, ...}: every leaf of a resolved config."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def schema_default(key: str) -> Any:
    """The default of a dotted key in the top-level schema (Config())."""
    node: Any = OmegaConf.to_container(OmegaConf.structured(Config), resolve=False)
    for part in key.split("."):
        node = node[part]
    return node


def test_every_lever_of_the_record_has_an_ablation():
    assert {"none", "xsa", "loop", "parallel", "smear_gate", "attn_out_gate", "ema", "min_lr"} <= set(ABLATIONS)


@pytest.mark.parametrize("lever", [a for a in ABLATIONS if a != "none"])
def test_an_ablation_sets_only_its_keys_back_to_the_default(compose, lever):
    recipe = flat(OmegaConf.to_container(compose(["experiment=pgolf_record"]), resolve=True))
    ablated = flat(OmegaConf.to_container(compose(["experiment=pgolf_record", f"ablate={lever}"]), resolve=True))
    named = flat(OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "ablate" / f"{lever}.yaml")))
    changed = {k for k in recipe if recipe[k] != ablated[k]}
    assert changed, f"ablate={lever} changes nothing in experiment=pgolf_record: the recipe does not use that lever"
    assert changed <= set(named), f"ablate={lever} changed keys it does not name: {changed - set(named)}"
    for key, value in named.items():
        assert value == schema_default(key), f"ablate={lever}: {key}={value} is not the schema default"


def test_ablate_none_is_the_recipe(compose):
    assert compose(["experiment=pgolf_record", "ablate=none"]) == compose(["experiment=pgolf_record"])
