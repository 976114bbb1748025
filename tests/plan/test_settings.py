"""plan/settings.py: a core settings dataclass built from a config part by same-named fields."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from speedrun.config import QuantConfig
from speedrun.config.choices import QuantName
from speedrun.plan.settings import settings


@dataclass(frozen=True)
class Inner:
    k: float
    n: int = 3


@dataclass(frozen=True)
class Outer:
    name: str
    sizes: tuple[int, ...]
    inner: Inner
    extra: bool = False
    tags: tuple[str, ...] = field(default=())


@dataclass
class Cfg:
    name: QuantName
    sizes: list[int]
    inner: dict
    unused: str = "x"


def test_same_named_fields_enums_lists_and_nested_parts():
    got = settings(Outer, Cfg(QuantName.int6, [1, 2], {"k": 1.5}))
    assert got == Outer("int6", (1, 2), Inner(1.5, 3))
    assert type(got.name) is str  # the Enum's value, so the core never imports config's Enums


def test_overrides_win_and_unknown_ones_are_refused():
    assert settings(Outer, Cfg(QuantName.off, [], {"k": 0.0}), extra=True).extra is True
    with pytest.raises(TypeError, match="no field"):
        settings(Outer, Cfg(QuantName.off, [], {"k": 0.0}), nope=1)


def test_a_required_field_the_part_lacks_is_named():
    with pytest.raises(TypeError, match="Inner.*'k'"):
        settings(Inner, {"n": 2})


@dataclass(frozen=True)
class AWQ:
    top_k: int
    bits: int


@dataclass(frozen=True)
class Q:
    name: str
    bits: int
    awq: AWQ


def test_a_real_config_part():
    """The quant group's own dataclass, nested part included: plain values the core can hold."""
    cfg = QuantConfig(name=QuantName.int6, bits=5)
    assert settings(Q, cfg) == Q("int6", 5, AWQ(cfg.awq.top_k, cfg.awq.bits))
