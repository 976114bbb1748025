"""Compiled TTT's two scorers (speedrun.core.ttt_scorers.CompiledScorer), the adapted model's and the unadapted
one's, keep their graphs apart: each compiles through an entry of its own, so a recompile of one never checks the
other's guards against its frames."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
import torch

from speedrun.core import ttt_scorers as scorers
from speedrun.core.attention import get_backend
from speedrun.core.model import GPT
from speedrun.core.ttt_lora import LoRAModel, TTTSettings, targets_of
from speedrun.core.ttt_score import ttt_evaluate
from support.tiny import BOS, TTT_TINY, byte_luts, docs_stream


def test_the_unadapted_scorer_compiles_after_the_adapted_one():
    """experiment=pgolf_pr2014's adapters (k, beside each attention and MLP, the head) on a model with skip gates:
    the unadapted scorer's first call comes after the adapted one's graphs exist. Had both compiled Block.forward
    itself, that call would be a recompile of the adapted graphs' code, whose guards name the adapters' bound
    tensors (``...delta.rows``); building its reason, torch raised KeyError: 'delta' (ttt.compile=true failed so
    at its warm-up). Its scores are the eager model's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(replace(TTT_TINY, n_layer=4, skip_gates=True), get_backend("sdpa", kernel="math"))
    lora = LoRAModel(model, targets_of("k,attn_bypass,mlp_bypass,head"), rank=4, slots=2, seed=0)
    adapted, unadapted = scorers.CompiledScorer(lora.model, "eager"), scorers.CompiledScorer(model, "eager")
    x, y = (torch.randint(0, TTT_TINY.vocab_size, (2, 16)) for _ in range(2))
    with torch.no_grad():
        lora.bind_rows(2)
        adapted(x, y)
        lora.bind_rows(None)
        got = unadapted(x, y)
        assert torch.equal(got, scorers.Scorer(model)(x, y))
    # every block of one model runs through one entry, the head through another, each model's its own
    block_entries = {id(block.func) for block in unadapted.regions[0]}
    assert len(block_entries) == 1 and block_entries.isdisjoint({id(b.func) for b in adapted.regions[0]})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_ttt_on_cuda_scores_as_eager_with_the_unadapted_scores():
    """On a GPU, through inductor under bf16 autocast (the weights cast once, so the unadapted scorer runs on a
    copy of the model): pgolf_pr2014's adapters with the unadapted model's scores, compiled TTT against eager."""
    tokens = docs_stream([150, 37, 20, 51, 29, 44, 33, 120], seed=3)
    shape = replace(TTT_TINY, n_layer=4, skip_gates=True, seq_len=96)
    settings = TTTSettings(
        rank=4, lr=0.05, chunk_size=16, batch_size=4, targets="k,attn_bypass,mlp_bypass,head", score_base=True
    )

    def score(compile: str | None):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = GPT(shape, get_backend("sdpa")).cuda()
        s = dataclasses.replace(settings, compile=compile)
        return ttt_evaluate(
            model, tokens, byte_luts(), s, bos_id=BOS, seq_len=shape.seq_len, device="cuda",
            autocast_dtype=torch.bfloat16,
        )  # fmt: skip

    eager, compiled = score(None), score("inductor")
    assert compiled.complete and compiled.tokens_scored == eager.tokens_scored
    assert compiled.val_loss == pytest.approx(eager.val_loss, rel=2e-3)
    assert compiled.base_val_loss == pytest.approx(eager.base_val_loss, rel=2e-3)
