"""Muon's Newton-Schulz, the Muon+Adam split on a tiny GPT, and the schedule hooks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from speedrun.core.optim import (
    Muon,
    OptimSettings,
    build_optimizers,
    muon_update,
    newton_schulz,
    set_lr_multiplier,
    set_muon_momentum,
)
from support.tiny import PGOLF, TINY, tiny_gpt


@pytest.mark.parametrize("shape", [(64, 64), (32, 96), (96, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_newton_schulz_singular_values_near_one(shape, dtype):
    torch.manual_seed(0)
    G = torch.randn(*shape)
    X = newton_schulz(G, steps=5, dtype=dtype)
    assert X.shape == G.shape and X.dtype == dtype
    s = torch.linalg.svdvals(X.float())
    # The quintic maps a normalised singular value x to ~3.44 x per step while x is small, so five steps lift
    # only those above ~2e-3 of ||G||_F into the band [~0.7, ~1.2]; a random square matrix has a few below.
    sg = torch.linalg.svdvals(G) / G.norm()
    lifted = s[sg > 2e-3]
    assert len(lifted) >= min(shape) - 2
    assert lifted.min() > 0.6 and s.max() < 1.25, (lifted.min().item(), s.max().item())
    # same singular vectors as G: X is close to U V^T
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    cos = (X.float() * (U @ Vh)).sum() / (X.float().norm() * (U @ Vh).norm())
    assert cos > 0.95


def test_muon_update_momentum_nesterov_and_scale():
    torch.manual_seed(0)
    g = [torch.randn(96, 32), torch.randn(96, 32)]
    bufs = [torch.zeros_like(x) for x in g]
    u = muon_update(g, bufs, momentum=0.9, nesterov=True, steps=5)
    assert u.shape == (2, 96, 32)
    torch.testing.assert_close(bufs, g)  # buf = 0.9 * 0 + g
    for i in range(2):  # batched == one at a time; rows > cols: scaled by sqrt(96 / 32)
        torch.testing.assert_close(u[i], newton_schulz(1.9 * g[i], steps=5) * 3**0.5, atol=1e-5, rtol=1e-5)
    wide = muon_update([g[0].T.contiguous()], [torch.zeros(32, 96)], momentum=0.9, steps=5)
    torch.testing.assert_close(wide[0], newton_schulz(1.9 * g[0].T, steps=5), atol=1e-5, rtol=1e-5)
    u2 = muon_update(g, bufs, momentum=0.9, nesterov=False, steps=5)  # second step: buf = 1.9 g
    torch.testing.assert_close(u2[0], newton_schulz(1.9 * g[0], steps=5) * 3**0.5, atol=1e-5, rtol=1e-5)


def test_muon_rejects_non_matrices():
    with pytest.raises(ValueError, match="2-D"):
        Muon([torch.nn.Parameter(torch.ones(3))])


def _model(tied=True):
    return tiny_gpt(replace(TINY, tie_embeddings=tied), noise=0.0)


@pytest.mark.parametrize("tied", [True, False])
def test_steps_reduce_loss_on_fixed_batch(tied):
    model = _model(tied)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 64, (4, 32), generator=g)
    tgt = torch.roll(idx, -1, dims=1)
    opts = build_optimizers(model, OptimSettings(**PGOLF))
    assert len(opts) == (3 if tied else 4)
    losses = []
    for _ in range(8):
        loss = model(idx, tgt)
        loss.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses


def test_build_optimizers_groups_and_lrs():
    model = _model(tied=False)
    opts = build_optimizers(model, OptimSettings(**PGOLF, muon_wd=0.1))
    embed, head, muon, scalar = opts
    groups = model.param_groups()
    assert isinstance(muon, Muon) and muon.param_groups[0]["params"] == groups["matrix"]
    assert muon.param_groups[0]["weight_decay"] == 0.1 and muon.param_groups[0]["momentum"] == 0.95
    assert embed.param_groups[0]["base_lr"] == 0.6  # untied: embed_lr
    assert head.param_groups[0]["base_lr"] == 0.008
    assert scalar.param_groups[0]["params"] == groups["scalar"]
    assert all(g["betas"] == (0.9, 0.95) and g["eps"] == 1e-8 for o in (embed, head, scalar) for g in o.param_groups)
    tied_opts = build_optimizers(_model(tied=True), OptimSettings(**PGOLF))
    assert tied_opts[0].param_groups[0]["base_lr"] == 0.05  # tied: tied_embed_lr


def test_set_lr_multiplier_and_momentum():
    opts = build_optimizers(_model(tied=False), OptimSettings(**PGOLF))
    set_lr_multiplier(opts, 0.25)
    lrs = [g["lr"] for o in opts for g in o.param_groups]
    assert lrs == pytest.approx([0.6 * 0.25, 0.008 * 0.25, 0.04 * 0.25, 0.04 * 0.25])
    set_lr_multiplier(opts, 1.0)
    assert [g["lr"] for o in opts for g in o.param_groups] == pytest.approx([0.6, 0.008, 0.04, 0.04])
    set_muon_momentum(opts, 0.85)
    assert opts[2].param_groups[0]["momentum"] == 0.85
    assert "momentum" not in opts[0].param_groups[0]


def test_muon_batches_transposed_shapes_with_the_same_result_as_one_at_a_time():
    """(4d, d) and (d, 4d) matrices share one Newton-Schulz stack (the tall one orientated wide); two steps must
    land where each matrix alone lands, momentum buffers included."""
    torch.manual_seed(0)
    shapes = [(96, 32), (32, 96), (96, 32), (64, 64)]
    together = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    alone = [torch.nn.Parameter(p.detach().clone()) for p in together]
    opt = Muon(together, lr=0.05, momentum=0.9)
    singles = [Muon([p], lr=0.05, momentum=0.9) for p in alone]
    for _ in range(2):
        grads = [torch.randn(*s) for s in shapes]
        for p, q, g in zip(together, alone, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        for single in singles:
            single.step()
    for p, q, single in zip(together, alone, singles):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], single.state[q]["momentum_buffer"])


def test_muon_takes_the_scalers_found_inf_without_a_host_sync():
    """GradScaler passes found_inf as an attribute (Muon._step_supports_amp_scaling): 1 leaves parameters and
    momentum untouched (a skipped step, decided on the device), 0 is an ordinary step; grad_scale unscales."""
    torch.manual_seed(0)
    shapes = [(96, 32), (32, 96)]
    params = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, plain = Muon(params, lr=0.05, weight_decay=0.1), Muon(ref, lr=0.05, weight_decay=0.1)
    assert Muon._step_supports_amp_scaling
    g = [torch.randn(*s) for s in shapes]
    for p, q, x in zip(params, ref, g):
        p.grad, q.grad = x.clone(), x.clone()
    plain.step()  # builds momentum in both, so the skipped step has buffers to keep
    opt.step()
    before = [p.detach().clone() for p in params]
    bufs = [opt.state[p]["momentum_buffer"].clone() for p in params]
    for p in params:
        p.grad = torch.full_like(p, float("inf"))
    opt.found_inf, opt.grad_scale = torch.tensor(1.0), None
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert all(torch.equal(opt.state[p]["momentum_buffer"], b) for p, b in zip(params, bufs))
    for p, q, x in zip(params, ref, g):
        p.grad, q.grad = 1024.0 * x, x.clone()
    opt.found_inf, opt.grad_scale = torch.tensor(0.0), torch.tensor(1024.0)
    opt.step()
    plain.step()
    for p, q in zip(params, ref):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
