"""quant.compressor=pergroup: the packed state dict as groups of like tensors, each reordered for its entropy coder
and compressed apart, in parallel threads.

One compressor over a serialized state dict sees int8 codes, fp16 scales, fp32 gains and pickle framing
interleaved, and its adaptive models keep relearning which one they are in. Here every tensor goes to a group of
its kind and class (speedrun.quant.classes):

    q.<class>   int8 codes of quantized matrices, one group per class (attn, mlp, embed, matrix, gate)
    lqer        uint8 codes of LQER factors
    scale       fp16 per-row scales and LQER group minima and steps
    float       float tensors kept as they are (fp16 and fp32: one group per dtype)
    raw         anything else (integer buffers), one group per dtype

and each group is laid out for its coder: multi-byte values are split into byte planes (all first bytes, then all
second bytes: the high bytes of fp16 scales, sign, exponent and top mantissa bits, take few values and compress
apart from their noisy low bytes); int8 codes are stored column by column (each matrix transposed), which compresses
smaller with brotli-11 on matrices whose input columns differ in scale. Each group is cut into chunks of CHUNK_BYTES
(brotli's default window is 4 MiB, so a chunk that size loses almost no context) and the chunks are compressed
concurrently with quant.pergroup_codec at quant.level; brotli and lzma release the GIL, so threads use every core.

The blob carries its own header, so speedrun.quant.quantize.load_artifact reads it without being told the codec:

    b"SRPG" | version (1 byte) | codec (1 byte: 0 lzma, 1 brotli) | header size (4 bytes, little-endian)
    | header: compressed JSON {"groups": [[name, layout, raw bytes, [chunk sizes]]...],
                                "tensors": [[entry, field, dtype, shape, group]...]}
    | the chunks, in header order
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from speedrun.progress import Progress
from speedrun.quant.classes import tensor_class
from speedrun.quant.compression import COMPRESSORS, decompress

MAGIC = b"SRPG"
VERSION = 1
CODECS = ("lzma", "brotli")
"""Codec ids in the blob (index = id)."""
CHUNK_BYTES = 4 << 20
"""Bytes of a group compressed as one stream (the unit of parallel work)."""
SCALE_FIELDS = ("scale", "lqer_a_min", "lqer_a_step", "lqer_b_min", "lqer_b_step", "awq_scale")


def group_of(entry: str, field: str, tensor: torch.Tensor) -> str:
    """The group of one packed tensor (module docstring)."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    if field == "q":
        return f"q.{tensor_class(entry)}"
    if field in ("lqer_a", "lqer_b"):
        return "lqer"
    if field in SCALE_FIELDS:
        return "scale"
    if tensor.is_floating_point():
        return f"float.{dtype}"
    return f"raw.{dtype}"


def _layout(group: str, itemsize: int) -> str:
    if group.startswith("q."):
        return "columns"
    return "planes" if itemsize > 1 else "bytes"


def _encode(tensors: list[torch.Tensor], layout: str) -> bytes:
    if layout == "columns":  # each matrix column by column; 1-D codes (a gate vector) as they are
        return b"".join(_bytes(t.T.contiguous() if t.ndim == 2 else t) for t in tensors)
    data = b"".join(_bytes(t) for t in tensors)
    if layout == "planes":
        size = tensors[0].element_size()
        data = np.frombuffer(data, dtype=np.uint8).reshape(-1, size).T.tobytes()
    return data


def _decode(data: bytes, layout: str, specs: list[tuple[torch.dtype, list[int]]]) -> list[torch.Tensor]:
    if layout == "planes":
        size = torch.empty((), dtype=specs[0][0]).element_size()
        data = np.frombuffer(data, dtype=np.uint8).reshape(size, -1).T.tobytes()
    out, offset = [], 0
    for dtype, shape in specs:
        stored = [shape[1], shape[0]] if layout == "columns" and len(shape) == 2 else shape
        nbytes = math.prod(stored) * torch.empty((), dtype=dtype).element_size()  # a scalar's shape [] holds 1
        chunk = bytearray(data[offset : offset + nbytes])
        t = torch.frombuffer(chunk, dtype=dtype).reshape(stored) if nbytes else torch.empty(stored, dtype=dtype)
        out.append(t.T.contiguous() if layout == "columns" and len(shape) == 2 else t)
        offset += nbytes
    return out


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def pack(
    packed: dict[str, dict[str, torch.Tensor]],
    codec: str,
    level: int,
    log: Callable[[str], None] | None = None,
    workers: int | None = None,
) -> tuple[bytes, dict[str, int]]:
    """The pergroup blob of a packed state dict, and each group's compressed bytes (its chunks; the header apart,
    as ``header``)."""
    if codec not in CODECS:
        raise ValueError(f"quant.pergroup_codec={codec}: choose one of {', '.join(CODECS)}")
    groups: dict[str, list[tuple[str, str, torch.Tensor]]] = {}
    listing = []  # every tensor in the packed dict's order, with its group: the header's "tensors"
    for entry, fields in packed.items():
        for field, tensor in fields.items():
            group = group_of(entry, field, tensor)
            groups.setdefault(group, []).append((entry, field, tensor))
            listing.append((entry, field, tensor, group))
    names = list(groups)
    layouts = [_layout(g, groups[g][0][2].element_size()) for g in names]
    streams = [_encode([t for _, _, t in groups[g]], layout) for g, layout in zip(names, layouts)]
    jobs = [(i, s[o : o + CHUNK_BYTES]) for i, s in enumerate(streams) for o in range(0, max(len(s), 1), CHUNK_BYTES)]
    total = sum(len(s) for s in streams)
    if log is not None:
        log(f"compressing {total / 1e6:,.1f} MB in {len(names)} groups ({len(jobs)} chunks) with {codec}-{level} ...")
    t0 = time.perf_counter()
    progress = Progress(f"compress (pergroup {codec}-{level})", log, unit="chunks")
    chunks: list[bytes] = []
    compress_one = COMPRESSORS[codec][0]
    with ThreadPoolExecutor(max_workers=workers or min(len(jobs), os.cpu_count() or 1)) as pool:
        for done, chunk in enumerate(pool.map(lambda job: compress_one(job[1], level), jobs), 1):
            chunks.append(chunk)
            progress.tick(done, len(jobs))
    sizes: dict[int, list[int]] = {i: [] for i in range(len(names))}
    for (i, _), chunk in zip(jobs, chunks):
        sizes[i].append(len(chunk))
    header = {
        "groups": [[g, layout, len(s), sizes[i]] for i, (g, layout, s) in enumerate(zip(names, layouts, streams))],
        "tensors": [
            [entry, field, str(t.dtype).removeprefix("torch."), list(t.shape), names.index(group)]
            for entry, field, t, group in listing
        ],
    }
    head = compress_one(json.dumps(header, separators=(",", ":")).encode(), level)
    blob = MAGIC + bytes([VERSION, CODECS.index(codec)]) + struct.pack("<I", len(head)) + head + b"".join(chunks)
    if log is not None:
        log(f"compressed to {len(blob) / 1e6:,.2f} MB with pergroup {codec}-{level} in {time.perf_counter() - t0:.1f}s")
    group_bytes = {g: sum(sizes[i]) for i, g in enumerate(names)}
    return blob, {**group_bytes, "header": len(head) + len(MAGIC) + 6}


def is_pergroup(blob: bytes) -> bool:
    return blob[: len(MAGIC)] == MAGIC


def unpack(blob: bytes, workers: int | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """The packed state dict of a pergroup blob, in the order it was packed."""
    if not is_pergroup(blob) or blob[len(MAGIC)] != VERSION:
        raise ValueError("not a pergroup artifact of this version (quant.compressor=pergroup writes b'SRPG' + 1)")
    codec = CODECS[blob[len(MAGIC) + 1]]
    (size,) = struct.unpack("<I", blob[len(MAGIC) + 2 : len(MAGIC) + 6])
    start = len(MAGIC) + 6
    header: dict[str, Any] = json.loads(decompress(blob[start : start + size], codec))
    offset, spans = start + size, []
    for _, _, _, chunk_sizes in header["groups"]:
        for n in chunk_sizes:
            spans.append(blob[offset : offset + n])
            offset += n
    with ThreadPoolExecutor(max_workers=workers or min(max(len(spans), 1), os.cpu_count() or 1)) as pool:
        raw = list(pool.map(lambda span: decompress(span, codec), spans))
    streams, k = [], 0
    for _, _, _, chunk_sizes in header["groups"]:
        streams.append(b"".join(raw[k : k + len(chunk_sizes)]))
        k += len(chunk_sizes)
    decoded: dict[tuple[str, str], torch.Tensor] = {}
    for i, (_, layout, _, _) in enumerate(header["groups"]):
        members = [t for t in header["tensors"] if t[4] == i]  # in the order they were encoded
        specs = [(getattr(torch, dtype), shape) for _, _, dtype, shape, _ in members]
        for (entry, field, _, _, _), tensor in zip(members, _decode(streams[i], layout, specs)):
            decoded[(entry, field)] = tensor
    out: dict[str, dict[str, torch.Tensor]] = {}
    for entry, field, _, _, _ in header["tensors"]:
        out.setdefault(entry, {})[field] = decoded[(entry, field)]
    return out
