"""The model registry: ``model.arch`` names a model class, looked up once when the run is built.

``model.arch`` is a registered name (``gpt``, the built-in) or ``"package.module:Class"``, like the attention
backends' registry. A class may carry its own knobs as a ``config`` attribute: a dataclass that subclasses
speedrun.config.model.ModelConfig and adds typed fields. ``register_model_schema`` puts that dataclass in
Hydra's ConfigStore as the model group's schema before Hydra composes, so ``model.my_knob=3`` is checked like any
built-in field and a misspelt key still fails at compose time; the runner hands the extra fields to the model's
constructor as ``options``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from speedrun.config.model import ModelConfig
from speedrun.errors import ConfigError, PlanError
from speedrun.model.protocol import missing_methods

BUILTIN = {"gpt": "speedrun.model.gpt:GPT"}
"""Short names for the models that ship with speedrun."""


def class_path(arch: str) -> str:
    return BUILTIN.get(arch, arch)


def model_class(arch: str) -> type:
    """The class ``arch`` names, checked against the pipeline's contract; PlanError naming what is wrong."""
    path = class_path(arch)
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise PlanError(f"model.arch={arch}: not a registered model ({', '.join(BUILTIN)}) nor 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PlanError(f"model.arch={arch}: cannot import {module_name} ({e}); is its package installed?") from e
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise PlanError(f"model.arch={arch}: {module_name} has no class {attr}")
    missing = missing_methods(cls)
    if missing:
        raise PlanError(
            f"model.arch={arch}: {cls.__name__} lacks {', '.join(missing)}, which the pipeline calls "
            f"(speedrun.model.protocol says what each is for)"
        )
    return cls


def model_schema(cls: type) -> type | None:
    """The class's own config dataclass (a ModelConfig subclass), or None for a model without knobs of its own."""
    schema = getattr(cls, "config", None)
    if schema is None:
        return None
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema) and issubclass(schema, ModelConfig)):
        raise ConfigError(f"{cls.__name__}.config must be a dataclass subclassing speedrun.config.model.ModelConfig")
    return schema


def own_options(config: Any) -> dict[str, Any]:
    """The fields a model's schema adds to ModelConfig's, with their values: what the model gets as ``options``."""
    base = {f.name for f in dataclasses.fields(ModelConfig)}
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in base}


def arch_from_argv(argv: list[str]) -> str | None:
    """``model.arch=...`` on the command line (its last value), read before Hydra composes."""
    found = None
    for arg in argv[1:]:
        for prefix in ("model.arch=", "++model.arch=", "+model.arch="):
            if arg.startswith(prefix):
                found = arg[len(prefix) :].strip("'\"")
    return found


def arch_schema(arch: str | None) -> type | None:
    """``model.arch``'s own schema (None for a built-in model or one without knobs); PlanError for an arch that
    cannot be imported."""
    return None if not arch or arch in BUILTIN else model_schema(model_class(arch))


def register_model_schema(arch: str | None) -> None:
    """Make ``arch``'s own schema the model group's (``/model_schema``), so its knobs compose. A built-in model or
    one without a schema changes nothing; an arch that cannot be imported is left to the resolver's error."""
    try:
        schema = arch_schema(arch)
    except PlanError:
        return  # reported, with its reason, when the run resolves
    if schema is not None:
        from hydra.core.config_store import ConfigStore

        ConfigStore.instance().store(name="model_schema", node=schema)
