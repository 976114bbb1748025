"""The optimizer/schedule levers of parameter-golf's April 2026 record stack, each against a
reference formula or an invariant: muon_wd, MuonEq-R, Polar Express, adam_wd/embed_wd, schedule.min_lr and the
weight EMA (closed form, checkpoints); and with every lever off, today's step bit for bit. Their config, plan and
result keys and the EMA in a whole run: tests/training/test_optim_levers_run.py. The record: records/track_10min_16mb/2026-04-29_SmearGateBOSFix_3Seed_1.06141/train_gpt.py in
openai/parameter-golf."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from speedrun.config import EMAConfig, OptimConfig, ScheduleConfig
from speedrun.core.optim import (
    NS_COEFFS,
    POLAR_EXPRESS_COEFFS,
    Muon,
    OptimSettings,
    WeightEMA,
    build_optimizers,
    lr_multiplier,
    muon_update,
    newton_schulz,
    ns_schedule,
    row_normalize,
    set_lr_multiplier,
)
from speedrun.errors import ConfigError
from support.tiny import PGOLF, TINY, tiny_gpt

# The record's _PE_COEFFS, copied by hand from its train_gpt.py (the reference the implementation must match).
RECORD_PE = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]


def _model(tied=False, seed=0):
    return tiny_gpt(replace(TINY, tie_embeddings=tied), seed=seed, noise=0.0)


def _batch():
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 64, (4, 32), generator=g)
    return idx, torch.roll(idx, -1, dims=1)


def _ns_ref(G, coeffs):
    """Newton-Schulz of one matrix, written out: normalise, iterate on the wide orientation."""
    X = G / (G.norm() + 1e-7)
    tall = X.size(0) > X.size(1)
    X = X.T if tall else X
    for a, b, c in coeffs:
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


# -- defaults off: today's step ----------------------------------------------------------------------------------


def _todays_muon_step(params, bufs, lr, momentum):
    """Today's Muon step (before the levers): buckets by shape up to transposition, tall matrices of a mixed
    bucket transposed, one batched quintic NS per bucket, sqrt(rows / cols) scale, p -= lr * u."""
    buckets = {}
    for p in params:
        buckets.setdefault(tuple(sorted(p.shape)), []).append(p)
    for ps in buckets.values():
        tall = [p.size(0) > p.size(1) for p in ps]
        mixed = any(tall) and not all(tall)
        grads = [p.grad.mT if t and mixed else p.grad for p, t in zip(ps, tall)]
        bs = [bufs[id(p)].mT if t and mixed else bufs[id(p)] for p, t in zip(ps, tall)]
        torch._foreach_mul_(bs, momentum)
        torch._foreach_add_(bs, grads)
        g = torch._foreach_add(grads, bs, alpha=momentum)
        X = torch.stack(g)
        X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
        wide_t = X.size(-2) > X.size(-1)
        X = X.mT if wide_t else X
        a, b, c = NS_COEFFS
        for _ in range(5):
            A = X @ X.mT
            X = a * X + (b * A + c * (A @ A)) @ X
        X = X.mT if wide_t else X
        rows, cols = grads[0].shape
        u = list((X * max(1.0, rows / cols) ** 0.5).unbind(0))
        if mixed:
            u = [x.mT * (p.size(0) / p.size(1)) ** 0.5 if t else x for x, p, t in zip(u, ps, tall)]
        torch._foreach_add_(ps, u, alpha=-lr)


def test_defaults_off_equal_todays_step_exactly():
    """The default config builds plain Adam (no decay) and a quintic Muon without row normalisation, and three
    steps are bit for bit a hand-written copy of the step before the levers (Adam: torch's, no weight decay)."""
    cfg = OptimConfig()
    assert (cfg.muon_wd, cfg.muon_row_normalize, str(cfg.ns_coefficients), cfg.adam_wd, cfg.embed_wd) == (
        0.0,
        False,
        "quintic",
        0.0,
        0.0,
    )
    assert ScheduleConfig().min_lr == 0.0 and EMAConfig().decay is None
    model, ref = _model(), _model()
    opts = build_optimizers(model, OptimSettings(**PGOLF))
    assert [type(o) for o in opts] == [torch.optim.Adam, torch.optim.Adam, Muon, torch.optim.Adam]
    groups = ref.param_groups()
    betas = (PGOLF["beta1"], PGOLF["beta2"])
    ref_adams = [
        torch.optim.Adam(groups[k], lr=lr, betas=betas, eps=1e-8, weight_decay=0.0)
        for k, lr in (("embed", 0.6), ("head", 0.008), ("scalar", 0.04))
    ]
    bufs = {id(p): torch.zeros_like(p) for p in groups["matrix"]}
    idx, tgt = _batch()
    for _ in range(3):
        set_lr_multiplier(opts, 0.5)
        model(idx, tgt).backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        ref(idx, tgt).backward()
        for o, base in zip(ref_adams, (0.6, 0.008, 0.04)):
            o.param_groups[0]["lr"] = base * 0.5
            o.step()
        with torch.no_grad():
            _todays_muon_step(groups["matrix"], bufs, 0.04 * 0.5, 0.95)
        ref.zero_grad(set_to_none=True)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name
    # the schedule: min_lr = 0 is today's warm-down, value for value
    s = ScheduleConfig(warmup_frac=0.1, warmdown_frac=0.3)
    for x in [i / 100 for i in range(101)]:
        old = max(x / 0.1, 1e-3) if x < 0.1 else max((1 - x) / 0.3, 0.0) if x > 0.7 else 1.0
        assert lr_multiplier(x, s) == old


# -- muon_wd -----------------------------------------------------------------------------------------------------


def test_muon_wd_is_decoupled_and_scaled_by_the_scheduled_lr():
    """p <- p * (1 - lr * wd) - lr * NS(g + m * buf) * sqrt(max(1, rows / cols)), lr the scheduled one (the
    record's ``p.data.mul_(1.0 - lr * wd)`` then ``p.add_(update, alpha=-lr * scale)``)."""
    torch.manual_seed(0)
    p0 = [torch.randn(24, 16), torch.randn(24, 16)]
    grads = [torch.randn(24, 16), torch.randn(24, 16)]
    params = [torch.nn.Parameter(x.clone()) for x in p0]
    opt = Muon([{"params": params, "base_lr": 0.05}], lr=0.05, momentum=0.9, weight_decay=0.1)
    set_lr_multiplier([opt], 0.5)  # lr = 0.025: the decay follows the schedule
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()
    for p, x, g in zip(params, p0, grads):
        expected = x * (1 - 0.025 * 0.1) - 0.025 * _ns_ref(1.9 * g, [NS_COEFFS] * 5) * (24 / 16) ** 0.5
        torch.testing.assert_close(p.detach(), expected, atol=2e-6, rtol=1e-5)


# -- MuonEq-R ----------------------------------------------------------------------------------------------------


def test_row_normalize_gives_unit_rows_and_keeps_zero_rows():
    torch.manual_seed(0)
    x = torch.randn(3, 8, 12) * torch.rand(3, 8, 1) * 10
    x[1, 2] = 0
    y = row_normalize(x)
    norms = y.norm(dim=-1)
    torch.testing.assert_close(norms[norms > 0], torch.ones_like(norms[norms > 0]))
    assert torch.equal(y[1, 2], torch.zeros(12)) and (norms == 0).sum() == 1
    torch.testing.assert_close(row_normalize(x.mT, dim=-2).mT, y)  # rows of a transposed view


def test_muon_row_normalize_feeds_unit_rows_of_each_weight_to_newton_schulz():
    """The invariant where it sits: what Newton-Schulz receives has every row of every weight (in the weight's own
    (out, in) orientation, also for a tall matrix handed in transposed) at norm 1."""
    torch.manual_seed(0)
    seen = []

    def spy(G, steps=5, dtype=torch.float32):
        seen.append(G.clone())
        return newton_schulz(G, steps=steps, dtype=dtype)

    wide, tall = torch.randn(16, 48) * 3, torch.randn(48, 16) * 0.1
    g = [wide, tall.mT]  # as Muon.step hands a mixed bucket: the tall weight transposed
    muon_update(g, [torch.zeros_like(x) for x in g], momentum=0.9, orthogonalize=spy, row_dims=[-1, -2])
    (G,) = seen
    torch.testing.assert_close(G[0].norm(dim=-1), torch.ones(16))  # the wide weight's 16 rows
    torch.testing.assert_close(G[1].norm(dim=-2), torch.ones(48))  # the tall weight's 48 rows (columns here)


def test_muon_row_normalize_step_matches_the_reference():
    """A mixed bucket (a wide and a tall weight, one Newton-Schulz stack): each update is
    NS(row_normalize(g + m * buf)) * sqrt(max(1, rows / cols)), the record's order."""
    torch.manual_seed(0)
    p0 = [torch.randn(16, 48), torch.randn(48, 16)]
    grads = [torch.randn(16, 48) * torch.rand(16, 1), torch.randn(48, 16) * torch.rand(48, 1)]
    params = [torch.nn.Parameter(x.clone()) for x in p0]
    opt = Muon(params, lr=0.05, momentum=0.9, row_normalize=True)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()
    for p, x, g in zip(params, p0, grads):
        rn = 1.9 * g / (1.9 * g).norm(dim=-1, keepdim=True)
        expected = x - 0.05 * _ns_ref(rn, [NS_COEFFS] * 5) * max(1.0, g.size(0) / g.size(1)) ** 0.5
        torch.testing.assert_close(p.detach(), expected, atol=2e-6, rtol=1e-5)
    plain = [torch.nn.Parameter(x.clone()) for x in p0]
    for p, g in zip(plain, grads):
        p.grad = g.clone()
    Muon(plain, lr=0.05, momentum=0.9).step()
    assert not torch.allclose(plain[0], params[0])  # the lever changes the step


# -- Polar Express -----------------------------------------------------------------------------------------------


def test_polar_express_schedule_is_the_records():
    assert [tuple(c) for c in POLAR_EXPRESS_COEFFS] == RECORD_PE
    assert ns_schedule("polar_express", 5) == tuple(RECORD_PE)
    assert ns_schedule("polar_express", 3) == tuple(RECORD_PE[:3])
    assert ns_schedule("quintic", 4) == (NS_COEFFS,) * 4
    with pytest.raises(ValueError, match="5 iterations"):
        ns_schedule("polar_express", 6)
    with pytest.raises(ConfigError, match="optim.muon_backend_steps=5"):
        OptimConfig(ns_coefficients="polar_express", muon_backend_steps=6)
    # minimax: the 5 composed polynomials map [1e-3, 1] into 1 +- e, touching both ends (equioscillation)
    x = torch.logspace(-3, 0, 20001, dtype=torch.float64)
    for a, b, c in RECORD_PE:
        x = a * x + b * x**3 + c * x**5
    lo, hi = x.min().item(), x.max().item()
    assert hi - 1 < 0.15 and 1 - lo < 0.15 and abs((hi - 1) - (1 - lo)) < 1e-4, (lo, hi)


@pytest.mark.parametrize("shape", [(64, 64), (32, 96), (96, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_polar_express_orthogonalises_at_least_as_well_as_quintic(shape, dtype):
    torch.manual_seed(0)
    G = torch.randn(8, *shape)
    dev = {}
    for name in ("quintic", "polar_express"):
        X = newton_schulz(G, 5, dtype=dtype, coefficients=ns_schedule(name, 5))
        dev[name] = (torch.linalg.svdvals(X.float()) - 1).abs()
    assert dev["polar_express"].mean() < 0.6 * dev["quintic"].mean(), {k: v.mean() for k, v in dev.items()}
    if shape[0] != shape[1]:  # no tiny singular values: every one lands in 1 +- 0.15 (quintic: 0.7..1.2)
        assert dev["polar_express"].max() < 0.16 < dev["quintic"].max()


def test_muon_polar_express_step_and_its_distributed_split():
    """Muon with polar_express uses the schedule (against the written-out reference), and the coefficients reach
    a distributing wrapper that calls orthogonalize(G, steps=, dtype=) as speedrun.distributed.world does."""
    torch.manual_seed(0)
    p0, g = torch.randn(24, 40), torch.randn(24, 40)
    p = torch.nn.Parameter(p0.clone())
    opt = Muon([p], lr=0.05, momentum=0.9, ns_coefficients="polar_express")
    p.grad = g.clone()
    opt.step()
    torch.testing.assert_close(p.detach(), p0 - 0.05 * _ns_ref(1.9 * g, RECORD_PE), atol=2e-6, rtol=1e-5)
    q = torch.nn.Parameter(p0.clone())
    split = Muon([q], lr=0.05, momentum=0.9, ns_coefficients="polar_express")
    split.distribute = lambda f: lambda G, steps=5, dtype=torch.float32: f(G, steps=steps, dtype=dtype)
    q.grad = g.clone()
    split.step()
    assert torch.equal(p, q)


# -- adam_wd / embed_wd ------------------------------------------------------------------------------------------


def test_adam_wd_and_embed_wd_are_adamw_on_their_groups():
    """First step of AdamW: p <- p * (1 - lr * wd) - lr * g / (|g| + eps). embed_wd on the token embedding,
    adam_wd on the untied head and the scalars, none on the matrices (Muon, muon_wd 0)."""
    model = _model(tied=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opts = build_optimizers(model, OptimSettings(**PGOLF, adam_wd=0.1, embed_wd=0.2))
    assert [type(o) for o in opts] == [torch.optim.AdamW, torch.optim.AdamW, Muon, torch.optim.AdamW]
    torch.manual_seed(3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for o in opts:
        o.step()
    groups = model.param_groups()
    names = {id(p): n for n, p in model.named_parameters()}
    for key, lr, wd in (("embed", 0.6, 0.2), ("head", 0.008, 0.1), ("scalar", 0.04, 0.1)):
        for p in groups[key]:
            n = names[id(p)]
            g = grads[n]
            expected = before[n] * (1 - lr * wd) - lr * g / (g.abs() + 1e-8)
            torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=1e-5, msg=n)
    tied = build_optimizers(_model(tied=True), OptimSettings(**PGOLF, adam_wd=0.1, embed_wd=0.2))
    assert tied[0].param_groups[0]["weight_decay"] == 0.2 and tied[-1].param_groups[0]["weight_decay"] == 0.1


# -- min_lr ------------------------------------------------------------------------------------------------------


def test_min_lr_floors_the_warm_down_and_leaves_the_rest():
    floor, zero = (
        ScheduleConfig(warmup_frac=0.1, warmdown_frac=0.4, min_lr=0.1),
        ScheduleConfig(warmup_frac=0.1, warmdown_frac=0.4),
    )
    assert lr_multiplier(1.0, floor) == 0.1 and lr_multiplier(1.0, zero) == 0.0
    for x in [i / 200 for i in range(201)]:
        expected = max((1 - x) / 0.4, 0.1) if x > 0.6 else lr_multiplier(x, zero)  # the record's form
        assert lr_multiplier(x, floor) == expected
        if x <= 0.96:  # until the line reaches the floor (1 - 0.96) / 0.4 = 0.1: unchanged
            assert lr_multiplier(x, floor) == lr_multiplier(x, zero)


# -- EMA ---------------------------------------------------------------------------------------------------------


def test_ema_after_k_steps_is_the_closed_form():
    """ema_k = d^k w_0 + sum_i (1 - d) d^(k - i) w_i; the shadow is fp32 whatever the parameter's dtype."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    model.bias.data = model.bias.data.bfloat16()
    d = 0.9
    ws = [[p.detach().double().clone() for p in model.parameters()]]
    ema = WeightEMA(model, d)
    assert all(s.dtype == torch.float32 for s in ema.shadow)
    for _ in range(7):
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p, dtype=torch.float32))
        ws.append([p.detach().double().clone() for p in model.parameters()])
        ema.update()
    k = len(ws) - 1
    for j, s in enumerate(ema.shadow):
        expected = d**k * ws[0][j] + sum((1 - d) * d ** (k - i) * ws[i][j] for i in range(1, k + 1))
        torch.testing.assert_close(s.double(), expected, atol=1e-6, rtol=1e-5)
    ema.copy_to()
    for p, s in zip(model.parameters(), ema.shadow):
        assert torch.equal(p, s.to(p.dtype))


def test_ema_checkpoint_round_trip(tmp_path):
    """capture -> save_checkpoint -> load_checkpoint (weights_only) -> restore keeps the average; a run with an EMA
    refuses a checkpoint without one."""
    from speedrun.core.train import TrainState
    from speedrun.run.checkpoint import capture, load_checkpoint, restore, save_checkpoint

    model = _model()
    opts = build_optimizers(model, OptimSettings(**PGOLF))
    ema = WeightEMA(model, 0.99)
    idx, tgt = _batch()
    for _ in range(2):
        model(idx, tgt).backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        ema.update()
    state = TrainState(steps=2)
    save_checkpoint(tmp_path, capture(model, opts, None, state, ema=ema), {}, keep=1)
    payload = load_checkpoint(tmp_path)
    fresh = _model(seed=5)
    fresh_ema = WeightEMA(fresh, 0.99)
    restore(payload, fresh, build_optimizers(fresh, OptimSettings(**PGOLF)), None, TrainState(), ema=fresh_ema)
    for a, b in zip(ema.shadow, fresh_ema.shadow):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, p) for a, p in zip(fresh_ema.shadow, fresh.parameters()))  # not the weights
    payload["ema"] = None
    with pytest.raises(ValueError, match="has none"):
        restore(payload, fresh, build_optimizers(fresh, OptimSettings(**PGOLF)), None, TrainState(), ema=fresh_ema)
