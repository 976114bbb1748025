"""Reading an option's YAML directly, for the presets ``auto`` resolves to (model=auto, the profile's preset)."""

from __future__ import annotations

from typing import Any

from speedrun.config import CONF_DIR
from speedrun.errors import PlanError


def known_options(group: str) -> list[str]:
    """The options conf/<group>/ holds (its YAML files' names), sorted; [] for a group that does not exist."""
    folder = CONF_DIR / group
    if group not in _groups() or not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml") if p.is_file())


def _groups() -> set[str]:
    return {p.name for p in CONF_DIR.iterdir() if p.is_dir()}


def load_option(group: str, option: str) -> dict[str, Any]:
    """Read conf/<group>/<option>.yaml (without its defaults list): used to resolve ``auto`` presets. The name is
    checked against the group's own options before it becomes a path: a name read from a run dir's plan.json
    (``../../x/secret``) must never reach a file outside conf/."""
    known = known_options(group)
    if not isinstance(option, str) or option not in known:
        raise PlanError(f"{group}={option!r}: no such option (conf/{group}/ holds {', '.join(known) or 'none'})")
    from omegaconf import OmegaConf  # only for an `auto` option; an exported file's config names its preset

    data = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items() if k != "defaults"}
