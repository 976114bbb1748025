"""The adapters' optimizer (speedrun.core.ttt_lora): Adam with beta1 = 0 steps only the slots of a step's rows
and settles the others' weight decay when the batch ends, leaving the adapters as AdamW over every slot does."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speedrun.core import ttt_score as ttt_module
from speedrun.core.ttt_lora import EverySlot, RowSlotsAdam, TTTSettings, adapter_optimizer
from support.tiny import docs_stream
from support.ttt import RecordingGraphs, run, ttt_gpt

LR, WD, BETA2, EPS = 0.05, 1.0, 0.999, 1e-10
ROWS = [6, 6, 4, 4, 4, 3, 2, 2, 2, 2]
"""A batch's rows per step: never growing, as the documents still going are a prefix of the slots."""


def adapters(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(6, 3, 5, generator=g)),
        torch.nn.Parameter(torch.randn(6, 7, 3, generator=g)),
        torch.nn.Parameter(torch.randn(6, 4, generator=g)),  # no gradient at all: neither steps it
    ]


def steps(params, opt, rows_per_step, settle=True):
    g = torch.Generator().manual_seed(1)
    for rows in rows_per_step:
        opt.zero_grad()
        for p in params[:2]:  # gradients only in the rows' slots, as a chunk step leaves them
            grad = torch.zeros_like(p)
            grad[:rows] = torch.randn(p[:rows].shape, generator=g)
            p.grad = grad
        opt.step(rows)
    if settle:
        opt.finish()


def test_stepping_the_rows_slots_leaves_the_adapters_as_adamw_over_every_slot():
    full, rows_only = adapters(), adapters()
    steps(
        full, EverySlot(torch.optim.AdamW(full, lr=LR, betas=(0.0, BETA2), eps=EPS, weight_decay=WD, fused=True)), ROWS
    )
    opt = RowSlotsAdam(rows_only, lr=LR, beta2=BETA2, eps=EPS, weight_decay=WD)
    steps(rows_only, opt, ROWS)
    for a, b in zip(full, rows_only):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    assert torch.equal(rows_only[2], adapters()[2])  # never a gradient: untouched, as by torch


@pytest.mark.gpu
def test_on_cuda_the_rows_slots_steps_match_adamw_over_every_slot():
    """On a GPU: torch's fused AdamW kernel on views of the rows' slots (device step counts), then the settled
    decay, leaves the adapters as AdamW(fused=True) over every slot, to float rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    full = [torch.nn.Parameter(p.detach().cuda()) for p in adapters()]
    rows_only = [torch.nn.Parameter(p.detach().cuda()) for p in adapters()]
    opt = torch.optim.AdamW(full, lr=LR, betas=(0.0, BETA2), eps=EPS, weight_decay=WD, fused=True)
    steps(full, EverySlot(opt), ROWS)
    steps(rows_only, RowSlotsAdam(rows_only, lr=LR, beta2=BETA2, eps=EPS, weight_decay=WD), ROWS)
    for a, b in zip(full, rows_only):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_a_batchs_rows_never_grow():
    """RowSlotsAdam needs it (a slot that came back after being left out would take its pending decay late and read
    a stale moment): batch_steps, on a batch sorted longest first, runs non-increasing rows in every mode."""
    import random

    from speedrun.core.ttt_docs import batch_steps, longest_first

    rng = random.Random(0)
    for mode in ("eager", "compact", "graphs"):
        for _ in range(50):
            docs = [(0, rng.randint(1, 300)) for _ in range(rng.randint(1, 9))]
            ordered = [docs[i] for i in longest_first(docs, 16)]
            rows = [len(table[0]) for _, table, _, _ in batch_steps(ordered, 16, 128, mode, 8)]
            assert rows == sorted(rows, reverse=True), (mode, docs, rows)


def test_the_left_out_slots_decay_is_settled_only_by_finish():
    full, rows_only = adapters(), adapters()
    steps(
        full, EverySlot(torch.optim.AdamW(full, lr=LR, betas=(0.0, BETA2), eps=EPS, weight_decay=WD, fused=True)), ROWS
    )
    opt = RowSlotsAdam(rows_only, lr=LR, beta2=BETA2, eps=EPS, weight_decay=WD)
    steps(rows_only, opt, ROWS, settle=False)
    torch.testing.assert_close(rows_only[0][:2], full[0][:2], rtol=1e-6, atol=1e-7)  # stepped every time
    assert not torch.allclose(rows_only[0][2:], full[0][2:], rtol=1e-3)  # 8 of 10 decays pending on slots 4, 5
    assert opt.missed(0).tolist() == [0, 0, 4, 5, 8, 8] and opt.missed(2).tolist() == [0] * 6
    opt.finish()
    torch.testing.assert_close(rows_only[0], full[0], rtol=1e-6, atol=1e-7)
    assert opt.missed(0).tolist() == [0] * 6  # settled once: a second finish changes nothing


def test_only_adam_without_momentum_steps_the_rows_slots_alone():
    params = adapters()
    s = TTTSettings(rank=3, lr=LR, chunk_size=8, optimizer="adam", beta1=0.0, weight_decay=WD)
    assert isinstance(adapter_optimizer(params, s), RowSlotsAdam)
    for other in (dict(beta1=0.9), dict(optimizer="sgd", momentum=0.9), dict(optimizer="sgd")):
        opt = adapter_optimizer(params, dataclasses.replace(s, **other))
        assert isinstance(opt, EverySlot)  # a moment keeps moving a done document's slot: every slot steps


@pytest.mark.parametrize("mode", ["eager", "graphs"])  # compiled steps shrink rows as graphed ones do, at 30x the cost
def test_ttt_scores_as_with_adamw_over_every_slot(monkeypatch, mode):
    """The records' optimizer (Adam, beta1 0, weight decay) with warm_start_a: batches whose rows shrink as their
    documents end (graphed steps run the documents still going, as compiled ones do; eager ones every slot of the batch,
    a last, smaller batch leaving slots out) score as AdamW over every slot, the A carried to the chain's next
    batch included."""
    monkeypatch.setattr(ttt_module, "GraphedChunkSteps", RecordingGraphs)
    tokens = docs_stream([200, 90, 300, 40, 17, 120, 64, 9, 150, 33], seed=3)
    kw = dict(batch_size=3, warm_start_a=True, warm_start_chains=2, optimizer="adam", beta1=0.0, weight_decay=WD)
    kw.update({"eager": {}, "graphs": dict(cuda_graphs=True)}[mode])
    rows_only = run(ttt_gpt(), tokens, **kw)

    def every_slot(params, s):  # the same fused kernel (CPU has it too): with eps 1e-10, Adam turns another
        # kernel's rounding of a near-zero gradient into a full step of lr, and the scores drift apart by 1e-3
        return EverySlot(
            torch.optim.AdamW(params, lr=s.lr, betas=(0.0, s.beta2), eps=s.eps, weight_decay=WD, fused=True)
        )

    monkeypatch.setattr(ttt_module, "adapter_optimizer", every_slot)
    full = run(ttt_gpt(), tokens, **kw)
    assert rows_only.tokens_scored == full.tokens_scored
    assert rows_only.val_loss == pytest.approx(full.val_loss, rel=1e-8)
    by_chunk = {(c.batch, c.chunk, c.doc): c.nats for c in full.chunks}
    for c in rows_only.chunks:
        assert c.nats == pytest.approx(by_chunk[(c.batch, c.chunk, c.doc)], rel=1e-5, abs=1e-6)
