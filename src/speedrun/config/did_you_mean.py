"""Overrides that name no key or no option, caught before Hydra composes: one line with the closest valid ones.

Hydra answers a misspelt key (``budgett.train_seconds=10``) with advice to append it (``+budgett...``), which
would only move the typo into the run; here the key is checked against the Config schema's field paths and a
group's option against its files in conf/, and the message names the nearest ones (difflib) and the fix."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from functools import cache

from speedrun.config import CONF_DIR, Config
from speedrun.config.objective import objective_problem

SWEEP_FUNCTIONS = ("range(", "choice(", "interval(", "glob(", "tag(", "sort(", "shuffle(")
"""Hydra's sweep syntax in a value: options it expands itself, not checked here."""


@cache
def key_paths() -> tuple[str, ...]:
    """Every settable key of the Config schema, dotted (budget.train_seconds, hardware.name, seed, ...)."""
    return tuple(_paths(Config, ""))


def _paths(schema: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(schema)
    out: list[str] = []
    for f in dataclasses.fields(schema):
        path = prefix + f.name
        out.append(path)
        nested = _dataclass_of(hints.get(f.name))
        if nested is not None:
            out.extend(_paths(nested, path + "."))
    return out


def _dataclass_of(hint: object) -> type | None:
    """The dataclass a field holds (through Optional), or None for a leaf (a number, a string, a dict, ...)."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    dataclasses_in = [a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return dataclasses_in[0] if len(dataclasses_in) == 1 else None


@cache
def group_options() -> dict[str, tuple[str, ...]]:
    """Each config group in conf/ (hydra's own aside) and its options, the names of its YAML files."""
    return {
        d.name: tuple(sorted(p.stem for p in d.glob("*.yaml")))
        for d in sorted(CONF_DIR.iterdir())
        if d.is_dir() and d.name != "hydra"
    }


def unknown_override(args: list[str], model_arch: str | None = None) -> str | None:
    """One line for the first override in ``args`` whose key or option does not exist, naming the closest valid
    ones and the fix; None when all exist. Flags, appends (+key), deletions (~key), hydra.* keys and, with a model
    of the user's own (``model_arch``), keys under model. are left to Hydra."""
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq or arg.startswith(("-", "+", "~")) or key.startswith("hydra") or "/" in key:
            continue
        if key in group_options():
            problem = _unknown_option(key, value)
        elif key.split(".")[0] == "model" and model_arch is not None:
            problem = None
        elif key == "objective" and not value.startswith(SWEEP_FUNCTIONS):
            problem = next(filter(None, map(objective_problem, value.split(","))), None)
        else:
            problem = _unknown_key(key, value)
        if problem is not None:
            return problem
    return None


def _unknown_option(group: str, value: str) -> str | None:
    if value.startswith(SWEEP_FUNCTIONS) or value in ("null", ""):
        return None
    options = group_options()[group]
    for option in value.split(","):
        if option not in options:
            close = difflib.get_close_matches(option, options, n=3, cutoff=0.5)
            hint = f"did you mean {_either(close)}? fix: {group}={close[0]}" if close else "options:"
            return f"{group}={option} is no option of {group} ({', '.join(options)}); {hint}".removesuffix(" options:")
    return None


def _unknown_key(key: str, value: str) -> str | None:
    paths = key_paths()
    if key in paths or _under_leaf(key, paths):
        return None
    leaves = [p for p in paths if not any(q.startswith(p + ".") for q in paths)]
    close = difflib.get_close_matches(key, leaves, n=3, cutoff=0.6)
    if not close:
        return f"unknown key {key!r}; `python -m run --cfg job` lists every key"
    return f"unknown key {key!r}; did you mean {_either(close)}? fix: {close[0]}={value}"


def _under_leaf(key: str, paths: tuple[str, ...]) -> bool:
    """A key inside a field the schema leaves open (a dict): budget.x is unknown, a_dict_field.x is not."""
    parts = key.split(".")
    known = set(paths)
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head in known:
            return not any(p.startswith(head + ".") for p in paths)
    return False


def _either(names: list[str]) -> str:
    return " or ".join(names)
