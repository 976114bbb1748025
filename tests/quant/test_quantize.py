"""The quant group: GPTQ's round-trip error, Hessians from the batches it is given, compressors, artifact sizes."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from speedrun.config import quant as compressors
from speedrun.config import to_config
from speedrun.core import gptq, pergroup
from speedrun.core import quant as Q
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from support.devices import fake_device
from support.tiny import QUANT_TINY, tiny_gpt


def correlated_inputs(n: int, dim: int, seed: int) -> torch.Tensor:
    """Inputs with strongly correlated features (a random rotation of a spectrum spanning two decades), as
    residual-stream activations are: this is where GPTQ's error feedback pays off over plain rounding."""
    g = torch.Generator().manual_seed(0)  # the same mixing for train and held-out inputs
    mix = torch.linalg.qr(torch.randn(dim, dim, generator=g))[0] * torch.logspace(0, -2, dim).sqrt()
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)) @ mix.T


def naive_round(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-row absmax scale, round to nearest: the baseline GPTQ has to beat."""
    qmax = 2 ** (bits - 1) - 1
    scale = w.abs().amax(dim=1, keepdim=True) / qmax
    return torch.clamp(torch.round(w / scale), -qmax, qmax) * scale


def test_int6_gptq_output_error_beats_naive_rounding_and_is_bounded():
    """The error that matters is the layer's output error ||X (W - W_q)^T|| / ||X W^T||, on held-out inputs from
    the same distribution. GPTQ minimises exactly that and deliberately trades weight error for it, so its
    weight-space error is larger than plain rounding's (checked below, and bounded too)."""
    torch.manual_seed(0)
    w = torch.randn(96, 128) / 128**0.5
    X, X_test = correlated_inputs(4096, 128, seed=1), correlated_inputs(4096, 128, seed=2)
    q, scale = gptq.quantize_gptq_fine(w, X.T @ X / len(X), bits=6, clip_ratios=[1.0, 0.9, 0.8, 0.7])[:2]
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 31 and scale.dtype == torch.float16
    w_gptq = q.float() * scale.float()[:, None]

    def out_err(wq):
        return float((X_test @ (w - wq).T).norm() / (X_test @ w.T).norm())

    solved, naive = out_err(w_gptq), out_err(naive_round(w, 6))
    assert solved <= 0.8 * naive, (solved, naive)  # observed 0.019 vs 0.027
    assert solved <= 0.03  # the stated bound for int6 GPTQ
    assert float((w - w_gptq).norm() / w.norm()) <= 0.05  # weight space: bounded, though above naive's 0.026


def test_clip_search_is_never_worse_than_absmax_and_clips_when_it_pays():
    """At 3 bits the MSE-optimal clip of a Gaussian row is well inside its absmax, so the search must pick it;
    at 6 bits absmax is already close to optimal. Either way the result is never worse than ratio 1.0."""
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    err = lambda q, s: float(((w - q.float() * s.float()[:, None]) ** 2).sum())  # noqa: E731
    ratios = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]
    for bits in (3, 6):
        q1, s1 = gptq.quantize_rtn(w, bits, [1.0])
        qs, ss = gptq.quantize_rtn(w, bits, ratios)
        assert err(qs, ss) <= err(q1, s1)
    q1, s1 = gptq.quantize_rtn(w, 3, [1.0])
    qs, ss = gptq.quantize_rtn(w, 3, ratios)
    assert bool((ss < s1).all()) and err(qs, ss) < 0.7 * err(q1, s1)
    assert torch.equal(gptq.search_scales(w, torch.ones(256), 3, [1.0]), s1)


def test_collect_hessians_is_xtx_over_n_of_the_given_batches():
    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 3)])
            self.other = nn.Linear(4, 4)  # not in blocks: not collected

        def forward(self, x, y):
            return self.blocks[0](self.other(x) * 0 + x).sum()

    batches = [(torch.randn(2, 5, 4), torch.zeros(2, 5)) for _ in range(3)]
    H = gptq.collect_hessians(Toy(), iter(batches), 2, device="cpu")
    assert list(H) == ["blocks.0.weight"]
    X = torch.cat([b[0].reshape(-1, 4) for b in batches[:2]])
    torch.testing.assert_close(H["blocks.0.weight"], X.T @ X / len(X))


def _gpt(seed=0):
    return tiny_gpt(QUANT_TINY, seed=seed)


def test_int6_state_dict_round_trip_through_every_compressor():
    model = _gpt()
    batches = [(torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))) for _ in range(4)]
    H = gptq.collect_hessians(model, iter(batches), 4, device="cpu")
    assert set(H) == {
        f"blocks.{i}.{m}.weight"
        for i in range(2)
        for m in ("attn.c_q", "attn.c_k", "attn.c_v", "attn.proj", "mlp.fc", "mlp.proj")
    }
    state = model.state_dict()
    settings = Q.QuantSettings(name="int6", bits=6, embed_bits=7, damp=0.01, block_size=8, clip_ratios=(1.0, 0.9, 0.8))
    packed = Q.quantize_int6(state, H, settings)
    assert list(packed) == list(state)
    assert all(int(packed[k]["q"].abs().max()) <= 31 for k in H)
    assert int(packed["tok_emb.weight"]["q"].abs().max()) <= 63  # int7 embeddings
    for compressor in ("zlib", "lzma", "brotli", "zstd"):
        if compressor in compressors.MODULES and importlib.util.find_spec(compressors.MODULES[compressor]) is None:
            pytest.skip(f"{compressor} not installed (the compress extra)")
        level = compressors.LEVELS[compressor][1]
        artifact = Q.export_packed(packed, compressor, level)
        restored = Q.dequantize_state_dict(Q.load_packed(artifact.blob, compressor))
        assert set(restored) == set(state)
        for name, t in state.items():
            assert restored[name].shape == t.shape
            rel = float((restored[name].float() - t.float()).norm() / t.float().norm().clamp_min(1e-12))
            assert rel < (0.06 if name in H else 0.03), (name, rel)


@pytest.mark.parametrize("compressor", list(pergroup.COMPRESSORS))
def test_each_compressor_round_trips(compressor):
    if compressor in compressors.MODULES and importlib.util.find_spec(compressors.MODULES[compressor]) is None:
        pytest.skip(f"{compressor} not installed (the compress extra)")
    data = bytes(range(256)) * 50 + b"speedrun" * 100
    lo, hi = compressors.LEVELS[compressor]
    for level in (lo, hi):
        blob = pergroup.compress(data, compressor, level)
        assert pergroup.decompress(blob, compressor) == data
    assert len(pergroup.compress(data, compressor, hi)) < len(data) // 10


def test_missing_compressor_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "brotli" else real(name, *a))
    with pytest.raises(ValueError, match=r"speedrun\[compress\]"):
        compressors.check_compressor("brotli", 11)
    with pytest.raises(ValueError, match="0..9"):
        compressors.check_compressor("zlib", 11)
    with pytest.raises(ValueError, match="choose one of"):
        compressors.check_compressor("gzip", 9)


def test_the_artifact_file_is_its_blob(tmp_path):
    model = _gpt()
    artifact = Q.export_packed(
        Q.quantize_state_dict(model.state_dict()), "zlib", 9
    )  # int8: the spine's export, unchanged
    path = tmp_path / "model.int8.zlib"
    path.write_bytes(artifact.blob)
    assert path.stat().st_size == len(artifact.blob)
    restored = Q.dequantize_state_dict(Q.load_packed(path.read_bytes(), "zlib"))
    assert set(restored) == set(model.state_dict())


def plan_for(compose, device, *overrides):
    return resolve(to_config(compose(list(overrides))), fake_device(device))


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["quant=int6", "quant.bits=9"], "quant.bits=9"),
        (["quant=int6", "quant.clip_ratios=[1.2]"], "clip_ratios"),
        (["quant=int6", "quant.calib_batches=0"], "calib_batches"),
        (["quant=int8", "quant.compressor=zlib", "quant.level=11"], "use 0..9"),
    ],
)
def test_quant_refusals(compose, overrides, needle):
    with pytest.raises(ConfigError) as e:
        plan_for(compose, "cpu", *overrides)
    assert needle in str(e.value)


def test_a_pergroup_codec_the_container_cannot_write_is_refused_at_composition(compose):
    """The core's per-group container writes lzma or brotli only; the config's choice refuses any other."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="quant.pergroup_codec=zstd"):
        compose(["quant=int8", "quant.compressor=pergroup", "quant.pergroup_codec=zstd"])


def test_resolver_names_the_extra_for_a_missing_compressor(compose, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "zstandard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'speedrun\[compress\]'"):
        plan_for(compose, "cpu", "quant=int6", "quant.compressor=zstd")
    plan_for(compose, "cpu", "quant=int6", "quant.compressor=lzma")


# ---- CUDA (device machine) -------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_gptq_matches_cpu_quality():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    w = torch.randn(96, 128) / 128**0.5
    X, X_test = correlated_inputs(4096, 128, seed=1), correlated_inputs(4096, 128, seed=2)
    H = X.T @ X / len(X)
    errs = []
    for device in ("cpu", "cuda"):
        q, scale = gptq.quantize_gptq_fine(w.to(device), H.to(device), bits=6, clip_ratios=[1.0, 0.9, 0.8])[:2]
        wq = q.float().cpu() * scale.float().cpu()[:, None]
        errs.append(float((X_test @ (w - wq).T).norm() / (X_test @ w.T).norm()))
    assert errs[1] <= 0.03 and abs(errs[1] - errs[0]) < 0.1 * errs[0], errs
