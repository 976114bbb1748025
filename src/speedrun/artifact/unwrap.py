"""Reading a self-extracting train_gpt.py (speedrun.artifact.wrap makes them) without running it: its payload, its
files and meta, its compressor. Apart from wrap, which makes files, so that a re-run (which counts the file that
ran and makes none) carries only this side.
"""

from __future__ import annotations

import ast
import base64
import importlib
import json
import lzma
import re
import zlib
from collections.abc import Callable
from typing import Any


def _brotli_out(blob: bytes) -> bytes:
    return bytes(importlib.import_module("brotli").decompress(blob))


DECODERS: dict[str, Callable[[bytes], bytes]] = {
    "lzma": lambda b: lzma.decompress(b, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}]),
    "brotli": _brotli_out,
    "zlib": lambda b: zlib.decompress(b, -15),
}
"""compressor -> how the file's exec line decodes its payload (speedrun.artifact.wrap.COMPRESSORS)."""


_IMPORT = re.compile(rb"^import (\w+) as C$", re.M)


def compressor_of(data: bytes) -> str:
    """The compressor a self-extracting file decodes its payload with (a base85 file of speedrun's first format:
    lzma)."""
    match = _IMPORT.search(data)
    return match.group(1).decode("ascii") if match else "lzma"


def unwrap_payload(data: bytes) -> str:
    """The payload program of a self-extracting file, decoded as the file decodes it (nothing is run)."""
    line = next((ln for ln in data.split(b"\n") if ln.startswith(b'P="')), None)
    if line is None:
        raise ValueError('not a speedrun self-extracting file: no P="<payload>" line in it')
    name = "lzma" if b"b85decode" in data else compressor_of(data)
    if name not in DECODERS:
        raise ValueError(f"not a speedrun self-extracting file: it imports {name}, no compressor of speedrun's")
    try:
        if b"b85decode" in data:  # the first format: base85 text, lzma
            return DECODERS["lzma"](base64.b85decode(line[3:-1])).decode("utf-8")
        text = ast.literal_eval(line[2:].decode("latin-1"))
        return DECODERS[name](text.encode("latin-1")).decode("utf-8")
    except Exception as e:  # noqa: BLE001 - lzma.LZMAError, zlib.error, brotli.error: a damaged payload, one line
        raise ValueError(f"its {name} payload is damaged ({type(e).__name__}: {e})") from None


def read_wrapper(data: bytes) -> tuple[dict[str, str], dict[str, Any]]:
    """({path: minified source}, meta) of a self-extracting file, read without running it."""
    values: dict[str, Any] = {}
    for node in ast.parse(unwrap_payload(data)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("F", "M"):
                values[node.targets[0].id] = ast.literal_eval(node.value)
    if set(values) != {"F", "M"}:
        raise ValueError("not a speedrun self-extracting file: its payload lacks F (files) or M (meta)")
    return values["F"], json.loads(values["M"])
