"""The byte compressors of the artifact: zlib, lzma, brotli and zstd, one-shot or streamed with progress.

Compression is one library call on the bytes it is given; where the compressor's streaming interface gives the
same bytes as that call (``STREAMS``: zlib at levels 1-9, lzma, brotli at quality 10-11; tested in
tests/quant/test_compression.py) it is fed in chunks, so a compression of minutes prints its progress like the other
phases. quant.compressor=pergroup (speedrun.quant.pergroup) calls these once per tensor group.
"""

from __future__ import annotations

import importlib
import importlib.util
import lzma
import time
import zlib
from collections.abc import Callable
from typing import Any

from speedrun.config.compressors import COMPRESS_EXTRA, MODULES, check_compressor
from speedrun.progress import Progress


def _brotli() -> Any:
    return importlib.import_module("brotli")


def _zstd() -> Any:
    return importlib.import_module("zstandard")


COMPRESSORS: dict[str, tuple[Callable[[bytes, int], bytes], Callable[[bytes], bytes]]] = {
    "zlib": (lambda data, level: zlib.compress(data, level), zlib.decompress),
    "lzma": (lambda data, level: lzma.compress(data, preset=level), lzma.decompress),
    "brotli": (lambda data, level: _brotli().compress(data, quality=level), lambda blob: _brotli().decompress(blob)),
    "zstd": (
        lambda data, level: _zstd().ZstdCompressor(level=level).compress(data),
        lambda blob: _zstd().ZstdDecompressor().decompress(blob),
    ),
}
STREAMS: dict[str, tuple[Callable[[int], Any], Callable[[int], bool]]] = {
    "zlib": (lambda level: zlib.compressobj(level), lambda level: level >= 1),
    "lzma": (lambda level: lzma.LZMACompressor(preset=level), lambda level: True),
    "brotli": (lambda level: _brotli().Compressor(quality=level), lambda level: level >= 10),
}
"""Streaming compressors (make(level), and at which levels its output equals COMPRESSORS' one-shot call byte for
byte). zlib's level 0 cuts its stored blocks where the input chunks end; brotli below quality 10 adapts to how much
input it was handed at once (other bytes with 64 KB chunks at qualities 1-9); zstd's one-shot frame records the
content size a stream does not know. Those compress in one call, with a line before and after."""
CHUNK_BYTES = 1 << 20
"""Bytes fed to a streaming compressor at a time: a progress tick after each."""


def compress(
    data: bytes,
    compressor: str,
    level: int,
    log: Callable[[str], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    progress_every: float = 30.0,
) -> bytes:
    """``data`` compressed: the same bytes as the compressor's one-shot call, with ``log`` a line before, progress
    at most every ``progress_every`` seconds where the compressor streams identically (STREAMS), and one after."""
    check_compressor(compressor, level)
    name = f"{compressor}-{level}"
    if log is not None:
        log(f"compressing {len(data) / 1e6:,.1f} MB with {name} ...")
    t0 = time.perf_counter()
    stream = STREAMS.get(compressor)
    if stream is not None and stream[1](level):
        progress = Progress(f"compress ({name})", log, unit="MB", every=progress_every)
        comp, parts = stream[0](level), []
        feed, finish = (comp.process, comp.finish) if compressor == "brotli" else (comp.compress, comp.flush)
        view = memoryview(data)
        for start in range(0, len(data), chunk_bytes):
            parts.append(feed(view[start : start + chunk_bytes]))
            progress.tick(min(start + chunk_bytes, len(data)) / 1e6, len(data) / 1e6)
        parts.append(finish())
        blob = b"".join(parts)
    else:
        blob = COMPRESSORS[compressor][0](data, level)
    if log is not None:
        log(f"compressed to {len(blob) / 1e6:,.2f} MB with {name} in {time.perf_counter() - t0:.1f}s")
    return blob


def decompress(blob: bytes, compressor: str) -> bytes:
    if compressor not in COMPRESSORS:
        raise ValueError(f"quant.compressor={compressor}: unknown; choose one of {', '.join(COMPRESSORS)}")
    if compressor in MODULES and importlib.util.find_spec(MODULES[compressor]) is None:
        raise ValueError(f"reading a {compressor} artifact needs the '{MODULES[compressor]}' package: {COMPRESS_EXTRA}")
    return COMPRESSORS[compressor][1](blob)
