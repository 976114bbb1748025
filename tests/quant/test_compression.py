"""quant.compressor=pergroup: the blob round-trips every tensor exactly, carries its own header (codec, groups,
layouts), groups tensors by kind and class, and gives the same bytes whatever the number of threads. And every
compressor fed in chunks (so that a compression of minutes prints its progress) gives its one-shot bytes."""

from __future__ import annotations

import io
import math

import pytest
import torch

from speedrun.core import pergroup
from speedrun.core import quant as Q


def packed_state() -> dict[str, dict[str, torch.Tensor]]:
    """Every kind of field the exports write: int8 codes of several classes, fp16 scales, LQER codes and their
    fp16 minima and steps, fp16 and fp32 floats, bf16, an integer buffer, a scalar, a 1-D gate, an empty tensor."""
    g = torch.Generator().manual_seed(0)

    def codes(*shape):
        return torch.clamp(torch.round(torch.randn(*shape, generator=g) * 3), -31, 31).to(torch.int8)

    return {
        "tok_emb.weight": {"q": codes(64, 32), "scale": torch.rand(64, generator=g).half()},
        "blocks.0.attn.c_q.weight": {"q": codes(32, 32), "scale": torch.rand(32, generator=g).half()},
        "blocks.0.mlp.fc.weight": {
            "q": codes(64, 32),
            "scale": torch.rand(64, generator=g).half(),
            "lqer_a": torch.randint(0, 16, (2, 64), generator=g, dtype=torch.uint8),
            "lqer_a_min": torch.randn(2, 1, generator=g).half(),
            "lqer_a_step": torch.rand(2, 1, generator=g).half(),
            "lqer_b": torch.randint(0, 16, (2, 32), generator=g, dtype=torch.uint8),
            "lqer_b_min": torch.randn(2, 1, generator=g).half(),
            "lqer_b_step": torch.rand(2, 1, generator=g).half(),
        },
        "smear_w": {"q": codes(12), "scale": torch.rand(1, generator=g).half()},
        "blocks.0.attn_scale": {"half": torch.randn(300, generator=g).half()},
        "blocks.0.q_gain": {"raw": torch.randn(4, generator=g)},
        "smear_lambda": {"raw": torch.tensor(0.25)},
        "extra.bf16": {"raw": torch.randn(5, 3, generator=g).bfloat16()},
        "step_count": {"raw": torch.tensor([7, 8, 9], dtype=torch.int64)},
        "empty": {"raw": torch.zeros(0, 4)},
    }


def assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        assert list(a[name]) == list(b[name]), name
        for field in a[name]:
            x, y = a[name][field], b[name][field]
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), (name, field)


@pytest.mark.parametrize("codec", ["lzma", "brotli"])
def test_pergroup_round_trips_exactly(codec, monkeypatch):
    packed = packed_state()
    blob, groups = pergroup.pack(packed, codec, 5)
    assert blob[:4] == b"SRPG" and pergroup.PERGROUP_CODECS[blob[5]] == codec  # the header names its codec
    assert_same(pergroup.unpack(blob), packed)
    assert len(blob) == sum(groups.values())  # every byte is a group's or the header's
    monkeypatch.setattr(pergroup, "PERGROUP_CHUNK_BYTES", 100)  # many chunks per group: still exact
    small_chunks, _ = pergroup.pack(packed, codec, 5)
    assert_same(pergroup.unpack(small_chunks), packed)


def test_groups_by_kind_and_class():
    _, groups = pergroup.pack(packed_state(), "lzma", 1)
    assert set(groups) == {
        "q.embed",
        "q.attn",
        "q.mlp",
        "q.gate",
        "lqer",
        "scale",
        "float.float16",
        "float.float32",
        "float.bfloat16",
        "raw.int64",
        "header",
    }


def test_layouts_are_inverse_and_split_byte_planes():
    t = torch.tensor([0x0102, 0x0304, 0x0506], dtype=torch.int16)
    planes = pergroup._encode([t], "planes")
    assert planes == bytes([0x02, 0x04, 0x06, 0x01, 0x03, 0x05])  # little-endian: low bytes, then high bytes
    m = torch.arange(6, dtype=torch.int8).reshape(2, 3)
    assert pergroup._encode([m], "columns") == bytes([0, 3, 1, 4, 2, 5])
    for layout, tensors in (("planes", [t, t * 3]), ("columns", [m, m.T.contiguous()]), ("bytes", [m])):
        back = pergroup._decode(pergroup._encode(tensors, layout), layout, [(x.dtype, list(x.shape)) for x in tensors])
        assert all(torch.equal(x, y) for x, y in zip(tensors, back))


def test_the_bytes_do_not_depend_on_the_threads():
    packed = packed_state()
    assert pergroup.pack(packed, "brotli", 9, workers=1)[0] == pergroup.pack(packed, "brotli", 9, workers=4)[0]


def test_export_and_load_through_pergroup_give_the_same_weights_as_one_stream():
    packed = packed_state()
    del packed["empty"], packed["step_count"]
    artifact = Q.export_packed(packed, "pergroup", 6, codec="lzma")
    assert artifact.group_bytes["header"] > 0 and artifact.compress_seconds >= 0
    one_stream = Q.dequantize_state_dict(Q.load_packed(Q.export_packed(packed, "lzma", 6).blob, "lzma"))
    restored = Q.dequantize_state_dict(Q.load_packed(artifact.blob, "pergroup"))
    assert list(restored) == list(one_stream)
    assert all(torch.equal(restored[k], one_stream[k]) for k in restored)
    assert restored["smear_w"].shape == (12,)  # a 1-D gate's codes come back in its shape


# ---------------------------------------------------------------------------------------------------------
# compression in chunks, with its progress


def payload() -> bytes:
    """A serialized int6 state dict of about 600 KB: what the compressors see, over several of brotli's blocks."""
    g = torch.Generator().manual_seed(0)
    packed = {
        f"w{i}": {"q": torch.clamp(torch.round(torch.randn(256, 512, generator=g) * 6), -31, 31).to(torch.int8)}
        for i in range(4)
    }
    packed["emb"] = {"half": torch.randn(128, 256, generator=g).half()}
    buf = io.BytesIO()
    torch.save(packed, buf)
    return buf.getvalue()


def test_chunked_compression_gives_the_one_shot_bytes_at_every_level():
    """The artifact's bytes must not change with its progress: at every level, chunks small and odd-sized
    (a multiple of nothing), the streamed output equals the compressor's one-shot call; levels that do not
    stream identically (STREAMS) compress in one call."""
    import importlib.util

    from speedrun.config import quant as compressors

    data = payload()
    streamed = []
    for name, (lo, hi) in compressors.LEVELS.items():
        if name in compressors.MODULES and importlib.util.find_spec(compressors.MODULES[name]) is None:
            continue
        for level in range(lo, hi + 1):
            streams = name in pergroup.STREAMS and pergroup.STREAMS[name][1](level)
            if not streams and level > lo or name == "lzma" and level not in (0, 6, 9):
                continue  # the one-shot call itself / three presets cover lzma's match finders
            one_shot = pergroup.COMPRESSORS[name][0](data, level)
            for chunk in (4099, 1 << 16):
                assert pergroup.compress(data, name, level, chunk_bytes=chunk) == one_shot, (name, level, chunk)
            streamed += [f"{name}-{level}"] if streams else []
    assert {"zlib-1", "zlib-9", "lzma-9", "brotli-11"} <= set(streamed)
    assert (
        pergroup.STREAMS["zlib"][1](0) is False
        and pergroup.STREAMS["brotli"][1](9) is False
        and "zstd" not in pergroup.STREAMS
    )


def test_compression_says_what_it_compresses_and_how_long_it_took():
    data = payload()
    lines: list[str] = []
    blob = pergroup.compress(data, "lzma", 6, log=lines.append, chunk_bytes=1 << 16, progress_every=0)
    assert blob == lzma_one_shot(data, 6)
    mb = len(data) / 1e6
    assert lines[0] == f"compressing {mb:,.1f} MB with lzma-6 ..."
    ticks = lines[1:-1]
    assert len(ticks) == math.ceil(len(data) / (1 << 16)) and ticks[-1].startswith(
        f"compress (lzma-6): {mb:,.1f}/{mb:,.1f} MB (100.0%)"
    )
    assert lines[-1].startswith(f"compressed to {len(blob) / 1e6:,.2f} MB with lzma-6 in ")
    lines.clear()
    pergroup.compress(data, "zlib", 0, log=lines.append, progress_every=0)  # one call: the lines around it only
    assert len(lines) == 2 and lines[0].startswith("compressing") and lines[1].startswith("compressed to")


def lzma_one_shot(data: bytes, preset: int) -> bytes:
    import lzma

    return lzma.compress(data, preset=preset)
