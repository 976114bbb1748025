"""A request that cannot be met never runs a different kernel."""

from __future__ import annotations

import pytest
import torch

from conftest import fake_device
from speedrun.config import to_config
from speedrun.model.attention import get_backend
from speedrun.plan import resolve


def test_t4_with_gqa_runs_efficient_with_math_disabled(compose, monkeypatch):
    """hardware=t4 + a GQA model resolves to SDPA's efficient kernel; at the call, K/V carry the query head count
    (efficient has no GQA path) and the math kernel is switched off, so SDPA cannot fall back to it."""
    plan = resolve(to_config(compose(["hardware=t4", "model=pgolf_baseline"])), fake_device("h100"))
    assert plan.model.n_head != plan.model.n_kv_head and plan.attn_kernel == "sdpa:efficient"
    backend = get_backend(plan.attn, **{k: v for k, v in plan.attn_options if k != "document_mask"})

    import speedrun.model.attention.sdpa as sdpa_module

    seen = {}

    def spy(q, k, v, **kwargs):
        seen.update(
            k_heads=k.size(1),
            q_heads=q.size(1),
            enable_gqa=kwargs.get("enable_gqa"),
            math=torch.backends.cuda.math_sdp_enabled(),
            flash=torch.backends.cuda.flash_sdp_enabled(),
            efficient=torch.backends.cuda.mem_efficient_sdp_enabled(),
        )
        return q

    monkeypatch.setattr(sdpa_module.F, "scaled_dot_product_attention", spy)
    q, kv = torch.randn(1, 8, 16, 64), torch.randn(1, 4, 16, 64)
    backend(q, kv, kv, None)
    assert seen == {"k_heads": 8, "q_heads": 8, "enable_gqa": False, "math": False, "flash": False, "efficient": True}


@pytest.mark.parametrize("kernel", ["efficient", "cudnn"])
def test_pinning_a_kernel_the_cpu_lacks_raises(kernel):
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(RuntimeError):
        get_backend("sdpa", kernel=kernel)(q, q, q, None)
