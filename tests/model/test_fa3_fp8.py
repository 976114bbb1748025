"""fa3 (logic and error paths without the kernel) and fp8 linears (torch._scaled_mm runs on CPU too)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn as nn

from speedrun.core.attention import FA3Attention, KernelUnavailable, get_backend, load_fa3
from speedrun.core.fp8 import FP8Linear, convert_linears
from speedrun.plan import PlanError
from support.devices import fake_device


def _reference_fa3_module():
    """A stand-in with FA3's calling convention: (B, T, H, D) tensors, grouped K/V, returns (out, lse)."""

    def flash_attn_func(q, k, v, causal=True):
        assert causal
        ref = get_backend("math")
        out = ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None).transpose(1, 2)
        return out, None

    return types.SimpleNamespace(flash_attn_func=flash_attn_func)


def test_fa3_layout_and_gqa_match_math():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 32, 16), torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16)
    fa3 = FA3Attention("kernels-community/flash-attn3", version=1, module=_reference_fa3_module())
    assert fa3.kernel == "fa3:kernels-community/flash-attn3@1"
    torch.testing.assert_close(fa3(q, k, v, None), get_backend("math")(q, k, v, None))


def test_fa3_missing_package_says_how_to_prefetch(monkeypatch):
    monkeypatch.setitem(sys.modules, "kernels", None)  # import kernels -> ImportError
    with pytest.raises(KernelUnavailable) as e:
        load_fa3("kernels-community/flash-attn3", version=1)
    msg = str(e.value)
    assert "kernels" in msg and "HF_HUB_OFFLINE=1" in msg and "LOCAL_KERNELS" in msg and "attn=sdpa" in msg


def test_fa3_offline_cache_miss_is_one_clear_error(monkeypatch):
    def get_kernel(repo, **pin):
        raise OSError("cannot reach huggingface.co and no cached files")

    monkeypatch.setitem(sys.modules, "kernels", types.SimpleNamespace(get_kernel=get_kernel))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(KernelUnavailable, match="could not load varunneal/flash-attention-3 .*offline"):
        load_fa3("varunneal/flash-attention-3", revision="abc123")


def test_fa3_needs_exactly_one_pin():
    with pytest.raises(ValueError, match="exactly one"):
        load_fa3("kernels-community/flash-attn3")


@pytest.mark.parametrize(
    "device,overrides,expect",
    [
        ("h100", ["attn=fa3", "precision=bf16"], "fa3:varunneal/flash-attention-3@1"),
        ("h100", ["hardware=a100", "attn=fa3"], "fa3:kernels-community/flash-attn3@1"),
        ("h100", ["attn=fa3", "attn.fa3_revision=v2"], "fa3:varunneal/flash-attention-3@v2"),
        ("h100", ["hardware=t4", "attn=fa3"], "needs compute capability >= sm80"),
        ("b200", ["attn=fa3"], "has no build beyond sm90"),
        ("h100", ["attn=fa3", "precision=fp16"], "runs bf16, fp8 only"),
        ("cpu", ["attn=fa3"], "does not run on cpu"),
    ],
)
def test_fa3_plan(compose, device, overrides, expect):
    from speedrun.config import to_config
    from speedrun.plan import resolve

    cfg = to_config(compose(overrides))
    if expect.startswith("fa3:"):
        assert resolve(cfg, fake_device(device)).attn_kernel == expect
    else:
        with pytest.raises(PlanError, match=expect):
            resolve(cfg, fake_device(device))


@pytest.mark.parametrize(
    "device,overrides,ok",
    [
        ("h100", ["precision=fp8"], True),
        ("h200", ["precision=fp8"], True),
        ("h100", ["hardware=a100", "precision=fp8"], False),
        ("h100", ["hardware=t4", "precision=fp8"], False),
        ("cpu", ["precision=fp8"], False),
    ],
)
def test_fp8_plan(compose, device, overrides, ok):
    from speedrun.config import to_config
    from speedrun.plan import resolve

    cfg = to_config(compose(overrides))
    if ok:
        plan = resolve(cfg, fake_device(device))
        assert (plan.autocast, plan.matmul_dtype, plan.peak_flops) == ("bf16", "fp8", 1979e12)
    else:
        with pytest.raises(PlanError, match="precision="):
            resolve(cfg, fake_device(device))


def test_fp8_linear_matches_bf16_within_fp8_error():
    torch.manual_seed(0)
    ref = nn.Linear(64, 32, bias=False)
    fp8 = FP8Linear(64, 32, bias=False)
    fp8.weight = nn.Parameter(ref.weight.detach().clone())
    x = torch.randn(4, 16, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y_ref, y = ref(x), fp8(x2)
    assert y.shape == y_ref.shape and y.dtype == torch.bfloat16
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    assert rel(y, y_ref) < 0.08  # e4m3 has a 3-bit mantissa: a few percent relative error
    y_ref.square().sum().backward()
    y.float().square().sum().backward()
    assert rel(x2.grad, x.grad) < 0.15 and rel(fp8.weight.grad, ref.weight.grad) < 0.15
    assert fp8.weight.grad.dtype == torch.float32  # fp32 master weights get fp32 grads


def test_fp8_eval_mode_is_the_plain_matmul():
    fp8 = FP8Linear(32, 16, bias=False).eval()
    x = torch.randn(3, 32)
    torch.testing.assert_close(fp8(x), x @ fp8.weight.t())


def test_convert_linears_keeps_parameters_and_keys():
    from speedrun.core.model import GPT, ModelShape

    cfg = ModelShape(
        vocab_size=64,
        n_layer=2,
        d_model=32,
        n_head=2,
        n_kv_head=1,
        mlp_mult=2,
        seq_len=16,
        tie_embeddings=True,
        logit_softcap=30.0,
    )
    model = GPT(cfg, get_backend("math"))
    keys, n_params = list(model.state_dict()), model.num_params()
    weight = model.blocks[0].attn.c_q.weight
    assert convert_linears(model.blocks) == 2 * 6  # q, k, v, proj, fc, mlp proj per block
    assert isinstance(model.blocks[0].attn.c_q, FP8Linear) and model.blocks[0].attn.c_q.weight is weight
    assert list(model.state_dict()) == keys and model.num_params() == n_params
    idx = torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and weight.grad is not None
