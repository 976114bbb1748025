"""Reading an option's YAML directly, for the presets ``auto`` resolves to (model=auto, the profile's preset)."""

from __future__ import annotations

from typing import Any

from speedrun.config import CONF_DIR
from speedrun.errors import PlanError


def load_option(group: str, option: str) -> dict[str, Any]:
    """Read conf/<group>/<option>.yaml (without its defaults list): used to resolve ``auto`` presets."""
    path = CONF_DIR / group / f"{option}.yaml"
    if not path.exists():
        raise PlanError(f"{group}={option}: no such option ({path} missing)")
    from omegaconf import OmegaConf  # only for an `auto` option; an exported file's config names its preset

    data = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items() if k != "defaults"}
