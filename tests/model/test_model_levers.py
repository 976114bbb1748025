"""The record levers of the built-in GPT (parameter-golf's 2026-04-29 record stack): each against its reference
formula or an invariant, all of them off = today's model bit for bit, the layer loop's switch without recompiles
and its FLOPs, and GPTQ + TTT with every lever on."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from speedrun.config import to_config
from speedrun.core.attention import get_backend
from speedrun.core.model import (
    GPT,
    AttnOutGate,
    LayerLoop,
    ModelShape,
    SmearGate,
    apply_partial_rope,
    apply_rope,
    rope_tables,
    xsa,
)
from speedrun.errors import ConfigError, PlanError
from speedrun.plan import resolve
from speedrun.plan.model_choice import check_shape, model_keys
from support.devices import fake_device
from support.tiny import ALL_ON, BOS, LEVERS_TINY, tiny_gpt


def _model(shape=LEVERS_TINY, seed=0, noise=0.05):
    """A GPT with every weight nudged off its init (zero output projections would hide most of the levers)."""
    return tiny_gpt(shape, seed=seed, noise=noise, doc_bos_id=BOS)


def _batch(shape=LEVERS_TINY, b=2, t=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, shape.vocab_size, (b, t), generator=g)  # no BOS inside
    return idx, torch.randint(0, shape.vocab_size, (b, t), generator=g)


def _todays_forward(m: GPT, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """The GPT before the levers (relu^2, full RoPE, plain skips, one pass per layer), written out from the weights."""
    s = m.shape
    B, T = idx.shape
    H, Hkv, D = s.n_head, s.n_kv_head, s.head_dim
    inv_freq = 1.0 / (s.rope_base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos(), freqs.sin()

    def rope(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)

    def norm(x):
        return F.rms_norm(x, (x.size(-1),))

    ctx = m.attention.prepare(idx, None)

    def attn(a, x):
        q = F.linear(x, a.c_q.weight).view(B, T, H, D).transpose(1, 2)
        k = F.linear(x, a.c_k.weight).view(B, T, Hkv, D).transpose(1, 2)
        v = F.linear(x, a.c_v.weight).view(B, T, Hkv, D).transpose(1, 2)
        q, k = rope(F.rms_norm(q, (D,))), rope(F.rms_norm(k, (D,)))
        y = m.attention(q * a.q_gain[None, :, None, None], k, v, ctx)
        return F.linear(y.transpose(1, 2).reshape(B, T, -1), a.proj.weight)

    def block(b, x, x0):
        x = b.resid_mix[0] * x + b.resid_mix[1] * x0
        x = x + b.attn_scale * attn(b.attn, norm(x))
        return x + b.mlp_scale * F.linear(torch.relu(F.linear(norm(x), b.mlp.fc.weight)).square(), b.mlp.proj.weight)

    x = x0 = norm(m.tok_emb(idx))
    skips, n_enc = [], s.n_layer // 2
    for i in range(n_enc):
        x = block(m.blocks[i], x, x0)
        skips.append(x)
    for i in range(s.n_layer - n_enc):
        if skips:
            x = x + m.skip_weights[i] * skips.pop()
        x = block(m.blocks[n_enc + i], x, x0)
    logits = F.linear(norm(x), m.tok_emb.weight)
    logits = s.logit_softcap * torch.tanh(logits / s.logit_softcap)
    return F.cross_entropy(logits.view(B * T, -1), tgt.reshape(-1))


# ---- all off: today's model -----------------------------------------------------------------------------------


def test_all_levers_off_is_todays_model_bit_for_bit():
    """Defaults: the same parameters (names, shapes, init from the same seed) and the same loss, bit for bit, as the
    model before the levers, written out by hand above; and a loop with num=0 (or not switched on) changes nothing."""
    m = _model()
    expected = {"tok_emb.weight", "skip_weights"} | {
        f"blocks.{i}.{n}"
        for i in range(LEVERS_TINY.n_layer)
        for n in (
            "attn.c_q.weight",
            "attn.c_k.weight",
            "attn.c_v.weight",
            "attn.proj.weight",
            "attn.q_gain",
            "mlp.fc.weight",
            "mlp.proj.weight",
            "attn_scale",
            "mlp_scale",
            "resid_mix",
        )
    }
    assert set(m.state_dict()) == expected and m.skip_weights.shape == (2, 32)
    idx, tgt = _batch()
    loss = m(idx, tgt)
    assert torch.equal(loss, _todays_forward(m, idx, tgt))
    m.set_loop(True)  # no loop configured: a no-op
    assert not m.loop_active and torch.equal(m(idx, tgt), loss)
    zero = _model(replace(LEVERS_TINY, loop=LayerLoop(start=1, end=3, num=0)))
    zero.set_loop(True)
    assert torch.equal(zero(idx, tgt), loss)
    assert LEVERS_TINY.layer_order(True) == LEVERS_TINY.layer_order(False) == ([0, 1], [2, 3, 4])


def test_result_keys_name_every_lever():
    keys = model_keys(LEVERS_TINY)
    assert all(k.startswith("model_") for k in keys)
    assert keys == {
        "model_mlp_act": "relu2",
        "model_mlp_leaky_slope": 0.5,
        "model_rope_dims": None,
        "model_ln_scale": False,
        "model_qk_gain_init": 1.5,
        "model_xsa_last_n": 0,
        "model_skip_gates": False,
        "model_loop_start": 0,
        "model_loop_end": 0,
        "model_loop_num": 0,
        "model_loop_enable_at": 0.0,
        "model_parallel_start_layer": None,
        "model_parallel_final_lane": "mean",
        "model_smear_gate_window": 0,
        "model_attn_out_gate_window": 0,
        "model_attn_out_gate_scale": 1.0,
        "model_attn_out_gate_init_std": 0.0,
    }
    on = model_keys(ALL_ON)
    assert on["model_loop_num"] == 2 and on["model_rope_dims"] == 4 and on["model_attn_out_gate_scale"] == 0.5


# ---- one lever at a time ----------------------------------------------------------------------------------------


def test_leaky_relu2_mlp():
    m = _model(replace(LEVERS_TINY, mlp_act="leaky_relu2", mlp_leaky_slope=0.5))
    mlp = m.blocks[0].mlp
    x = torch.randn(3, 7, 32)
    h = x @ mlp.fc.weight.T
    ref = torch.where(h > 0, h, 0.5 * h).square() @ mlp.proj.weight.T  # the record: leaky_relu(h, 0.5)^2
    torch.testing.assert_close(mlp(x), ref)
    relu = _model()
    relu.load_state_dict(m.state_dict())
    assert not torch.allclose(relu.blocks[0].mlp(x), mlp(x))  # the negative side matters


def test_partial_rope_rotates_the_first_dims_only():
    T, D, rd, base = 12, 8, 4, 10000.0
    cos, sin = rope_tables(T, D, base, rope_dims=rd)
    assert cos.shape == (T, rd // 2)
    # the record's Rotary(rope_dims=4): frequencies over the rotated dims, halves convention within them
    inv = 1.0 / base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd)
    f = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    x = torch.randn(2, 3, T, D)
    x1, x2 = x[..., :2], x[..., 2:4]
    ref = torch.cat((x1 * f.cos() + x2 * f.sin(), x2 * f.cos() - x1 * f.sin(), x[..., rd:]), dim=-1)
    out = apply_partial_rope(x, cos, sin, rd)
    torch.testing.assert_close(out, ref)
    assert torch.equal(out[..., rd:], x[..., rd:])
    # relative positions: q_i . k_j of the same q and k vectors depends on i - j only
    q, k = torch.randn(D).expand(1, 1, T, D), torch.randn(D).expand(1, 1, T, D)
    rq, rk = apply_partial_rope(q, cos, sin, rd)[0, 0], apply_partial_rope(k, cos, sin, rd)[0, 0]
    torch.testing.assert_close(rq[5] @ rk[2], rq[7] @ rk[4])
    # rope_dims = head_dim is full RoPE
    full_cos, full_sin = rope_tables(T, D, base)
    torch.testing.assert_close(apply_partial_rope(x, full_cos, full_sin, D), apply_rope(x, full_cos, full_sin))
    m = _model(replace(LEVERS_TINY, rope_dims=4))
    assert m.rope_cos.shape == (32, 2) and m.blocks[0].attn.rope_dims == 4
    assert torch.isfinite(m(*_batch()))


def test_ln_scale_multiplies_each_norm_by_inverse_sqrt_depth():
    m = _model(replace(LEVERS_TINY, ln_scale=True))
    x = torch.randn(2, 5, 32)
    for i, block in enumerate(m.blocks):
        assert block.ln_scale.item() == pytest.approx(1 / math.sqrt(i + 1))
        torch.testing.assert_close(block.norm(x), F.rms_norm(x, (32,)) / math.sqrt(i + 1))
    assert "blocks.0.ln_scale" not in m.state_dict()  # a constant, not saved
    assert _model().blocks[0].ln_scale is None


def test_qk_gain_init_is_a_field(compose):
    m = GPT(replace(LEVERS_TINY, qk_gain_init=5.0), get_backend("sdpa", kernel="math"))
    assert all(torch.equal(b.attn.q_gain, torch.full((4,), 5.0)) for b in m.blocks)
    plan = resolve(to_config(compose(["model.qk_gain_init=5.0"])), fake_device("cpu"))
    assert plan.model.qk_gain_init == 5.0
    with pytest.raises(ConfigError, match="model.qk_gain_init"):
        check_shape(replace(LEVERS_TINY, qk_norm=False, qk_gain_init=5.0))


def test_xsa_removes_the_component_along_the_value_of_the_heads_kv_group():
    g = torch.Generator().manual_seed(0)
    y, v = torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    out = xsa(y, v)
    v_hat = F.normalize(v, dim=-1).repeat_interleave(2, dim=1)  # query head h reads KV head h // 2
    torch.testing.assert_close((out * v_hat).sum(-1), torch.zeros(2, 4, 6), atol=1e-5, rtol=0)
    torch.testing.assert_close(out, y - (y * v_hat).sum(-1, keepdim=True) * v_hat)
    torch.testing.assert_close(xsa(out, v), out, atol=1e-6, rtol=1e-5)  # a projection: idempotent
    m = _model(replace(LEVERS_TINY, xsa_last_n=2))
    assert [b.attn.use_xsa for b in m.blocks] == [False, False, False, True, True]


def test_skip_gates_lerp_and_their_init():
    """The record's skip: lerp(w * skip, x, sigmoid(g)); g = 0 at init gives 0.5 x + 0.5 w skip (today: x + w skip)."""
    m = _model(replace(LEVERS_TINY, skip_gates=True), noise=0.0)
    x, skip = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
    w = m.skip_weights[1].detach()
    torch.testing.assert_close(m.skip(x, skip, 1), 0.5 * x + 0.5 * w * skip)
    with torch.no_grad():
        m.skip_gates.normal_()
    gate = torch.sigmoid(m.skip_gates[1].detach())
    torch.testing.assert_close(m.skip(x, skip, 1), gate * x + (1 - gate) * w * skip)
    torch.testing.assert_close(_model(noise=0.0).skip(x, skip, 1), x + w * skip)


def test_parallel_lanes_block_formula_and_final_lane():
    shape = replace(LEVERS_TINY, parallel_start_layer=3)
    m = _model(shape)
    b = m.blocks[3]
    assert not hasattr(m.blocks[2], "lane_resid") and b.lane_resid.shape == (2,) and b.lane_post.shape == (2, 2)
    assert torch.equal(GPT(shape, m.attention).blocks[3].lane_resid, torch.full((2,), 1.1))  # the record's init
    x0, lane0, lane1 = torch.randn(3, 2, 16, 32).unbind(0)
    cos, sin = m.rope_cos[:16], m.rope_sin[:16]
    ctx = m.attention.prepare(torch.ones(2, 16, dtype=torch.long), None)
    out0, out1 = b(lane0, x0, cos, sin, ctx, lane1)
    a = b.attn_scale * b.attn(F.rms_norm(b.resid_mix[0] * lane0 + b.resid_mix[1] * x0, (32,)), cos, sin, ctx)
    f = b.mlp_scale * b.mlp(F.rms_norm(lane1, (32,)))
    r, p = b.lane_resid, b.lane_post
    torch.testing.assert_close(out0, r[0] * lane0 + p[0, 0] * a + p[1, 0] * f)
    torch.testing.assert_close(out1, r[1] * lane1 + p[0, 1] * a + p[1, 1] * f)
    idx, tgt = _batch()
    losses = {lane: _model(replace(shape, parallel_final_lane=lane))(idx, tgt) for lane in ("mean", "attn", "mlp")}
    assert len({round(v.item(), 6) for v in losses.values()}) == 3
    with pytest.raises(ConfigError, match="model.parallel_start_layer"):
        check_shape(replace(LEVERS_TINY, parallel_start_layer=1))  # an encoder layer
    with pytest.raises(ConfigError, match="after the looped layers"):
        check_shape(replace(LEVERS_TINY, parallel_start_layer=3, loop=LayerLoop(start=1, end=3, num=1)))


def test_smear_gate_formula_identity_at_init_and_never_across_bos():
    shape = replace(LEVERS_TINY, smear_gate=SmearGate(window=8))
    fresh = GPT(shape, get_backend("sdpa", kernel="math"), doc_bos_id=BOS)
    x = torch.randn(2, 10, 32)
    idx = torch.randint(1, 64, (2, 10))
    idx[0, 4] = idx[1, 7] = BOS
    assert torch.equal(fresh.smear(x, idx), x)  # w = 0, lambda = 0: the identity
    m = _model(shape, noise=0.5)
    out = m.smear(x, idx)
    gate = m.smear_lambda * torch.sigmoid(x[:, 1:, :8] @ m.smear_w)  # the record: lam * sigmoid(W x_t[:window])
    ref = x[:, 1:] + gate.unsqueeze(-1) * x[:, :-1]
    ref[0, 3], ref[1, 6] = x[0, 4], x[1, 7]  # a BOS token takes nothing from the previous document
    torch.testing.assert_close(out, torch.cat((x[:, :1], ref), dim=1))
    assert not torch.allclose(out, x)
    # causal: a later token changes nothing before it
    idx, tgt = _batch()
    changed = idx.clone()
    changed[:, 20:] = (changed[:, 20:] + 5) % 63 + 1
    torch.testing.assert_close(m(idx, tgt, reduction="none")[:, :20], m(changed, tgt, reduction="none")[:, :20])


def test_attn_out_gate_scales_each_heads_output():
    shape = replace(LEVERS_TINY, attn_out_gate=AttnOutGate(window=8, scale=0.5))
    gated, plain = _model(shape), _model()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if "attn_gate_w" not in k})
    a, p = gated.blocks[1].attn, plain.blocks[1].attn
    with torch.no_grad():
        a.proj.weight.copy_(torch.eye(32))
        p.proj.weight.copy_(torch.eye(32))
    x = torch.randn(2, 16, 32)
    cos, sin = gated.rope_cos[:16], gated.rope_sin[:16]
    y = p(x, cos, sin, None).view(2, 16, 4, 8)
    gate = torch.sigmoid(0.5 * x[..., :8] @ a.attn_gate_w.T)  # (B, T, H): sigmoid(scale * W_h . x[:window])
    torch.testing.assert_close(a(x, cos, sin, None), (y * gate[..., None]).view(2, 16, 32))
    zero = GPT(shape, get_backend("sdpa", kernel="math"))
    assert torch.equal(zero.blocks[0].attn.attn_gate_w, torch.zeros(4, 8))  # init_std 0: every gate 0.5


# ---- the layer loop -------------------------------------------------------------------------------------------------


def test_loop_order_is_the_records_and_the_forward_calls_it():
    rec = ModelShape(
        vocab_size=8192, n_layer=11, d_model=512, n_head=8, n_kv_head=4, mlp_mult=4, seq_len=2048,
        loop=LayerLoop(start=3, end=5, num=2, enable_at=0.35), parallel_start_layer=8,
    )  # fmt: skip
    # train_gpt.py's encoder_indices / decoder_indices for NUM_LOOPS=2, LOOP_START=3, LOOP_END=5
    assert rec.layer_order(True) == ([0, 1, 2, 3, 4, 5, 3, 4], [5, 3, 4, 5, 6, 7, 8, 9, 10])
    assert rec.layer_passes(True) == 17 and rec.layer_passes(False) == 11
    m = _model(ALL_ON)
    assert m.skip_weights.shape == (5, 32)  # sized by the looped order (5 encoder calls)
    calls: list[int] = []
    for i, b in enumerate(m.blocks):
        b.register_forward_pre_hook(lambda *_, i=i: calls.append(i))
    idx, tgt = _batch()
    off = m(idx, tgt)
    assert calls == list(range(6))
    calls.clear()
    with m.looped():
        on = m(idx, tgt)
    assert calls == [0, 1, 2, 1, 2, 1, 2, 3, 4, 5] and not m.loop_active
    assert not torch.allclose(on, off)


def test_flops_count_every_layer_call():
    T = 64
    per_block = ALL_ON.block_matmul_params()
    extra = 2 * 2  # num x (end - start + 1)
    assert ALL_ON.flops_per_token(T) == 6 * (6 * per_block + 64 * 32) + 12 * 6 * 32 * T
    assert ALL_ON.flops_per_token(T, looped=True) == 6 * (10 * per_block + 64 * 32) + 12 * 10 * 32 * T
    assert ALL_ON.flops_per_token(T, looped=True) - ALL_ON.flops_per_token(T) == extra * (6 * per_block + 12 * 32 * T)
    assert LEVERS_TINY.flops_per_token(T, looped=True) == LEVERS_TINY.flops_per_token(T)  # no loop


def test_loop_switch_keeps_one_graph_per_state_without_graph_breaks():
    """fullgraph (no graph break) with every lever on; the loop switch picks between two graphs, recompiling
    neither when it flips back and forth."""
    from torch._dynamo.utils import counters

    m = _model(ALL_ON)
    idx, tgt = _batch()
    expected = {False: m(idx, tgt), True: None}
    with m.looped():
        expected[True] = m(idx, tgt)
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="eager", fullgraph=True, dynamic=False)
    before = counters["stats"]["unique_graphs"]
    for state in (False, True, False, True):
        m.set_loop(state)
        torch.testing.assert_close(compiled(idx, tgt), expected[state])
    assert counters["stats"]["unique_graphs"] - before == 2
    m.set_loop(False)


def test_loop_switches_on_in_training_without_recompiling_and_counts_its_flops(compose, tmp_path):
    """Warm-up compiles the (context length, loop state) pairs training runs: 64 ends at 0.25, before the loop
    switches on at 0.5, so it is compiled unlooped only; training switches the loop on at enable_at (by step
    here), records it as a stage entry, compiles nothing new, and charges the looped steps their FLOPs."""
    from speedrun.core.data import TokenStream
    from speedrun.core.train import Stepper, TrainState, flops_per_token, train, warm_up
    from speedrun.data.shards import write_shard
    from speedrun.run.build import build_model
    from speedrun.run.mfu import mfu_keys, stage_tokens, training_flops

    plan = resolve(
        to_config(
            compose(
                [
                    "schedule=progressive",
                    "model=tiny",
                    "model.n_layer=4",
                    "model.d_model=32",
                    "model.loop.start=1",
                    "model.loop.end=2",
                    "model.loop.num=1",
                    "model.loop.enable_at=0.5",
                    "model.smear_gate.window=4",
                    "hardware.micro_batch=2",
                    "budget.tokens_per_step=256",
                    "budget.max_steps=8",
                    "schedule.progress=step",
                    "schedule.seq_len=[64@0.25,128@1.0]",
                ]
            )
        ),
        fake_device("cpu"),
    )
    plan = dataclasses.replace(plan, compile=False)
    torch.manual_seed(0)
    model, _, _, optimizers = build_model(plan, get_backend("sdpa", kernel="math"), bos_id=1)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", dynamic=False)
    seen: list[tuple[tuple[int, ...], bool]] = []

    def forward(x, y):
        seen.append((tuple(x.shape), model.loop_active))
        return compiled(x, y)

    shard = tmp_path / "fineweb_train_000000.bin"
    write_shard(shard, torch.randint(0, 1024, (20_000,), dtype=torch.int32).numpy().astype("uint16"))

    def make_batches(seq_len, micro_batch, position=0):
        stream = TokenStream([shard], seq_len, micro_batch)
        stream.load_state_dict({"position": position})
        return stream

    stepper = Stepper(model, forward, optimizers, plan)
    state = TrainState()
    logs: list[str] = []
    warm_up(stepper, make_batches, state, logs.append)
    assert set(seen) == {((4, 64), False), ((2, 128), False), ((2, 128), True)}
    assert any("x 3 (context length, layer loop) pair(s) training runs (64 loop off, 128 loop off, 128 loop on)" in line
               for line in logs)  # fmt: skip
    assert not model.loop_active
    train(stepper, make_batches, state=state, log=logs.append, on_metrics=lambda _: None)
    assert state.steps == 8 and not state.diverged and state.recompiles == 0
    assert [(s["seq_len"], s["start_step"], s["loop"]) for s in state.stages] == [
        (64, 0, False),
        (128, 2, False),
        (128, 4, True),
    ]
    assert any("layer loop on from step 4" in line for line in logs)
    assert model.loop_active  # evaluation and export run the looped model
    per_stage = stage_tokens(state.stages, state.steps, plan.tokens_per_step, plan.model.seq_len)
    assert per_stage == [(64, 512), (128, 512), (128, 1024, True)]
    assert state.flops == training_flops(plan.model, per_stage)
    assert mfu_keys(plan, state.stages, state.steps, state.train_seconds)["train_flops"] == state.flops
    assert flops_per_token(plan, 128, looped=True) > flops_per_token(plan, 128)


# ---- config, plan, refusals -------------------------------------------------------------------------------------


def test_record_levers_compose_resolve_and_round_trip_through_plan_json(compose):
    overrides = [
        "model=pgolf_11l",
        "model.seq_len=2048",
        "data.vocab_size=8192",
        "model.mlp_act=leaky_relu2",
        "model.rope_dims=16",
        "model.ln_scale=true",
        "model.qk_gain_init=5.0",
        "model.xsa_last_n=11",
        "model.skip_gates=true",
        "model.loop.start=3",
        "model.loop.end=5",
        "model.loop.num=2",
        "model.loop.enable_at=0.35",
        "model.parallel_start_layer=8",
        "model.smear_gate.window=12",
        "model.attn_out_gate.window=12",
    ]
    plan = resolve(to_config(compose(overrides)), fake_device("h100"))
    m = plan.model
    assert (m.mlp_act, m.rope_dims, m.loop, m.smear_gate.window) == ("leaky_relu2", 16, LayerLoop(3, 5, 2, 0.35), 12)
    d = plan.to_dict()["model"]
    assert d["loop"] == {"start": 3, "end": 5, "num": 2, "enable_at": 0.35}
    assert ModelShape(**d) == m
    default = resolve(to_config(compose([])), fake_device("cpu")).model
    assert model_keys(default) == model_keys(LEVERS_TINY)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["model.rope_dims=3"], "model.rope_dims"),
        (["model.rope_dims=64"], "model.rope_dims"),
        (["model.xsa_last_n=9"], "model.xsa_last_n"),
        (["model.loop.num=1", "model.loop.start=2", "model.loop.end=1"], "model.loop.start"),
        (["model.loop.num=1", "model.loop.start=1", "model.loop.end=4"], "model.loop.start"),
        (["model.loop.enable_at=1.0"], "model.loop.enable_at"),
        (["model.smear_gate.window=-1"], "model.smear_gate.window"),
        (["model.attn_out_gate.window=999"], "model.attn_out_gate.window"),
        (["model.attn_out_gate.init_std=-1"], "model.attn_out_gate.init_std"),
        (["model.mlp_leaky_slope=-0.5"], "model.mlp_leaky_slope"),
        (["model.parallel_start_layer=1"], "model.parallel_start_layer"),
    ],
)
def test_lever_refusals_name_the_key(compose, overrides, needle):
    with pytest.raises((ConfigError, PlanError)) as e:
        resolve(to_config(compose(overrides)), fake_device("cpu"))
    assert needle in str(e.value)


@pytest.mark.parametrize(
    ("untils", "loop_on", "enable_at", "pairs"),
    [
        # pgolf_pr2014: 1024 until 0.1, 2048 until 0.7, 3072 to the end; the loop from 0.35
        ((0.1, 0.7, 1.0), True, 0.35, [(0, False), (1, False), (1, True), (2, True)]),
        ((0.1, 0.7, 1.0), True, 0.7, [(0, False), (1, False), (2, True)]),  # switches with the last stage
        ((0.1, 0.7, 1.0), True, 0.0, [(0, True), (1, True), (2, True)]),  # looped from the first step
        ((0.1, 0.7, 1.0), False, 0.0, [(0, False), (1, False), (2, False)]),  # no loop
        ((1.0,), True, 0.35, [(0, False), (0, True)]),  # one length: pgolf_record
    ],
)
def test_trained_shapes_are_the_pairs_the_budget_reaches_and_all_the_projection_reads(
    untils, loop_on, enable_at, pairs
):
    """The (stage, loop) pairs warm-up compiles: those some fraction of the budget reaches, as _Loop.step picks the
    stage and the loop from one fraction, and every pair project_steps reads a step time for (else a KeyError)."""
    from types import SimpleNamespace

    from speedrun.core.train import trained_shapes
    from speedrun.run.run_steps import project_steps

    loop = SimpleNamespace(on=loop_on, enable_at=enable_at)
    settings = SimpleNamespace(stages=[SimpleNamespace(until=u) for u in untils], model=SimpleNamespace(loop=loop))
    assert trained_shapes(settings) == pairs  # type: ignore[arg-type]
    step_seconds = {pair: 0.1 * (1 + pair[0]) * (1.5 if pair[1] else 1.0) for pair in pairs}
    assert project_steps(settings, 100.0, step_seconds).steps > 0  # type: ignore[arg-type]


def test_cuda_graphs_refuse_a_loop_switched_on_mid_run(compose):
    loop = ["model.loop.num=1", "model.loop.start=1", "model.loop.end=2", "kernel.cuda_graphs=true"]
    with pytest.raises(PlanError, match="model.loop.enable_at"):
        resolve(to_config(compose([*loop, "model.loop.enable_at=0.5"])), fake_device("h100"))
    assert resolve(to_config(compose(loop)), fake_device("h100")).kernel.cuda_graphs  # on from the start: fine


# ---- every lever on: train, GPTQ, TTT -----------------------------------------------------------------------------


def test_every_lever_on_trains_quantizes_and_adapts():
    """Two optimizer steps with the loop on, then the int6 GPTQ round trip (the gates and lane weights stay float,
    GPTQ sees exactly the block linears) and score-first TTT on the restored model."""
    from speedrun.core import gptq
    from speedrun.core import quant as Q
    from speedrun.core.data import ByteLUTs
    from speedrun.core.optim import OptimSettings, build_optimizers
    from speedrun.core.ttt_lora import TTTSettings
    from speedrun.core.ttt_score import ttt_evaluate

    m = _model(ALL_ON, noise=0.02)
    groups = m.param_groups()
    names = {id(p): n for n, p in m.named_parameters()}
    assert {id(p) for ps in groups.values() for p in ps} == {id(p) for p in m.parameters()}
    assert all(names[id(p)].endswith(".weight") and ".attn_gate" not in names[id(p)] for p in groups["matrix"])
    scalar = {names[id(p)].rsplit(".", 1)[-1] for p in groups["scalar"]}
    assert {"attn_gate_w", "lane_resid", "lane_post", "skip_gates", "smear_w", "smear_lambda"} <= scalar
    opts = build_optimizers(
        m, OptimSettings(matrix_lr=0.02, scalar_lr=0.02, embed_lr=0.05, tied_embed_lr=0.05, head_lr=0.01)
    )
    m.set_loop(True)
    idx, tgt = _batch(ALL_ON, b=4)
    before = m.smear_lambda.detach().clone()
    losses = []
    for _ in range(2):
        loss = m(idx, tgt)
        loss.backward()
        for opt in opts:
            opt.step()
        m.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and not torch.equal(m.smear_lambda, before)

    batches = [_batch(ALL_ON, b=2, seed=s) for s in range(2)]
    H = gptq.collect_hessians(m, iter(batches), 2, device="cpu")
    assert set(H) == set(gptq.gptq_layers(m)) and len(H) == 6 * ALL_ON.n_layer
    state = m.state_dict()
    settings = Q.QuantSettings(name="int6", bits=6, embed_bits=8, damp=0.01, block_size=8, clip_ratios=(1.0,))
    packed = Q.quantize_int6(state, H, settings)
    for name in ("blocks.0.attn.attn_gate_w", "blocks.5.lane_post", "skip_gates", "smear_w", "smear_lambda"):
        assert "q" not in packed[name], name  # small parameters stay in floating point
    restored = Q.dequantize_state_dict(Q.load_packed(Q.export_packed(packed, "zlib", 9).blob, "zlib"))
    m.load_state_dict({k: restored[k].to(v.dtype) for k, v in state.items()})
    assert m.loop_active and math.isfinite(m(idx, tgt).item())

    vocab = ALL_ON.vocab_size
    base = torch.full((vocab,), 2, dtype=torch.int16)
    base[BOS] = 0
    boundary = torch.zeros(vocab, dtype=torch.bool)
    boundary[BOS] = True
    luts = ByteLUTs(base, torch.arange(vocab) % 3 == 0, boundary)
    g = torch.Generator().manual_seed(0)
    docs = [torch.cat((torch.tensor([BOS]), torch.randint(1, vocab, (n - 1,), generator=g))) for n in (40, 30)]
    tokens = torch.cat(docs)
    settings = TTTSettings(rank=2, lr=0.01, chunk_size=8, targets="all", seed=0)
    res = ttt_evaluate(m, tokens, luts, settings, bos_id=BOS, seq_len=32)
    assert res.complete and math.isfinite(res.val_bpb) and math.isfinite(res.base_val_bpb)
