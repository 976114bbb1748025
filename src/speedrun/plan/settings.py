"""settings(cls, cfg): a core settings dataclass filled from a config (or Plan) part by its same-named fields; the
settings of each phase of a Plan (train_settings, finish_settings, ...), which both shells hand the core.

The core's settings types (ModelShape, QuantSettings, TTTSettings, ...) hold plain values and no checks; config/
keeps the checks and the docs. One generic copy builds them all, so a field added to a settings type is read from
the config part of the same name with no code here."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from enum import Enum
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

from speedrun.core.pipeline import EvalSettings, FinishSettings
from speedrun.core.quant import QuantSettings
from speedrun.core.train import Stage, TrainSettings
from speedrun.core.ttt_lora import GlobalSettings, TTTSettings

if TYPE_CHECKING:
    from types import SimpleNamespace

    from speedrun.plan.types import Plan

    PlanLike = Plan | SimpleNamespace
    """A Plan, or a run dir's plan.json read as attributes (the export rebuilds a raw-rule run's file from it)."""

__all__ = ["finish_settings", "plain", "quant_settings", "settings", "train_settings", "ttt_settings"]

S = TypeVar("S")


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def plain(value: Any) -> Any:
    """A config value as the core holds it: an Enum as its value, a list as a tuple (settings are frozen), a
    mapping's and a sequence's items likewise; anything else as is."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


def settings(cls: type[S], cfg: Any, **overrides: Any) -> S:
    """``cls`` (a dataclass) with each field taken from ``cfg``'s attribute (or key) of the same name, converted by
    ``plain``; a field whose type is itself a dataclass is built the same way from the part of that name.
    ``overrides`` win over ``cfg``. A field ``cfg`` lacks takes its default; one without a default is a TypeError
    naming it (a settings type asked of the wrong part)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"settings() builds dataclasses; {cls!r} is not one")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in overrides:
            values[f.name] = overrides[f.name]
            continue
        if isinstance(cfg, Mapping):
            found, value = f.name in cfg, cfg.get(f.name)
        else:
            found, value = hasattr(cfg, f.name), getattr(cfg, f.name, None)
        if not found:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"settings({cls.__name__}): {type(cfg).__name__} has no field {f.name!r}")
            continue
        kind = hints.get(f.name)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind) and not isinstance(value, kind):
            value = settings(kind, value)
        values[f.name] = plain(value)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise TypeError(f"settings({cls.__name__}): no field {sorted(unknown)}")
    return cls(**values)


# -- the core's settings of a Plan: what both shells hand the core (run/ and the exported file's PLAN) -----------


def train_settings(plan: PlanLike) -> TrainSettings:
    """The step's and the loop's settings (speedrun.core.train.TrainSettings) from the Plan's same-named fields."""
    return settings(TrainSettings, plan, stages=tuple(settings(Stage, stage) for stage in plan.stages))


def quant_settings(plan: PlanLike) -> QuantSettings:
    return settings(QuantSettings, plan.quant)


def ttt_settings(plan: PlanLike) -> TTTSettings:
    """The plan's ttt block as the score-first pass takes it."""
    t = plan.ttt
    return settings(
        TTTSettings,
        t,
        seed=plan.seed,
        batch_size=t.batch_size or plan.eval.batch_size,  # the resolver fills it; None only in a hand-made plan
        compile="inductor" if t.compile else None,
        cuda_graphs=bool(t.cuda_graphs),
        # a step's activations never exceed a training micro-step's
        phased=settings(GlobalSettings, t.phased, micro_rows=plan.micro_batch),
    )


def finish_settings(plan: PlanLike, ttt: bool = False) -> FinishSettings:
    """The plan's eval and quant blocks as the core's finish takes them, and its ttt block when ``ttt`` and on."""
    return FinishSettings(
        seq_len=plan.model.seq_len,
        device=plan.device,
        autocast=plan.autocast,
        eval=settings(EvalSettings, plan.eval),
        quant=quant_settings(plan) if plain(plan.quant.name) != "off" else None,
        ttt=ttt_settings(plan) if ttt and plain(plan.ttt.name) != "off" else None,
    )
