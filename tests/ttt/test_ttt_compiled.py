"""Compiled TTT (ttt.compile) against eager: the same scores, its warm-up off the clock and covering every shape
the run takes, the global phases' shapes included. Apart from tests/ttt/test_ttt_score_first.py, whose settings
it uses, so that the two files' slowest tests can run on different workers."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from speedrun.core import ttt_global as global_phases
from speedrun.core import ttt_score as ttt_module
from speedrun.core import ttt_scorers as scorers
from speedrun.core.attention import get_backend
from speedrun.core.compile import graphs_compiled
from speedrun.core.model import GPT, ModelShape
from speedrun.core.ttt_score import ttt_evaluate
from support.tiny import BOS, TTT_TINY, byte_luts, docs_stream
from support.ttt import CONFIGS, ttt_gpt


# Two cases cover both scopes, the split and the shared A product, each compiled once (~20-35 s a case on a CI
# core): the default path (blocks, no split, an A product per adapter), and the whole model as one graph with
# the split and ttt.shared_attn_a (both scopes trace the attention's hook and the model's pick alike).
@pytest.mark.parametrize("scope,split", [("blocks", None), ("model", 0.3)])
def test_compiled_ttt_scores_like_eager_with_its_warm_up_off_the_clock(scope, split):
    """ttt.compile: the adapted and unadapted forwards through torch.compile (dynamic shapes; aot_eager here, the
    same graph capture as inductor without a C++ toolchain) give eager's scores, after a warm-up on random tokens
    that leaves the adapters as they were; the records' adapters, phases and base scores included, at a step width
    the warm-up did not run, and with the rows of documents already done left out (eager runs them as padding).
    Either scope:
    each block and the head on their own (the default), or the whole model as one graph. With ttt.max_batch_share
    (split): the heavy batches halved alike in both, down to batches of one document, which compiled TTT still runs
    as two rows (a size-1 dimension would compile graphs of its own while the clock runs).
    The warm-up's narrow window (64 tokens, as wide as the model) and its full window (192) share the graphs of
    every variant: the width stays a symbol of its own (no duck shaping), so it is not specialized along with the
    model's width, which would compile every variant again for the other width. The narrow window runs first and
    builds every graph (dynamo's graph count over the warm-up's calls at each width); the full window, with every
    variant the narrow one ran, builds none."""
    import dataclasses

    torch._dynamo.reset()
    # Windows up to 150 tokens at a context of 192: steps 64, 128 and 192 wide (powers of two, capped at the
    # context), the compiled ones on the graphs warmed up at 64 and 192 alone.
    tokens = docs_stream([150, 37, 20, 51, 29, 44, 33, 120], seed=3)
    # d_model 64: the narrow window is as wide as the model (a block's input is rows x 64 x 64). Scope model traces
    # the whole model into one graph, whatever its depth: one block there halves its tracing (~20 s); scope blocks
    # keeps two, each compiled on its own.
    layers = 1 if scope == "model" else TTT_TINY.n_layer
    wide = ModelShape(**{**TTT_TINY.__dict__, "seq_len": 192, "d_model": 64, "n_layer": layers})

    def run(settings):
        torch.manual_seed(0)
        m = GPT(wide, get_backend("sdpa", kernel="math"))
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.05 * torch.randn_like(p))
        res = ttt_evaluate(m, tokens, byte_luts(), settings, bos_id=BOS, seq_len=wide.seq_len, record_chunks=True)
        assert res.complete
        return res

    # with the split, the attention's input adapters share one A product (ttt.shared_attn_a): the hook compiles too
    eager = dataclasses.replace(
        CONFIGS["warm"], score_base=True, chunk_size=16, batch_size=4, max_batch_share=split,
        shared_attn_a=split is not None,
    )  # fmt: skip
    compiled = dataclasses.replace(eager, compile="aot_eager", compile_scope=scope)
    a = run(eager)
    rows_run = []
    call = scorers.CompiledScorer.__call__

    def spy(self, x, y, reduction="none", pick=None):
        rows_run.append(x.size(0))
        return call(self, x, y, reduction, pick)

    # the model is asked for a chunk's columns (GPT.forward's pick): seen from outside the compiled blocks; under
    # scope=model the spy would be traced into the graph (a Python side effect that dynamo guards on)
    picked: list[bool] = []
    columns = GPT._columns
    # the global phases' forwards (run eagerly): each at a shape warmed up before the clock
    warmed: set[tuple[int, int]] = set()
    phase_forwards: list[tuple[int, int]] = []
    warm_up, gather = ttt_module.warm_up_phases, global_phases._gather

    def gather_spy(tokens, rows, seq_len, last, device):
        x, y, valid = gather(tokens, rows, seq_len, last, device)
        phase_forwards.append(tuple(x.shape))
        return x, y, valid

    # the warm-up's scorer calls: (window width, graphs built before the call), in its order
    warm_calls: list[tuple[int, int]] = []
    warming: list[int] = []  # the graph count when the warm-up (ttt._forwards) began and when it ended
    forwards, nats = ttt_module.make_scorers, scorers.autocast_nats

    def forwards_spy(*args, **kw):
        warming.append(graphs_compiled())
        out = forwards(*args, **kw)
        warming.append(graphs_compiled())
        return out

    def nats_spy(model, x, y, *args, **kw):
        if len(warming) == 1:
            warm_calls.append((x.size(1), graphs_compiled()))
        return nats(model, x, y, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scorers.CompiledScorer, "__call__", spy)
        mp.setattr(ttt_module, "make_scorers", forwards_spy)
        mp.setattr(scorers, "autocast_nats", nats_spy)
        mp.setattr(
            ttt_module,
            "warm_up_phases",
            lambda model, shapes, **kw: warmed.update(shapes) or warm_up(model, shapes, **kw),
        )
        mp.setattr(global_phases, "_gather", gather_spy)
        if scope == "blocks":
            mp.setattr(GPT, "_columns", lambda self, idx, pick: picked.append(True) or columns(self, idx, pick))
        b = run(compiled)
    assert bool(picked) == (scope == "blocks") and scorers.CompiledScorer(ttt_gpt(), "aot_eager", scope).picks
    # compiled steps run only the documents still going (at least 2): batches of 4 shrink to 3 and 2 rows
    assert min(rows_run) == 2 and (split is not None or {2, 3, 4} <= set(rows_run))  # split: batches of 1 run 2
    assert a.compile_seconds == 0.0 and b.compile_seconds > 0
    regional = scorers.CompiledScorer(ttt_gpt(), "aot_eager", scope).regions is not None
    assert regional == (scope == "blocks")
    assert b.recompiles == 0  # the warm-up's dynamic graphs cover every width, batch and phase of the run
    widths = [w for w, _ in warm_calls]
    assert widths == sorted(widths) and set(widths) == {64, 192}, widths
    assert Counter(widths)[64] == Counter(widths)[192]  # the same variants at either width
    narrow = next(n for w, n in warm_calls if w == 192) - warming[0]  # built by the calls at 64
    assert narrow > 0 and warming[1] - warming[0] == narrow, (narrow, warming)
    assert b.phases_done == 2 and phase_forwards and set(phase_forwards) == warmed
    assert (b.tokens_scored, b.bytes, b.phases_done) == (a.tokens_scored, a.bytes, a.phases_done)
    assert b.val_loss == pytest.approx(a.val_loss, rel=1e-5) and b.base_val_loss == pytest.approx(
        a.base_val_loss, rel=1e-5
    )
    for x, y in zip(a.chunks, b.chunks):
        assert (x.batch, x.doc, x.chunk, x.tokens) == (y.batch, y.doc, y.chunk, y.tokens)
        assert y.nats == pytest.approx(x.nats, rel=1e-4)
    batch_sizes = Counter(c.batch for c in a.chunks if c.chunk == 0)  # documents per batch
    assert (max(batch_sizes) + 1, min(batch_sizes.values())) == ((2, 4) if split is None else (5, 1))
