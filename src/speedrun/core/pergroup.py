"""The artifact's bytes: which class each tensor is, the byte compressors, and quant.compressor=pergroup's container.

Tensor classes, by state-dict name: what picks a matrix's clip sigma (quant.sigmas), its bits, the group its bytes
are compressed in, and its line in the per-tensor report.

    attn    a linear inside an attention module: ``blocks.<i>.attn.{c_q,c_k,c_v,proj}.weight``
    mlp     a linear inside an MLP module: ``blocks.<i>.mlp.{fc,proj}.weight``
    embed   the token embedding ``tok_emb.weight`` and an untied ``lm_head.weight``
    gate    the small gate tensors: a name containing ``gate`` (``blocks.<i>.attn.attn_gate_w``, ``skip_gates``)
            and the smear gate's ``smear_w``; checked before attn, whose module holds attn_gate_w
    matrix  any other 2-D tensor the export quantizes (a model of one's own may name its linears otherwise)

Compressors: zlib, lzma, brotli and zstd, one library call on the bytes given; where the streaming interface gives
the same bytes as that call (``STREAMS``: zlib at levels 1-9, lzma, brotli at quality 10-11; tested in
tests/quant/test_compression.py) they are fed in chunks, so a compression of minutes prints its progress.

quant.compressor=pergroup: the packed state dict as groups of like tensors, each reordered for its entropy coder and
compressed apart, in parallel threads. One compressor over a serialized state dict sees int8 codes, fp16 scales,
fp32 gains and pickle framing interleaved, and its adaptive models keep relearning which one they are in. Here every
tensor goes to a group of its kind and class:

    q.<class>   int8 codes of quantized matrices, one group per class (attn, mlp, embed, matrix, gate)
    lqer        uint8 codes of LQER factors
    scale       fp16 per-row scales and LQER group minima and steps
    float       float tensors kept as they are (fp16 and fp32: one group per dtype)
    raw         anything else (integer buffers), one group per dtype

and each group is laid out for its coder: multi-byte values are split into byte planes (all first bytes, then all
second bytes: the high bytes of fp16 scales, sign, exponent and top mantissa bits, take few values and compress
apart from their noisy low bytes); int8 codes are stored column by column (each matrix transposed), which compresses
smaller with brotli-11 on matrices whose input columns differ in scale. Each group is cut into chunks of
PERGROUP_CHUNK_BYTES (brotli's default window is 4 MiB, so a chunk that size loses almost no context) and the chunks
are compressed concurrently with quant.pergroup_codec at quant.level; brotli and lzma release the GIL, so threads use
every core.

The blob carries its own header, so it is read without being told the codec:

    b"SRPG" | version (1 byte) | codec (1 byte: 0 lzma, 1 brotli) | header size (4 bytes, little-endian)
    | header: compressed JSON {"groups": [[name, layout, raw bytes, [chunk sizes]]...],
                                "tensors": [[entry, field, dtype, shape, group]...]}
    | the chunks, in header order
"""

from __future__ import annotations

import importlib
import json
import lzma
import math
import os
import struct
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from speedrun.progress import Progress

EMBED_NAMES = ("tok_emb.weight", "lm_head.weight")
"""The embedding class: input and (untied) output embedding tables; also the weights that may be the output head's
(applied with F.linear in GPT.head: speedrun.core.gptq.head_weights)."""
GATE_MARKERS = ("gate", "smear_w")
"""Substrings that make a parameter a gate (quant.gate_bits): the record's quantized gates are its attn_gate_w; the
smear gate's weight is called smear_w here (the record's smear_gate.weight)."""


def is_gate(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return any(marker in leaf for marker in GATE_MARKERS)


def tensor_class(name: str) -> str:
    """attn, mlp, embed, gate or matrix (see the module docstring); the caller decides whether it is quantized."""
    if is_gate(name):
        return "gate"
    if name in EMBED_NAMES:
        return "embed"
    if ".attn." in f".{name}":
        return "attn"
    if ".mlp." in f".{name}":
        return "mlp"
    return "matrix"


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
STREAM_CHUNK_BYTES = 1 << 20
"""Bytes fed to a streaming compressor at a time: a progress tick after each."""


def compress(
    data: bytes,
    compressor: str,
    level: int,
    log: Callable[[str], None] | None = None,
    chunk_bytes: int = STREAM_CHUNK_BYTES,
    progress_every: float = 30.0,
) -> bytes:
    """``data`` compressed: the same bytes as the compressor's one-shot call, with ``log`` a line before, progress
    at most every ``progress_every`` seconds where the compressor streams identically (STREAMS), and one after."""
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
    return COMPRESSORS[compressor][1](blob)


PERGROUP_MAGIC = b"SRPG"
PERGROUP_VERSION = 1
PERGROUP_CODECS = ("lzma", "brotli")
"""Codec ids in the blob (index = id)."""
PERGROUP_CHUNK_BYTES = 4 << 20
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
    jobs = [
        (i, s[o : o + PERGROUP_CHUNK_BYTES])
        for i, s in enumerate(streams)
        for o in range(0, max(len(s), 1), PERGROUP_CHUNK_BYTES)
    ]
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
    blob = (
        PERGROUP_MAGIC
        + bytes([PERGROUP_VERSION, PERGROUP_CODECS.index(codec)])
        + struct.pack("<I", len(head))
        + head
        + b"".join(chunks)
    )
    if log is not None:
        log(f"compressed to {len(blob) / 1e6:,.2f} MB with pergroup {codec}-{level} in {time.perf_counter() - t0:.1f}s")
    group_bytes = {g: sum(sizes[i]) for i, g in enumerate(names)}
    return blob, {**group_bytes, "header": len(head) + len(PERGROUP_MAGIC) + 6}


def unpack(blob: bytes, workers: int | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """The packed state dict of a pergroup blob, in the order it was packed."""
    codec = PERGROUP_CODECS[blob[len(PERGROUP_MAGIC) + 1]]
    (size,) = struct.unpack("<I", blob[len(PERGROUP_MAGIC) + 2 : len(PERGROUP_MAGIC) + 6])
    start = len(PERGROUP_MAGIC) + 6
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
