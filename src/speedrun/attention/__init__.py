"""Attention backends behind one interface (see base.AttentionBackend), picked by name at build time.

    from speedrun.attention import get_backend
    attn = get_backend("sdpa", kernel="flash")     # or "math", "flex" (window=..., kernel_options=...), "fa3"
    model = GPT(cfg, attn, bos_id=...)

Factories import their torch modules lazily; importing this package does no work.
"""
from __future__ import annotations

from typing import Callable

from .base import AttentionBackend


def _math(**options) -> AttentionBackend:
    from .math import MathAttention

    return MathAttention(**options)


def _sdpa(**options) -> AttentionBackend:
    from .sdpa import SDPAAttention

    return SDPAAttention(**options)


def _flex(**options) -> AttentionBackend:
    from .flex import FlexAttention

    return FlexAttention(**options)


def _fa3(**options) -> AttentionBackend:
    from .fa3 import FA3Attention

    return FA3Attention(**options)


REGISTRY: dict[str, Callable[..., AttentionBackend]] = {
    "math": _math,
    "sdpa": _sdpa,
    "flex": _flex,
    "fa3": _fa3,
}


def register_backend(name: str, factory: Callable[..., AttentionBackend]) -> None:
    """Add a backend (e.g. fa3) under ``name``; refuses to overwrite an existing one."""
    if name in REGISTRY:
        raise ValueError(f"attention backend {name!r} is already registered")
    REGISTRY[name] = factory


def get_backend(name: str, **options) -> AttentionBackend:
    """Build the backend registered as ``name`` with its options (e.g. kernel="flash" for sdpa).

    Options a backend does not take raise TypeError naming them; an unknown name raises ValueError.
    """
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; registered: {', '.join(sorted(REGISTRY))}"
        ) from None
    try:
        return factory(**options)
    except TypeError as e:
        raise TypeError(f"attention backend {name!r}: {e}") from e


__all__ = ["AttentionBackend", "get_backend", "register_backend", "REGISTRY"]
