"""ttt.cuda_graphs: TTT's steps as device work only (graphs.chunk_step), their shapes predicted before the clock
starts, and (on a GPU) replayed from CUDA graphs with the scores of the steps run directly."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speedrun.config import to_config
from speedrun.core import ttt_lora
from speedrun.core import ttt_score as ttt_module
from speedrun.core import ttt_scorers as scorers
from speedrun.core.attention import get_backend
from speedrun.core.model import GPT
from speedrun.core.ttt_docs import base_windows, pad_rows, row_width, split_documents
from speedrun.core.ttt_graphs import store_rows_grads
from speedrun.core.ttt_scorers import BaseScores
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from support.devices import fake_device
from support.tiny import BOS, TTT_TINY, byte_luts, docs_stream
from support.ttt import RecordingGraphs, run, ttt_gpt


def test_rows_are_padded_to_a_power_of_two_within_the_slots():
    assert [pad_rows(n, 64) for n in (1, 2, 3, 5, 16, 17, 64)] == [2, 2, 4, 8, 16, 32, 64]
    assert pad_rows(40, 48) == 48  # never more rows than adapter slots
    assert pad_rows(1, 1) == 1
    # half octaves (ttt.graph_rows): 3/4 of each power of two as well, never fewer rows than going
    half = [pad_rows(n, 64, half_octaves=True) for n in (1, 2, 3, 4, 5, 6, 7, 12, 13, 17, 24, 25, 48, 49, 64)]
    assert half == [2, 2, 3, 4, 6, 6, 8, 12, 16, 24, 24, 32, 48, 64, 64]
    assert all(n <= pad_rows(n, 64, half_octaves=True) <= pad_rows(n, 64) for n in range(1, 65))


def test_half_octave_widths_add_three_quarters_of_each_power_of_two():
    widths = [row_width(n, 2048, "half_octave") for n in (1, 64, 65, 96, 97, 128, 129, 192, 193, 1536, 1537, 3000)]
    assert widths == [64, 64, 96, 96, 128, 128, 192, 192, 256, 1536, 2048, 2048]
    assert [row_width(n, 2048) for n in (65, 129, 1537)] == [128, 256, 2048]  # the default: powers of two
    assert row_width(700, 1000, "half_octave") == 768 and row_width(900, 1000, "half_octave") == 1000
    for n in range(1, 2049):  # never narrower than the row, never more than 1.5x its padding to 64
        w = row_width(n, 2048, "half_octave")
        assert n <= w <= 2048 and w <= max(64, 2 * n) and w in {64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048}
    # a number: multiples of it, at least one, at most the window
    assert [row_width(n, 2048, "128") for n in (1, 128, 129, 1921, 2047, 3000)] == [128, 128, 256, 2048, 2048, 2048]
    assert row_width(900, 1000, "128") == 1000


@pytest.mark.parametrize(
    "phases,beta1",
    [(0, 0.0), (2, 0.0), (2, 0.9)],  # beta1 0: the rows' slots optimizer steps inside the step; 0.9: every slot after
)
def test_graphed_steps_score_as_the_direct_steps_and_every_shape_is_captured_before_the_clock(
    monkeypatch, phases, beta1
):
    """The graphed path's row padding, its gradients of the rows' slots and its in-step optimizer update change no
    score; every step shape it runs was predicted (no capture while the clock runs), with and without global
    phases."""
    monkeypatch.setattr(ttt_module, "GraphedChunkSteps", RecordingGraphs)
    RecordingGraphs.instances.clear()
    tokens = docs_stream([200, 90, 300, 40, 17, 120, 64, 9], seed=3)
    kw = dict(batch_size=3, warm_start_a=True, short_chunks="64:4", optimizer="adam", beta1=beta1, weight_decay=0.5)
    if phases:
        kw.update(phased=ttt_lora.GlobalSettings(phases=phases, prefix_docs=4, lr=1e-3, chunk_tokens=64))
    direct = run(ttt_gpt(), tokens, **kw)
    graphed = run(ttt_gpt(), tokens, cuda_graphs=True, **kw)
    (graphs,) = RecordingGraphs.instances
    assert (graphs.update is not None) == (beta1 == 0.0)
    assert graphed.cuda_graphs == len(graphs.graphs) > 0 and graphed.cuda_graphs_late == graphs.late == 0
    assert graphs.used == set(graphs.graphs)  # and nothing captured that no step runs
    assert {key[0] for key in graphs.used} <= {2, 3}  # rows: going padded to a power of two, within 3 slots
    assert graphed.tokens_scored == direct.tokens_scored and graphed.bytes == direct.bytes
    assert graphed.val_loss == pytest.approx(direct.val_loss, rel=1e-6)
    assert graphed.base_val_loss == pytest.approx(direct.base_val_loss, rel=1e-6)
    assert graphed.phases_done == phases
    by_doc = {(c.batch, c.chunk, c.doc): c.nats for c in direct.chunks}
    assert len(graphed.chunks) == len(direct.chunks)
    for c in graphed.chunks:
        assert c.nats == pytest.approx(by_doc[(c.batch, c.chunk, c.doc)], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    "seq,chunk,lengths,rows",
    [
        (24, 8, [61, 20, 33, 9, 24, 25], "slots"),  # one width (24): eager's rows, every slot each pass
        (256, 32, [600, 20, 300, 2, 257, 255, 64, 65, 129], "pow2"),  # widths 64 to 256, rows a power of two
        (256, 32, [600, 20, 300, 2, 257, 255, 64, 65, 129], "half_octave"),  # and 96, 192
    ],
)
def test_base_scores_come_from_the_windows_ttt_scores_from(seq, chunk, lengths, rows):
    """base_scores: one window over a document's start for every chunk whose TTT window starts there (causal attention:
    the later tokens change nothing), its own window for a later chunk of a longer document, scored only when that
    chunk is asked for; each chunk's nats as the unadapted model scores it from TTT's own window."""
    torch.manual_seed(0)
    m = GPT(dataclasses.replace(TTT_TINY, seq_len=seq), get_backend("sdpa", kernel="math"))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tokens = docs_stream(lengths, seed=5)
    docs = split_documents(tokens, BOS)
    at_start, later = base_windows(docs, chunk, seq)
    windows = at_start + [w for ws in later.values() for w in ws]
    assert sum(len(w[3]) for w in windows) == sum(-(-n // chunk) for _, n in docs)  # every chunk exactly once
    assert len(at_start) == len(docs) and all(w[1] == start for w, (start, _) in zip(at_start, docs))
    assert all(
        docs[w[0]][1] > seq and w[2] == seq and [c[0] for c in w[3]] == [k] for k, ws in later.items() for w in ws
    )
    passes: list[tuple[int, int]] = []
    picked: list[int] = []

    def counted(fn, x, y, pick):
        passes.append(tuple(x.shape))
        if pick is not None:  # a later window: its one chunk's columns
            picked.append(pick.size(1))
        return scorers.Scorer(fn)(x, y, pick=pick)

    slots = 3
    rows_for = (lambda n: slots) if rows == "slots" else (lambda n: pad_rows(n, slots))
    half = rows == "half_octave"
    with torch.no_grad():
        scores = BaseScores(
            m, counted, tokens, docs, chunk, seq, slots, rows_for, widths="half_octave" if half else "pow2"
        )
        assert later and not scores.table[:, min(later) :].any()  # later windows: not scored until asked for
        table = torch.stack([scores.chunk(k) for k in range(scores.most)], dim=1)
        assert not scores.later
        assert all(r == slots for r, _ in passes) if rows == "slots" else all(r in (2, 3) for r, _ in passes)
        assert any(w in (96, 192) for _, w in passes) == half
        assert set(picked) == {chunk}  # the later windows' head ran at their chunk's columns only
        for d, (start, n) in enumerate(docs):
            for k in range(-(-n // chunk)):
                hi = min((k + 1) * chunk, n)
                lo = max(0, hi - seq)
                x, y = tokens[start + lo : start + hi][None], tokens[start + lo + 1 : start + hi + 1][None]
                want = m(x, y, reduction="none")[0, k * chunk - lo :].double().sum()
                assert float(table[d, k]) == pytest.approx(float(want), rel=1e-5), (d, k)
            assert not table[d, -(-n // chunk) :].any()  # no chunk there: nothing counted


def test_other_paddings_change_no_score(monkeypatch):
    """ttt.row_widths=half_octave or 128 pads the steps and the base passes less (96, 192, 384, ...), and
    ttt.graph_rows=half_octave the graphed rows (3, 6, ...), with the scores of the powers of two: padding sits
    after a row's real tokens (attention is causal) or in rows of no document (no loss, no gradient)."""
    monkeypatch.setattr(ttt_module, "GraphedChunkSteps", RecordingGraphs)
    torch.manual_seed(0)
    m = GPT(dataclasses.replace(TTT_TINY, seq_len=256), get_backend("sdpa", kernel="math"))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # two batches of 8: the short documents with a 90 and a 100; then five of 100-300 tokens (4-10 chunks of 32),
    # 5 going (rows 8, or 6 in half octaves), then 3 (rows 4, or 3)
    tokens = docs_stream([300, 100, 100, 100, 20, 20, 20, 20, 20, 150, 180, 90, 17], seed=4)
    kw = dict(seq_len=256, chunk_size=32, batch_size=8, optimizer="adam", beta1=0.0)
    runs, used = {}, {}
    for padding in (("pow2", "pow2"), ("half_octave", "pow2"), ("128", "pow2"), ("pow2", "half_octave")):
        RecordingGraphs.instances.clear()
        runs[padding] = run(m, tokens, cuda_graphs=True, row_widths=padding[0], graph_rows=padding[1], **kw)
        (graphs,) = RecordingGraphs.instances
        used[padding] = graphs.used
        assert runs[padding].cuda_graphs_late == 0
    widths, rows = ({k: {key[i] for key in u} for k, u in used.items()} for i in (1, 0))
    assert widths[("pow2", "pow2")] == widths[("pow2", "half_octave")] == {64, 128, 256}
    assert {96, 192} <= widths[("half_octave", "pow2")] and widths[("128", "pow2")] == {128, 256}
    assert rows[("pow2", "pow2")] == {2, 4, 8} and rows[("pow2", "half_octave")] == {2, 3, 6, 8}
    base = runs[("pow2", "pow2")]
    for other in runs.values():
        assert other.tokens_scored == base.tokens_scored
        assert other.val_loss == pytest.approx(base.val_loss, rel=1e-5)
        assert other.base_val_loss == pytest.approx(base.base_val_loss, rel=1e-5)


def test_paddings_the_steps_cannot_run_are_refused_by_the_config(compose):
    """TTT's core takes ttt.row_widths and ttt.graph_rows as the config checked them."""
    with pytest.raises(ConfigError, match="ttt.row_widths='pow3' is not one of"):
        to_config(compose(["ttt=lora", "ttt.row_widths=pow3"]))
    with pytest.raises(ConfigError, match="ttt.graph_rows='3' is not one of"):
        to_config(compose(["ttt=lora", "ttt.graph_rows=3"]))


def test_cuda_graphs_need_a_gpu_and_come_with_compiled_ttt_on_one(compose):
    with pytest.raises(ConfigError, match="ttt.cuda_graphs=false"):
        resolve(to_config(compose(["ttt=lora", "ttt.cuda_graphs=true"])), fake_device("cpu"))

    def graphs(device, *overrides):
        return resolve(to_config(compose(["ttt=lora", *overrides])), fake_device(device)).ttt.cuda_graphs

    assert graphs("h100", "ttt.compile=true") is True
    assert graphs("h100") is False and graphs("cpu", "ttt.compile=true") is False
    assert graphs("h100", "ttt.compile=true", "ttt.cuda_graphs=false") is False
    assert graphs("h100", "ttt.cuda_graphs=true") is True  # eager steps replayed: allowed, if asked for


@pytest.mark.gpu
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
@pytest.mark.parametrize("beta1", [0.9, 0.0])  # 0: the rows' slots optimizer, stepped inside the graphs
def test_cuda_graphed_ttt_scores_as_direct_ttt(autocast, beta1):
    """On a GPU: replayed steps give the scores of steps run directly, also after global phases have fine-tuned
    the weights that the graphs read (they must keep their storage), with nothing captured late; with the
    optimizer's update inside the graphs, the captures' own runs leave no update behind."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    tokens = docs_stream([200, 90, 300, 40, 17, 120, 64, 9], seed=3)
    kw = dict(batch_size=3, device="cuda", autocast_dtype=autocast, warm_start_a=True, short_chunks="64:4")
    kw.update(beta1=beta1)
    kw.update(phased=ttt_lora.GlobalSettings(phases=2, prefix_docs=4, lr=1e-2, chunk_tokens=64))
    direct = run(ttt_gpt().cuda(), tokens, **kw)
    graphed = run(ttt_gpt().cuda(), tokens, cuda_graphs=True, **kw)
    assert graphed.cuda_graphs > 0 and graphed.cuda_graphs_late == 0 and graphed.phases_done == 2
    assert graphed.tokens_scored == direct.tokens_scored and graphed.bytes == direct.bytes
    tol = 1e-5 if autocast is None else 2e-3
    assert graphed.val_loss == pytest.approx(direct.val_loss, rel=tol)
    assert graphed.base_val_loss == pytest.approx(direct.base_val_loss, rel=tol)


@pytest.mark.parametrize("targets", [("q", "v"), ("q", "v", "head")])
def test_a_steps_head_at_its_chunk_scores_and_learns_as_the_head_at_every_column(targets):
    """chunk_step's pick_width: the head (final norm, logits, loss) runs at each row's chunk only, not at the window
    of context before it. The scores, the bytes and the adapters' gradients are those of the head at every column
    (what the window's other columns would add is never read, and their gradient is zero), for windows at a
    document's start and later ones, a last chunk shorter than the others and a padding row."""
    from speedrun.core.ttt_docs import batch_steps, longest_first
    from speedrun.core.ttt_graphs import chunk_step
    from speedrun.core.ttt_lora import LoRAModel
    from speedrun.core.ttt_scorers import Scorer

    torch.manual_seed(0)
    seq, chunk = 48, 8
    m = GPT(dataclasses.replace(TTT_TINY, seq_len=seq), get_backend("sdpa", kernel="math"))
    with torch.no_grad():  # the output projections start at zero: nothing would flow back to q and v
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tokens = docs_stream([70, 30, 9], seed=3)  # 70: later windows past the 48-token window; 9: a chunk of 1
    docs = split_documents(tokens, BOS)
    docs = [docs[i] for i in longest_first(docs, chunk)]
    lora = LoRAModel(m, targets, 4, 4, 0)  # 4 slots: the 4th row is padding
    with torch.no_grad():
        for p in lora.parameters():
            p.add_(0.1 * torch.randn_like(p))  # B = 0 would make the adapters' own terms vanish
    scorer = Scorer(lora.model)
    nats_of = lambda fn, x, y, pick: fn(x, y, pick=pick)  # noqa: E731
    checked = 0
    for _, table, width, training in batch_steps(docs, chunk, seq, "graphs", 4):
        rows = torch.tensor(table)
        outs, grads = [], []
        for pick_width in (None, chunk, 3 * chunk):  # 3x: the run's largest chunk, for a batch of short_chunks
            for p in lora.parameters():
                p.grad = None
            outs.append(chunk_step(scorer, tokens, byte_luts(), rows, width, training, nats_of, None, pick_width))
            grads.append([None if p.grad is None else p.grad.clone() for p in lora.parameters()])
        full = outs[0]
        for picked, picked_grads in zip(outs[1:], grads[1:]):
            assert torch.equal(full.counts, picked.counts) and int(full.n_bytes) == int(picked.n_bytes)
            assert torch.allclose(full.row_nats, picked.row_nats, rtol=1e-5, atol=1e-6)
            for a, b in zip(grads[0], picked_grads):
                assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, rtol=1e-4, atol=1e-7))
        checked += training and any(g is not None and g.abs().sum() > 0 for g in grads[1])
    assert checked >= 5


def test_a_steps_gradients_of_its_rows_slots_are_the_backwards_gradients():
    """The graphed path's backward (chunk_step with bind and store_grads): autograd's gradients of the adapters' views
    at the step's rows, written into .grad, are what a backward into the whole parameters gives at those slots, for
    every adapter and the head's, with a looped layer's adapter called twice; past the rows, zeros. Nothing stays
    bound after the step."""
    from speedrun.core.model import LayerLoop
    from speedrun.core.ttt_docs import batch_steps, longest_first
    from speedrun.core.ttt_graphs import chunk_step
    from speedrun.core.ttt_lora import LoRAModel
    from speedrun.core.ttt_scorers import Scorer

    torch.manual_seed(0)
    seq, chunk, slots = 48, 8, 6
    cfg = dataclasses.replace(TTT_TINY, seq_len=seq, loop=LayerLoop(start=0, end=0, num=1, enable_at=0.5))
    m = GPT(cfg, get_backend("sdpa", kernel="math"))
    m.set_loop(True)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tokens = docs_stream([70, 30, 9], seed=3)
    docs = split_documents(tokens, BOS)
    docs = [docs[i] for i in longest_first(docs, chunk)]
    lora = LoRAModel(m, ("q", "v", "mlp_bypass", "head"), 4, slots, 0)
    with torch.no_grad():
        for p in lora.parameters():
            p.add_(0.1 * torch.randn_like(p))
    scorer = Scorer(lora.model)
    nats_of = lambda fn, x, y, pick: fn(x, y, pick=pick)  # noqa: E731
    checked = 0
    for _, table, width, training in batch_steps(docs, chunk, seq, "graphs", slots):
        if not training:
            continue
        rows = torch.tensor(table)
        for p in lora.parameters():
            p.grad = None
        direct = chunk_step(scorer, tokens, byte_luts(), rows, width, training, nats_of, None, chunk)
        want = [p.grad.clone() for p in lora.parameters()]
        bufs = [torch.full_like(p, 7.0) for p in lora.parameters()]  # what an earlier step left there

        def store(n, grads, bufs=bufs):
            store_rows_grads(bufs, n, grads)

        viewed = chunk_step(scorer, tokens, byte_luts(), rows, width, training, nats_of, store, chunk, lora.bind_rows)
        assert all(d.rows is None for d in lora.deltas)
        assert torch.equal(direct.row_nats, viewed.row_nats)
        n = rows.size(1)
        assert n < slots  # the step's rows: 2 of the 6 slots, padded
        for w, b in zip(want, bufs):
            assert torch.allclose(b[:n], w[:n], rtol=1e-5, atol=1e-8)
            assert not b[n:].any()
            assert not w[n:].any()  # the backward into the parameters gives zeros there: nothing is lost
        checked += 1
    assert checked >= 5


def test_capturing_leaves_the_adapters_and_the_optimizer_as_it_found_them():
    """A capture runs its step (and, with the update in the graph, the optimizer's step) on dummy rows: prepare puts
    the adapters and the optimizer's moments and counts back as they were, whatever the captures changed."""
    from speedrun.core.ttt_graphs import GraphedChunkSteps
    from speedrun.core.ttt_lora import RowSlotsAdam

    params = [torch.nn.Parameter(torch.randn(4, 3, 5)), torch.nn.Parameter(torch.randn(4, 7, 3))]
    opt = RowSlotsAdam(params, lr=0.1, beta2=0.999, eps=1e-8, weight_decay=0.5)
    before = [t.clone() for t in opt.state_tensors()]
    graphs = object.__new__(GraphedChunkSteps)  # no CUDA here: the capture itself is stood in for
    graphs.graphs, graphs.params, graphs.grads, graphs.late, graphs.pool, graphs.update = {}, params, [], 0, None, opt
    undo = []

    def capture(key, rows, undo_warm_up=True):  # what a capture's run and replay do: a real update on dummy rows
        undo.append(undo_warm_up)
        opt.apply(key[0], [torch.ones_like(p[: key[0]]) for p in params])
        graphs.graphs[key] = None

    graphs._capture = capture
    graphs.prepare([(2, 128, True), (4, 128, True)], lambda key: torch.zeros(4, key[0], dtype=torch.int64))
    assert undo == [False, False]  # prepare puts everything back once, after all its captures
    assert all(torch.equal(t, b) for t, b in zip(opt.state_tensors(), before))
    assert graphs.graphs.keys() == {(2, 128, True), (4, 128, True)}


def test_a_capture_that_runs_out_of_memory_says_what_to_change():
    """Capturing is before TTT's clock: a shape that does not fit raises an OutOfMemoryError (so the run records an
    out-of-memory failure) that names the shape, how many were captured, and the settings that need fewer shapes.
    Shapes are captured largest first (a smaller one reuses what a larger one freed in the shared pool)."""
    from speedrun.core.ttt_graphs import GraphedChunkSteps
    from speedrun.run.oom import find_oom

    graphs = object.__new__(GraphedChunkSteps)  # no CUDA here: the capture itself is stood in for
    graphs.graphs, graphs.params, graphs.grads, graphs.late, graphs.pool, graphs.update = {}, [], [], 0, None, None
    tried = []

    def capture(key, rows, undo_warm_up=True):
        tried.append(key)
        if len(tried) == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 90.00 MiB.\nIncluding non-PyTorch")
        graphs.graphs[key] = None

    graphs._capture = capture
    keys = [(2, 128, True), (8, 256, True), (8, 256, False), (4, 2048, True), (2, 128, False)]
    with pytest.raises(torch.cuda.OutOfMemoryError) as info:
        graphs.prepare(keys, lambda key: torch.zeros(4, key[0], dtype=torch.int64))
    assert tried == [(4, 2048, True), (8, 256, True), (8, 256, False)]  # largest first, learning before not
    message = str(info.value)
    assert "shape 3 of 5 (rows 8, width 256, 2 captured)" in message and "ttt.row_widths=pow2" in message
    assert "Tried to allocate 90.00 MiB." in message and "non-PyTorch" not in message
    assert find_oom(info.value) is info.value


@pytest.mark.parametrize("graphed", [False, True])
def test_one_a_product_for_the_attentions_input_scores_as_an_a_product_each(monkeypatch, graphed):
    """ttt.shared_attn_a: the adapters on q, k, v and beside the attention share one A product with its input (the
    attention's adapter hook) and score, learn and step as the same adapters wrapped one by one do: directly and on
    the graphed path (the rows' slots optimizer inside the step), with the head at the chunk's columns (the last
    layer at the picked columns), warm-started A and global phases (which run the model without the hook)."""
    from speedrun.core.ttt_lora import Adapted, InputAdapters

    monkeypatch.setattr(ttt_module, "GraphedChunkSteps", RecordingGraphs)
    tokens = docs_stream([200, 90, 300, 40, 17, 120, 64, 9], seed=3)
    kw = dict(batch_size=3, warm_start_a=True, short_chunks="64:4", optimizer="adam", beta1=0.0, weight_decay=0.5,
              targets="record", alpha=8.0, cuda_graphs=graphed, lr=1e-2,
              phased=ttt_lora.GlobalSettings(phases=2, prefix_docs=4, lr=1e-2, chunk_tokens=64))  # fmt: skip
    built = []
    lora_class = ttt_lora.LoRAModel
    monkeypatch.setattr(ttt_module, "LoRAModel", lambda *a, **k: built.append(lora_class(*a, **k)) or built[-1])
    each = run(ttt_gpt(), tokens, **kw)
    shared = run(ttt_gpt(), tokens, shared_attn_a=True, **kw)
    frozen = run(ttt_gpt(), tokens, shared_attn_a=True, **{**kw, "lr": 0.0})
    separate, hooked = built[:2]
    wrapped = {type(m.module).__name__ for m in separate.model.modules() if isinstance(m, Adapted)}
    assert wrapped == {"Linear", "CausalSelfAttention", "MLP"} and not separate.hooked
    # shared: the attention's input adapters are hooked in, the MLP's bypass still wraps the MLP
    assert {type(m.module).__name__ for m in hooked.model.modules() if isinstance(m, Adapted)} == {"MLP"}
    assert len(hooked.hooked) == TTT_TINY.n_layer and all(isinstance(h, InputAdapters) for _, h in hooked.hooked)
    assert all(attn.adapter is h for attn, h in hooked.hooked)  # back in place after the phases
    assert shared.phases_done == each.phases_done == 2 and shared.tokens_scored == each.tokens_scored
    # at this learning rate the adapters move the score by 1e-3, the two ways agree to 1e-8; at the tests' usual 0.05
    # Adam's steps on this tiny model turn float rounding into 1e-2
    assert abs(shared.val_loss - frozen.val_loss) > 5e-4
    assert shared.val_loss == pytest.approx(each.val_loss, rel=1e-7)
    by_doc = {(c.batch, c.chunk, c.doc): c.nats for c in each.chunks}
    assert len(shared.chunks) == len(each.chunks)
    for c in shared.chunks:
        assert c.nats == pytest.approx(by_doc[(c.batch, c.chunk, c.doc)], rel=1e-5, abs=1e-6)
    # the adapters learnt the same: every A and B, slot for slot, to 1% of one step (lr 1e-2): Adam divides each
    # gradient by its own size, so float rounding in the shared product shows up as ~2e-5 on some CPUs
    for a, b in zip(separate.parameters(), hooked.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (a - b).abs().max()
    assert all(bool(d.B.detach().any()) for d in hooked.deltas)  # every adapter learnt something


@pytest.mark.gpu
def test_cuda_graphed_ttt_with_one_a_product_scores_as_separate_adapters():
    """On a GPU, bf16, replayed from CUDA graphs with the optimizer inside them: ttt.shared_attn_a scores as the
    adapters wrapped one by one do, within bf16's rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    tokens = docs_stream([200, 90, 300, 40, 17, 120, 64, 9], seed=3)
    kw = dict(batch_size=3, device="cuda", autocast_dtype=torch.bfloat16, warm_start_a=True, short_chunks="64:4",
              beta1=0.0, targets="record", alpha=8.0, lr=1e-2, cuda_graphs=True,
              phased=ttt_lora.GlobalSettings(phases=2, prefix_docs=4, lr=1e-2, chunk_tokens=64))  # fmt: skip
    each = run(ttt_gpt().cuda(), tokens, **kw)
    shared = run(ttt_gpt().cuda(), tokens, shared_attn_a=True, **kw)
    assert shared.cuda_graphs > 0 and shared.cuda_graphs_late == 0 and shared.phases_done == 2
    assert shared.tokens_scored == each.tokens_scored and shared.bytes == each.bytes
    assert shared.val_loss == pytest.approx(each.val_loss, rel=2e-3)
