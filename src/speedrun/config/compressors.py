"""The compressors an artifact may use, their levels and the optional packages they need: checked by the resolver
before any work (config-level facts, torch-free), used by quant/compression.py and quant/pergroup.py to
compress."""

from __future__ import annotations

import importlib.util

COMPRESS_EXTRA = "pip install 'speedrun[compress]'"

LEVELS = {"zlib": (0, 9), "lzma": (0, 9), "brotli": (0, 11), "zstd": (1, 22)}
"""Valid compression levels per compressor (inclusive)."""
MODULES = {"brotli": "brotli", "zstd": "zstandard"}
"""Compressors that need a package from the `compress` extra."""
PERGROUP = "pergroup"
"""quant.compressor=pergroup: no codec of its own; each tensor group is compressed with quant.pergroup_codec."""
PERGROUP_CODECS = ("brotli", "lzma")
"""The codecs a pergroup artifact may use: both release the GIL, so groups compress in parallel threads."""


def check_compressor(name: str, level: int, codec: str | None = None) -> None:
    """Raise ValueError naming the fix if ``name`` is unknown, its level out of range or its package missing
    (for pergroup: those of ``codec``, quant.pergroup_codec). Looks the package up without importing it (cheap;
    the resolver calls this before any work)."""
    what, other = f"quant.compressor={name}", "quant.compressor=lzma or zlib"
    if name == PERGROUP:
        if codec not in PERGROUP_CODECS:
            raise ValueError(f"quant.pergroup_codec={codec}: choose one of {', '.join(PERGROUP_CODECS)}")
        what, other, name = (
            f"quant.compressor=pergroup with quant.pergroup_codec={codec}",
            "quant.pergroup_codec=lzma",
            codec,
        )
    if name not in LEVELS:
        raise ValueError(f"quant.compressor={name}: unknown; choose one of {', '.join([*LEVELS, PERGROUP])}")
    lo, hi = LEVELS[name]
    if not lo <= level <= hi:
        raise ValueError(f"quant.level={level} is out of range for {what}; use {lo}..{hi}")
    module = MODULES.get(name)
    if module and importlib.util.find_spec(module) is None:
        raise ValueError(
            f"{what} needs the '{module}' package, which is not installed: {COMPRESS_EXTRA} (or use {other})"
        )
