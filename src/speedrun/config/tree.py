"""A config tree (plain dicts, lists and scalars: a composed config's container, or the one an exported train_gpt.py
carries) -> the typed schema dataclasses, without OmegaConf.

The tree was checked against the schemas when Hydra composed it, so this is a constructor, not a second validator:
Enums are matched by name (as OmegaConf does), ints widen to float fields, nested dataclasses are built from their
dicts, and each dataclass's ``__post_init__`` runs its checks as it does under OmegaConf. A key the schema lacks is
refused by name. The run's path (speedrun.run.runner) builds its Config here, so training never needs OmegaConf.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from enum import Enum
from typing import Any, TypeVar

from speedrun.errors import ConfigError

T = TypeVar("T")


def from_tree(cls: type[T], tree: Any, where: str = "") -> T:
    """``cls`` (a schema dataclass) built from the dict ``tree``; missing keys take their defaults."""
    if isinstance(tree, cls):
        return tree
    if not isinstance(tree, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping for {cls.__name__}, got {tree!r}")
    hints = _hints(typing.cast(Any, cls))  # a class is hashable; mypy cannot see it of type[T]
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(tree) - names)
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: no such key(s) {', '.join(map(str, unknown))}")
    kwargs = {k: _value(hints[k], v, f"{where}.{k}" if where else k) for k, v in tree.items()}
    return cls(**kwargs)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _value(hint: Any, value: Any, where: str) -> Any:
    """``value`` as a field typed ``hint`` holds it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _value(inner[0], value, where) if len(inner) == 1 else value
    if value is None or hint is Any:
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return from_tree(hint, value, where)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return _enum(hint, value, where)
    if origin in (list, tuple) and isinstance(value, (list, tuple)):
        item = args[0] if args else Any
        return [_value(item, v, where) for v in value] if origin is list else tuple(value)
    if origin is dict and isinstance(value, dict):
        # dict[str, Schema]: each value built as its schema (track.validation)
        item = args[1] if len(args) == 2 else Any
        return {k: _value(item, v, f"{where}.{k}") for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # OmegaConf's FloatNode takes an int
    return value


def _enum(cls: type[Enum], value: Any, where: str) -> Enum:
    if isinstance(value, cls):
        return value
    try:
        return cls[str(value)]  # by name, as OmegaConf matches a YAML string to a member
    except KeyError:
        valid = ", ".join(m.name for m in cls)
        raise ConfigError(f"{where}={value}: not one of {valid}") from None
