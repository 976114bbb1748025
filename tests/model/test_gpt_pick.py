"""GPT.forward's ``pick``: the losses (or logits) at some columns of each row, with the last layer call run at those
columns only. The numbers are the whole forward's at those columns, with every record lever on, with document
masks and a sliding window, and TTT's adapters learn the same from them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from speedrun.core.attention import get_backend
from speedrun.core.model import GPT, LayerLoop, ModelShape
from support.tiny import ALL_ON, BOS, LEVERS_TINY, byte_luts, docs_stream

SHAPES = {
    "tiny": LEVERS_TINY,
    "every lever": ALL_ON,
    "lanes, mlp lane out": replace(ALL_ON, parallel_final_lane="mlp"),
    "lanes, attn lane out": replace(ALL_ON, parallel_final_lane="attn"),
    "loop ends the model": replace(LEVERS_TINY, loop=LayerLoop(start=3, end=4, num=1, enable_at=0.5), xsa_last_n=2),
}


def _model(shape: ModelShape, attention=None, bos_id=None, seed=0) -> GPT:
    torch.manual_seed(seed)
    m = GPT(shape, attention or get_backend("sdpa", kernel="math"), bos_id=bos_id, doc_bos_id=BOS)
    with torch.no_grad():  # off the init: zero output projections would hide the last layer's attention and MLP
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    m.set_loop(True)
    return m.eval()


def _inputs(shape: ModelShape, rows=3, width=24, g=5, with_bos=False, seed=1):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, shape.vocab_size, (rows, width), generator=gen)
    if with_bos:
        idx[:, 0] = BOS
        idx[0, 9] = idx[1, 15] = idx[2, 3] = BOS  # documents begin inside the rows too
    tgt = torch.randint(0, shape.vocab_size, (rows, width), generator=gen)
    pick = torch.randint(0, width, (rows, g), generator=gen)  # any columns, in any order, repeats allowed
    pick[0, :3] = torch.tensor([0, width - 1, width - 1])
    return idx, tgt, pick


@pytest.mark.parametrize("name", list(SHAPES))
def test_pick_gives_the_whole_forwards_columns(name):
    shape = SHAPES[name]
    m = _model(shape)
    idx, tgt, pick = _inputs(shape)
    with torch.no_grad():
        whole = m(idx, tgt, reduction="none")
        picked = m(idx, tgt, reduction="none", pick=pick)
        assert picked.shape == pick.shape
        torch.testing.assert_close(picked, whole.gather(1, pick), rtol=1e-5, atol=1e-6)
        logits = m(idx, pick=pick)  # no targets: the logits at the columns
        whole_logits = m(idx)
        torch.testing.assert_close(logits, whole_logits.gather(1, pick[..., None].expand(-1, -1, shape.vocab_size)))
        torch.testing.assert_close(m(idx, tgt, pick=pick), whole.gather(1, pick).mean())


@pytest.mark.parametrize("window", [None, 6])
def test_pick_keeps_the_backends_document_mask_and_window(window):
    """The last call's queries attend with the backend's mask (math: documents and a window), not a plain causal
    one: a document begun inside a row, and keys beyond the window, stay out of reach."""
    shape = replace(ALL_ON, smear_gate=replace(ALL_ON.smear_gate, window=0))
    m = _model(shape, get_backend("math", window=window), bos_id=BOS)
    idx, tgt, pick = _inputs(shape, with_bos=True)
    with torch.no_grad():
        whole = m(idx, tgt, reduction="none")
        torch.testing.assert_close(m(idx, tgt, reduction="none", pick=pick), whole.gather(1, pick))
        plain = _model(shape, get_backend("math"), bos_id=None)  # the same weights, no mask: other numbers
        assert not torch.allclose(plain(idx, tgt, reduction="none").gather(1, pick), whole.gather(1, pick))


def test_the_last_layer_call_runs_at_the_columns_only():
    """What pick saves: the last call's MLP and output projection see G columns, every earlier call all T."""
    m = _model(ALL_ON)
    idx, tgt, pick = _inputs(ALL_ON, width=24, g=5)
    seen: list[tuple[int, int]] = []
    hooks = [
        b.mlp.register_forward_hook(lambda mod, args, out, i=i: seen.append((i, args[0].size(1))))
        for i, b in enumerate(m.blocks)
    ]
    with torch.no_grad():
        m(idx, tgt, reduction="none", pick=pick)
    for h in hooks:
        h.remove()
    encoder, decoder = m.orders[True]
    assert [i for i, _ in seen] == [*encoder, *decoder]
    assert [t for _, t in seen] == [24] * (len(seen) - 1) + [5]


@pytest.mark.parametrize("name,masked", [("every lever", False), ("tiny", False), ("every lever", True)])
def test_adapters_learn_the_same_from_the_picked_columns(name, masked):
    """TTT's LoRA (the records' targets: q, k, v, the bypasses beside attention and the MLP, the head): the gradients
    of a loss at the picked columns are those of the whole forward's columns; ``masked``: over math attention with
    document masks and a window of 6."""
    from speedrun.core.ttt_lora import LoRAModel

    shape = SHAPES[name]
    if masked:
        shape = replace(shape, smear_gate=replace(shape.smear_gate, window=0))
        model = _model(shape, get_backend("math", window=6), bos_id=BOS)
    else:
        model = _model(shape)
    lora = LoRAModel(model, ("q", "k", "v", "attn_bypass", "mlp_bypass", "head"), 4, 3, 0)
    with torch.no_grad():
        for p in lora.parameters():
            p.add_(0.1 * torch.randn_like(p))  # B = 0 would make the adapters' own terms vanish
    idx, tgt, pick = _inputs(shape, with_bos=masked)
    grads = []
    for picked in (False, True):
        for p in lora.parameters():
            p.grad = None
        nats = lora.model(idx, tgt, reduction="none", pick=pick) if picked else lora.model(idx, tgt, "none")
        (nats if picked else nats.gather(1, pick)).sum().backward()
        grads.append([p.grad.clone() for p in lora.parameters()])
    assert any(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def test_ttt_asks_the_model_for_its_chunks_columns(monkeypatch):
    """TTT hands the picked columns to the model itself (so its last layer call runs there; compiled, in either scope,
    test_ttt_score_first's compiled test checks the same); over a backend that does not declare its attention plain
    softmax it takes the columns after the whole forward instead, with the same scores."""
    from speedrun.core.ttt_lora import TTTSettings
    from speedrun.core.ttt_score import ttt_evaluate

    widths: list[int] = []
    columns = GPT._columns
    monkeypatch.setattr(
        GPT, "_columns", lambda self, idx, pick: widths.append(pick.size(1)) or columns(self, idx, pick)
    )
    shape = replace(ALL_ON, seq_len=48)
    settings = TTTSettings(rank=2, lr=0.01, chunk_size=8, batch_size=2, targets="record")
    tokens = docs_stream([60, 21, 13], seed=2)
    res = ttt_evaluate(_model(shape), tokens, byte_luts(), settings, bos_id=BOS, seq_len=48)
    assert res.complete and widths and set(widths) == {8}

    class Other(type(get_backend("sdpa", kernel="math"))):
        plain_softmax = False  # e.g. a backend with attention sinks: the explicit mask would not rebuild it

    other = _model(shape, Other(kernel="math"))
    assert not other.supports_pick
    widths.clear()
    fallback = ttt_evaluate(other, tokens, byte_luts(), settings, bos_id=BOS, seq_len=48)
    assert not widths and fallback.val_loss == pytest.approx(res.val_loss, rel=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_in_bf16_pick_matches_the_flash_kernels_whole_forward():
    """On the GPU the last call's masked attention is another kernel than the backend's (flash) one: in bf16 the
    picked losses stay within bf16's rounding of the whole forward's, with every lever on."""
    shape = replace(ALL_ON, d_model=64, n_head=4, n_kv_head=2, seq_len=256)
    m = _model(shape, get_backend("sdpa", kernel="flash")).cuda()
    idx, tgt, pick = (t.cuda() for t in _inputs(shape, rows=4, width=256, g=48))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        whole = m(idx, tgt, reduction="none").gather(1, pick)
        picked = m(idx, tgt, reduction="none", pick=pick)
    torch.testing.assert_close(picked, whole, rtol=2e-2, atol=2e-2)
    assert (picked - whole).abs().mean() < 5e-3
