"""The compressors an artifact may use, their levels and the optional packages they need: checked by the resolver
before any work (config-level facts, torch-free), used by finishing/quantize.py to compress."""

from __future__ import annotations

import importlib.util

COMPRESS_EXTRA = "pip install 'speedrun[compress]'"

LEVELS = {"zlib": (0, 9), "lzma": (0, 9), "brotli": (0, 11), "zstd": (1, 22)}
"""Valid compression levels per compressor (inclusive)."""
MODULES = {"brotli": "brotli", "zstd": "zstandard"}
"""Compressors that need a package from the `compress` extra."""


def check_compressor(name: str, level: int) -> None:
    """Raise ValueError naming the fix if ``name`` is unknown, its level out of range or its package missing.
    Looks the package up without importing it (cheap; the resolver calls this before any work)."""
    if name not in LEVELS:
        raise ValueError(f"quant.compressor={name}: unknown; choose one of {', '.join(LEVELS)}")
    lo, hi = LEVELS[name]
    if not lo <= level <= hi:
        raise ValueError(f"quant.level={level} is out of range for quant.compressor={name}; use {lo}..{hi}")
    module = MODULES.get(name)
    if module and importlib.util.find_spec(module) is None:
        raise ValueError(
            f"quant.compressor={name} needs the '{module}' package, which is not installed: {COMPRESS_EXTRA} "
            f"(or use quant.compressor=lzma or zlib)"
        )
