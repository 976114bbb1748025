"""FlashAttention-4 as a peer's FlashAttention-3: parameter-golf's record scripts import FA3's
``flash_attn_interface`` (flash_attn_func, flash_attn_varlen_func), a Hopper build no package index carries. Where
FA4 is installed (the flash-attn-4 package, ``flash_attn.cute``: Hopper and Blackwell kernels of the same
algorithm), the bench writes a ``flash_attn_interface`` module that calls it, and puts its folder first on the
peer's PYTHONPATH: a fairer peer than the FlexAttention stand-in ``--fa3-shim`` otherwise takes. The result file
names which one the peer ran on (speedrun.bench.runner.fa3_stand_in).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from speedrun.records.atomic import atomic_write

MODULE = "flash_attn.cute"
"""FA4's Python interface."""

SHIM = '''"""flash_attn_interface on FlashAttention-4 (flash_attn.cute), written by speedrun.bench for a peer script that
imports FlashAttention-3's module: the same calls, FA4's kernels, the output alone (FA4 returns it with the
softmax's log-sum-exp, FA3 without unless asked)."""

import inspect

from flash_attn.cute import flash_attn_func as _dense, flash_attn_varlen_func as _varlen

_VARLEN = set(inspect.signature(_varlen).parameters)


def _out(result):
    return result[0] if isinstance(result, tuple) else result


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, **kwargs):
    return _out(_dense(q, k, v, softmax_scale=softmax_scale, causal=causal, **kwargs))


def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                           softmax_scale=None, causal=False, **kwargs):
    # FA4 sizes its grid from cu_seqlens; the maxima are passed only where its signature takes them
    sizes = {"max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k}
    kwargs.update({name: value for name, value in sizes.items() if name in _VARLEN})
    return _out(_varlen(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, softmax_scale=softmax_scale,
                        causal=causal, **kwargs))
'''
"""The generated module's source (checked by tests/bench/test_fa4.py against a stand-in flash_attn.cute)."""


def installed() -> str | None:
    """FA4's version where ``flash_attn.cute`` can be imported here (looked up, not imported), else None."""
    try:
        if importlib.util.find_spec(MODULE) is None:
            return None
    except ModuleNotFoundError:  # no flash_attn package at all
        return None
    for dist in ("flash-attn-4", "flash_attn_4", "flash-attn"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def write_shim(folder: Path) -> Path:
    """``folder``/flash_attn_interface.py, the FA3 interface on FA4 (SHIM); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "flash_attn_interface.py", SHIM.encode("utf-8"))
    return folder


def is_shim(path: Path) -> bool:
    """Whether ``path`` is the module write_shim writes (the result file then says FA4, not a stand-in)."""
    try:
        return path.read_text(encoding="utf-8") == SHIM
    except OSError:
        return False
