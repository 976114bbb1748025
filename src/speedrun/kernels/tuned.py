"""Tuned tables: conf/kernel/tuned/<card>.yaml, one entry per model, written by ``python -m speedrun.tune`` and
read by the resolver under ``kernel=tuned``.

    card: h100
    models:
      pgolf_baseline:
        settings: {compile_mode: max-autotune-no-cudagraphs, cuda_graphs: true, fp8: [mlp_down]}
        provenance: {device_name: ..., torch: ..., triton: ..., date: ..., model: {...}, default_tokens_per_s: ...,
                     winner_tokens_per_s: ..., speedup: ..., ...}

``settings`` holds kernel-group fields in KernelConfig.explicit()'s flat form (tile fields as "flex_fwd.block_m");
``provenance`` says where the numbers came from, so a table is never a bare claim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speedrun.config.kernel import KernelConfig
from speedrun.errors import ConfigError, PlanError
from speedrun.paths import CONF_DIR
from speedrun.records.atomic import atomic_write

TABLE_DIR = CONF_DIR / "kernel" / "tuned"


def table_path(card: str, table_dir: Path | None = None) -> Path:
    return Path(table_dir or TABLE_DIR) / f"{card}.yaml"


def unflatten(settings: dict[str, Any]) -> dict[str, Any]:
    """{"flex_fwd.block_m": 64, "cuda_graphs": True} -> {"flex_fwd": {"block_m": 64}, "cuda_graphs": True}."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        head, _, tail = key.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = value
        else:
            out[key] = value
    return out


def validate_settings(settings: dict[str, Any], where: str) -> dict[str, Any]:
    """Check a table's settings against the kernel schema (a wrong key or value names the file)."""
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(KernelConfig), unflatten(settings)))
    except Exception as e:  # noqa: BLE001 - OmegaConf's errors name the key; we add the file
        raise ConfigError(f"{where}: invalid kernel settings {settings}: {e}") from None
    assert isinstance(cfg, KernelConfig)
    return cfg.explicit()


def load_entry(card: str, model_name: str, table_dir: Path | None = None) -> tuple[dict[str, Any], dict]:
    """(settings, provenance) of ``model_name`` in ``card``'s table; PlanError naming how to make one."""
    from omegaconf import OmegaConf

    path = table_path(card, table_dir)
    make = f"python -m speedrun.tune model={model_name}"
    if not path.exists():
        have = sorted(p.stem for p in path.parent.glob("*.yaml")) if path.parent.exists() else []
        raise PlanError(
            f"kernel=tuned: no tuned table for this card ({card}): {path} does not exist "
            f"(tables exist for: {', '.join(have) or 'none'}); run `{make}` on this card to write one, "
            f"or use kernel=default"
        )
    data = OmegaConf.to_container(OmegaConf.load(path))
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict) or model_name not in models:
        names = ", ".join(sorted(models)) if isinstance(models, dict) else "none"
        raise PlanError(
            f"kernel=tuned: {path} has no entry for model={model_name} (it has: {names}); run `{make}` "
            f"on this card, or use kernel=default"
        )
    entry = models[model_name] or {}
    settings = validate_settings(dict(entry.get("settings") or {}), f"{path} ({model_name})")
    return settings, dict(entry.get("provenance") or {})


def write_entry(
    card: str, model_name: str, settings: dict[str, Any], provenance: dict[str, Any], table_dir: Path | None = None
) -> Path:
    """Write (or replace) ``model_name``'s entry in ``card``'s table, keeping the other models' entries."""
    import yaml

    path = table_path(card, table_dir)
    settings = validate_settings(settings, str(path))
    data: dict[str, Any] = {"card": card, "models": {}}
    if path.exists():
        old = yaml.safe_load(path.read_text()) or {}
        data["models"] = dict(old.get("models") or {})
    data["models"][model_name] = {"settings": settings, "provenance": provenance}
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Kernel settings measured fastest on {card} by `python -m speedrun.tune` (one entry per model);\n"
        f"# read by kernel=tuned. Provenance says on what, with what and how fast. Rewritten by the tuner.\n"
    )
    atomic_write(path, header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    return path
