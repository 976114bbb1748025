"""The GPT: shapes, init loss, parameter accounting, param groups, autocast, compile."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from speedrun.core.attention import get_backend
from speedrun.core.model import GPT, ModelShape
from speedrun.plan.model_choice import check_shape
from support.tiny import TINY, tiny_gpt

SHAPE = replace(TINY, n_layer=3)
"""TINY with three layers: the GPT these tests take apart."""


def _model(cfg=SHAPE, attn="sdpa", bos_id=None, seed=0, **attn_opts):
    if attn == "sdpa":
        attn_opts.setdefault("kernel", "math")
    return tiny_gpt(cfg, seed=seed, noise=0.0, attention=get_backend(attn, **attn_opts), bos_id=bos_id)


def _batch(cfg=SHAPE, b=2, t=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    tgt = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    return idx, tgt


@pytest.mark.parametrize("tied", [True, False])
def test_forward_backward_shapes(tied):
    cfg = replace(SHAPE, tie_embeddings=tied)
    model = _model(cfg)
    idx, tgt = _batch()
    logits = model(idx)
    assert logits.shape == (2, 16, cfg.vocab_size) and logits.dtype == torch.float32
    per_tok = model(idx, tgt, reduction="none")
    assert per_tok.shape == (2, 16) and per_tok.dtype == torch.float32
    loss = model(idx, tgt)
    assert loss.shape == () and loss.dtype == torch.float32
    torch.testing.assert_close(per_tok.mean(), loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, name
    assert (model.lm_head is None) == tied


def test_softcap_bounds_logits_and_zero_turns_it_off():
    model = _model(replace(SHAPE, logit_softcap=2.0))
    with torch.no_grad():
        model.tok_emb.weight.mul_(200)  # push raw logits far past the cap
    assert model(_batch()[0]).abs().max() <= 2.0
    assert _model(replace(SHAPE, logit_softcap=0.0))(_batch()[0]).shape[-1] == SHAPE.vocab_size


@pytest.mark.parametrize("tied", [True, False])
def test_init_loss_is_ln_vocab(tied):
    cfg = replace(SHAPE, vocab_size=512, tie_embeddings=tied)
    idx, tgt = _batch(cfg, b=4, t=32)
    loss = _model(cfg)(idx, tgt).item()
    assert abs(loss - math.log(512)) < 0.1, loss


def _preset(name: str) -> ModelShape:
    """A model preset as the real config tree defines it (conf/model/<name>.yaml)."""
    import dataclasses

    from speedrun.plan import load_option

    fields = {f.name for f in dataclasses.fields(ModelShape)}
    return ModelShape(vocab_size=1024, **{k: v for k, v in load_option("model", name).items() if k in fields})


def test_pgolf_baseline_param_count():
    model = _model(_preset("pgolf_baseline"))
    n = model.num_params()
    # 1024*512 embedding + 9 * (786,432 attn + 1,048,576 mlp) matrices = 17,039,360,
    # + per block q_gain 8 + attn_scale 512 + mlp_scale 512 + resid_mix 1024, + skip_weights 4 x 512.
    assert n == 17_039_360 + 9 * (8 + 512 + 512 + 1024) + 4 * 512 == 17_059_912  # parameter-golf's count
    assert round(n / 1e4) / 100 == 17.06


def test_flops_per_token_by_hand():
    d, v, L, T = 32, 64, 3, 32
    per_block = d * d + 2 * (d * 16) + d * d + 2 * (d * 2 * d)  # q, k+v (2 kv heads x 8), proj, fc+proj
    assert per_block == 7168
    assert SHAPE.flops_per_token(T) == 6 * (L * per_block + v * d) + 12 * L * d * T == 178_176
    untied = replace(SHAPE, tie_embeddings=False)
    assert untied.flops_per_token(T) == SHAPE.flops_per_token(T)  # lm_head counted either way
    baseline = _preset("pgolf_baseline")
    assert baseline.flops_per_token(1024) == 6 * (9 * 1_835_008 + 1024 * 512) + 12 * 9 * 512 * 1024


@pytest.mark.parametrize("shape", [SHAPE, replace(SHAPE, tie_embeddings=False, n_kv_head=4, mlp_mult=3)])
def test_shape_counts_the_matmul_weights_the_model_has(shape):
    """ModelShape counts matmul weights from the shape alone (the resolver has no model); the built GPT's Muon
    matrices plus one vocab x d_model head must be exactly that many."""
    model = _model(shape)
    matrices = sum(p.numel() for p in model.param_groups()["matrix"])
    assert shape.matmul_params() == matrices + shape.vocab_size * shape.d_model


@pytest.mark.parametrize("tied", [True, False])
def test_param_groups_partition(tied):
    model = _model(replace(SHAPE, tie_embeddings=tied))
    groups = model.param_groups()
    assert set(groups) == {"matrix", "scalar", "embed", "head"}
    ids = [id(p) for ps in groups.values() for p in ps]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters()}
    assert all(p.ndim == 2 for p in groups["matrix"]) and len(groups["matrix"]) == 6 * SHAPE.n_layer
    assert groups["embed"] == [model.tok_emb.weight]
    assert groups["head"] == ([] if tied else [model.lm_head.weight])
    names = {id(p): n for n, p in model.named_parameters()}
    scalar_names = {names[id(p)].rsplit(".", 1)[-1] for p in groups["scalar"]}
    assert scalar_names == {"attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights"}


def test_zero_init_output_projections():
    model = _model(replace(SHAPE, tie_embeddings=False))
    for blk in model.blocks:
        assert blk.attn.proj.weight.abs().sum() == 0 and blk.mlp.proj.weight.abs().sum() == 0
    assert model.lm_head.weight.abs().sum() == 0


def test_runs_under_bf16_autocast():
    model = _model()
    idx, tgt = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx, tgt)
        per_tok = model(idx, tgt, reduction="none")
    assert loss.dtype == torch.float32 and per_tok.dtype == torch.float32
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert abs(loss.item() - model(idx, tgt).item()) < 0.05


def test_backends_agree_inside_model():
    """Same weights, math vs sdpa(math/flash) backends -> same loss; math with a doc mask differs."""
    idx, tgt = _batch()
    idx[:, 5] = 0
    ref = _model(attn="math")
    with torch.no_grad():
        for p in ref.parameters():  # make the attention path matter: un-zero the projections
            p.add_(0.02 * torch.randn_like(p))
        loss_ref = ref(idx, tgt)
        for opts in ({"kernel": "math"}, {"kernel": "flash"}):
            other = _model(attn="sdpa", **opts)
            other.load_state_dict(ref.state_dict())
            torch.testing.assert_close(other(idx, tgt), loss_ref, atol=1e-5, rtol=1e-5)
        doc = _model(attn="math", bos_id=0)
        doc.load_state_dict(ref.state_dict())
        assert abs(doc(idx, tgt).item() - loss_ref.item()) > 1e-6


def test_shape_checks_refuse_what_cannot_be_built():
    """The resolver's check_shape (the GPT itself checks nothing the Plan has checked)."""
    assert check_shape(SHAPE) is SHAPE
    with pytest.raises(ValueError, match="n_kv_head"):
        check_shape(replace(SHAPE, n_kv_head=3))
    with pytest.raises(ValueError, match="d_model"):
        check_shape(replace(SHAPE, d_model=30))


def test_compiles_without_graph_breaks():
    """fullgraph=True fails on any graph break; aot_eager traces forward and backward without codegen."""
    model = _model()
    idx, tgt = _batch()
    expected = model(idx, tgt)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)
    loss = compiled(idx, tgt)
    loss.backward()
    torch.testing.assert_close(loss, expected)


def test_fused_qkv_trains_like_three_linears_and_eval_calls_the_modules():
    """kernel.fused_qkv: one matmul of the concatenated weights gives the loss and every parameter's gradient of
    three (fp32, CPU: equal up to summation order), and eval mode (GPTQ's hooks, TTT, evaluation) calls c_q, c_k
    and c_v themselves."""
    idx, tgt = _batch()
    separate = _model()
    fused = _model()
    fused.load_state_dict(separate.state_dict())
    for block in fused.blocks:
        block.attn.fused_qkv = True
    with torch.no_grad():  # non-zero output projections, so q/k/v gradients are not trivially zero
        for m in (separate, fused):
            torch.manual_seed(1)
            for block in m.blocks:
                block.attn.proj.weight.normal_(0, 0.1)
                block.mlp.proj.weight.normal_(0, 0.1)
    losses = []
    for m in (separate, fused):
        loss = m(idx, tgt)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    grads = dict(separate.named_parameters())
    for name, p in fused.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)
    calls: list[str] = []
    hooks = [
        getattr(fused.blocks[0].attn, n).register_forward_pre_hook(lambda *_, n=n: calls.append(n))
        for n in ("c_q", "c_k", "c_v")
    ]
    fused(idx, tgt)
    assert calls == []  # training mode: the fused matmul, not the modules
    fused.eval()
    fused(idx, tgt)
    assert calls == ["c_q", "c_k", "c_v"]
    for h in hooks:
        h.remove()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_qkv_compiled_bf16_on_cuda_matches_three_linears():
    """The fused q/k/v matmul as kernel.fused_qkv runs it: compiled, bf16 autocast, cuDNN attention, GQA. Loss and
    gradients agree with the three-linear model within bf16 rounding (different GEMM shapes sum differently): each
    gradient's relative error under 2%, where a wrong split or a missing gradient is off by 100%."""
    cfg = replace(SHAPE, d_model=256, n_head=4, n_kv_head=2, seq_len=128)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (4, 128), generator=g).cuda()
    tgt = torch.randint(0, cfg.vocab_size, (4, 128), generator=g).cuda()
    models = []
    for fused in (False, True):
        torch.manual_seed(0)
        m = GPT(cfg, get_backend("sdpa", kernel="cudnn"), fused_qkv=fused).cuda()
        with torch.no_grad():
            for block in m.blocks:
                block.attn.proj.weight.normal_(0, 0.05, generator=torch.Generator("cuda").manual_seed(1))
        models.append(m)
    models[1].load_state_dict(models[0].state_dict())
    losses = []
    for m in models:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.compile(m)(idx, tgt)
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) < 5e-3, losses
    ref = dict(models[0].named_parameters())
    for name, p in models[1].named_parameters():  # relative error of the whole gradient: robust to tiny entries
        err = (p.grad - ref[name].grad).norm() / ref[name].grad.norm().clamp_min(1e-12)
        assert err < 2e-2, (name, err.item())
