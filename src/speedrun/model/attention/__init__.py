"""Attention backends behind one interface (see base.AttentionBackend), picked by name at build time.

    from speedrun.model.attention import get_backend
    attn = get_backend("sdpa", kernel="flash")     # or "math", "flex" (window=..., kernel_options=...), "fa3"
    model = GPT(shape, attn, bos_id=...)

The registry maps a name to "module:Class"; the module is imported on first use, so importing this package
does no work. The resolver asks a backend's class (``backend_class``) what it can run before anything is built.
"""

from __future__ import annotations

import importlib

from speedrun.model.attention.base import AttentionBackend, Capabilities

REGISTRY: dict[str, str | type[AttentionBackend]] = {
    "sdpa": "speedrun.model.attention.sdpa:SDPAAttention",
    "math": "speedrun.model.attention.math:MathAttention",
    "flex": "speedrun.model.attention.flex:FlexAttention",
    "fa3": "speedrun.model.attention.fa3:FA3Attention",
}


def register_backend(name: str, backend: str | type[AttentionBackend]) -> None:
    """Add a backend under ``name`` (a class, or "module:Class" imported on first use); refuses to overwrite."""
    if name in REGISTRY:
        raise ValueError(f"attention backend {name!r} is already registered")
    REGISTRY[name] = backend


def backend_class(name: str) -> type[AttentionBackend]:
    """The class registered as ``name``; an unknown name raises ValueError listing the registered ones."""
    try:
        entry = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = REGISTRY[name] = getattr(importlib.import_module(module), attr)
    return entry


def get_backend(name: str, **options) -> AttentionBackend:
    """Build the backend registered as ``name`` with its options (e.g. kernel="flash" for sdpa).

    Options a backend does not take raise TypeError naming them; an unknown name raises ValueError.
    """
    cls = backend_class(name)
    try:
        return cls(**options)
    except TypeError as e:
        raise TypeError(f"attention backend {name!r}: {e}") from e


__all__ = ["AttentionBackend", "Capabilities", "get_backend", "backend_class", "register_backend", "REGISTRY"]
