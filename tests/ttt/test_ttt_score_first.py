"""Score-first, as a property of the code: no token's score depends on an update that used that token or a later
one, for per-document LoRA, warm-started A and every phase of phased global TTT; and the pieces that make it so
(the phase schedule, document-bounded rows, the adapters: head, bypass, alpha, warm start)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from speedrun.core import ttt_global as global_phases
from speedrun.core.ttt_docs import batch_cost, deal_batches, document_batches, phase_schedule, split_documents
from speedrun.core.ttt_global import chunks_of, document_rows, finetune
from speedrun.core.ttt_lora import GlobalSettings, LoRAModel, TTTSettings
from speedrun.core.ttt_score import ttt_evaluate
from support.tiny import BOS, TTT_TINY, byte_luts, docs_stream
from support.ttt import CHUNK, CONFIGS, ttt_gpt

LENGTHS = [37, 20, 51, 29, 44, 33, 26, 48]  # 8 documents, 4 batches of 2; several chunks and windows each


def scores(m, tokens, settings):
    res = ttt_evaluate(m, tokens, byte_luts(), settings, bos_id=BOS, seq_len=TTT_TINY.seq_len, record_chunks=True)
    assert res.complete
    return res, {(c.doc, c.chunk): c for c in res.chunks}


@pytest.mark.parametrize("config", CONFIGS)
def test_no_score_depends_on_a_token_scored_after_it(config):
    """Change the first target of one chunk (never to BOS: the same documents), in every document in turn: every
    chunk scored before it, and every other document's chunk scored in the same forward, keeps its score bit for
    bit. Then what may change does: the chunk itself always, later chunks of other documents exactly when
    something learns across documents (a global phase after the change, or warm-started A), never with
    per-document adapters alone. Every document is changed once at its chunk 1, so a phase that trained on one
    document too many (the first one scored after it) would change that document's chunk 0, scored before."""
    settings = CONFIGS[config]
    m = ttt_gpt()
    tokens = docs_stream(LENGTHS, seed=1)
    docs = split_documents(tokens, BOS)
    base, before = scores(m, tokens, settings)
    batch_of = {c.doc: c.batch for c in base.chunks}
    assert sorted(set(batch_of.values())) == [0, 1, 2, 3]
    if settings.phased.phases:
        assert base.phases_done == 2 and base.global_steps > 0
    rng = random.Random(0)
    picks = [(d, c) for d, (_, n) in enumerate(docs) for c in range(2, n // CHUNK) if c * CHUNK + 1 < n]
    crossed = 0
    for d, c in [(d, 1) for d in range(len(docs))] + rng.sample(picks, 2):
        changed = tokens.clone()
        position = docs[d][0] + c * CHUNK + 1  # the chunk's first target
        changed[position] = changed[position] % 62 + 1 if changed[position] != 62 else 1
        assert changed[position] != BOS and changed[position] != tokens[position]
        _, after = scores(m, changed, settings)
        assert after.keys() == before.keys()
        when = (batch_of[d], c)
        for key, chunk in before.items():
            earlier = (chunk.batch, chunk.chunk) < when or ((chunk.batch, chunk.chunk) == when and chunk.doc != d)
            if earlier:
                assert after[key] == chunk, (config, (d, c), key)
        assert after[(d, c)].nats != before[(d, c)].nats  # the changed target itself
        others_later = [k for k, v in before.items() if k[0] != d and (v.batch, v.chunk) > when]
        moved = [k for k in others_later if after[k] != before[k]]
        learns_across = config == "warm" or (config == "phased" and batch_of[d] <= 1)
        if learns_across:
            crossed += bool(moved)
        else:
            assert not moved, (config, (d, c), moved)
    if config != "lora":
        assert crossed >= 2  # a change reaches later documents through the phases (and warm-started A)


def test_global_phases_run_after_the_documents_they_train_on_are_scored():
    # 4 batches of 2 documents: 2 phases over the first 4 documents end with batches 0 and 1
    g = GlobalSettings(phases=2, prefix_docs=4)
    assert phase_schedule([2, 2, 2, 2], g) == {0: [2], 1: [4]}
    # a batch larger than a phase's group ends several phases; a prefix beyond the documents is cut to them, and a
    # phase ending with the last batch is dropped (nothing is scored after it)
    assert phase_schedule([5, 5, 5], GlobalSettings(phases=3, prefix_docs=9)) == {0: [3], 1: [6, 9]}
    assert phase_schedule([2, 2], GlobalSettings(phases=2, prefix_docs=100)) == {0: [2]}
    assert phase_schedule([2, 2], GlobalSettings(phases=0)) == {}


def test_global_rows_never_cross_a_document_and_chunks_hold_whole_documents():
    tokens = docs_stream([30, 5, 61], seed=2)
    docs = split_documents(tokens, BOS)
    rows = document_rows(docs, 24)
    assert [n for _, n in rows] == [24, 6, 5, 24, 24, 12]  # the last document ends at the stream's end
    for start, n in rows:
        inputs = tokens[start : start + n]
        assert not (inputs[1:] == BOS).any()  # a BOS only as a row's first input (a document's start)
        assert (tokens[start + 1 : start + n] != BOS).all()  # no target before a document's last one is BOS
    assert sum(n for _, n in rows) == tokens.numel() - 1  # every target once
    assert chunks_of(docs, 31) == [docs[:2], docs[2:]] and chunks_of(docs, 1) == [[d] for d in docs]


def test_global_finetune_learns_the_documents_and_leaves_the_model_passed_in_alone():
    """A phase trains the copy's own weights: the loss of the documents it trained on falls; ttt_evaluate never
    touches the model it was given."""
    m = ttt_gpt()
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(1, 64, (5,), generator=g)
    tokens = torch.cat([torch.cat([torch.tensor([BOS]), motif.repeat(8)]) for _ in range(3)])
    docs = split_documents(tokens, BOS)
    lora = LoRAModel(m, ("q",), rank=2, slots=1, seed=0)

    @torch.no_grad()
    def loss(net) -> float:
        return float(net(tokens[:-1][None, :24], tokens[1:][None, :24]))

    with lora.bare() as bare:
        before = loss(bare)
        stats = finetune(bare, tokens, docs, GlobalSettings(phases=1, lr=0.3, batch_seqs=2, epochs=3), seq_len=24,
                         device="cpu", autocast_dtype=None)  # fmt: skip
        after = loss(bare)
    assert stats.steps == 3 * 3 and stats.tokens == 3 * (tokens.numel() - 1) and not stats.stopped
    assert after < before - 0.5 and loss(m) == before  # the copy learnt; the model passed in did not move
    assert all(not p.requires_grad and p.grad is None for p in lora.base_parameters())  # frozen again after
    state = {k: v.clone() for k, v in m.state_dict().items()}
    res = ttt_evaluate(m, docs_stream(LENGTHS), byte_luts(), CONFIGS["warm"], bos_id=BOS, seq_len=24)
    assert res.phases_done == 2 and all(torch.equal(state[k], v) for k, v in m.state_dict().items())


class _Shapes:
    """Records the (rows, width) of every forward of a module (a forward pre-hook on it)."""

    def __init__(self, module):
        self.seen: list[tuple[int, int]] = []
        module.register_forward_pre_hook(lambda _, args: self.seen.append(tuple(args[0].shape)))


@pytest.mark.parametrize("rank,world,micro", [(0, 1, None), (1, 2, None), (0, 1, 2)])
def test_phase_shapes_are_the_shapes_finetune_runs_and_the_warm_up_runs_them_without_a_step(rank, world, micro):
    """The phases' warm-up (global_phases.warm_up_phases, before TTT's clock) runs exactly the (rows, width) forwards that
    finetune then runs, on any rank and with micro-batches, and leaves the weights as they were, bit for bit."""
    lengths = [37, 20, 90, 9, 44, 33, 26, 48, 5, 70]
    tokens = docs_stream(lengths)
    docs = split_documents(tokens, BOS)
    settings = GlobalSettings(phases=1, lr=0.05, chunk_tokens=120, batch_seqs=5, epochs=2, micro_rows=micro)
    shapes = global_phases.phase_shapes(docs, settings, 24, rank, world)
    lora = LoRAModel(ttt_gpt(), ("q",), rank=2, slots=1, seed=0)
    recorder = _Shapes(lora.model)
    with lora.bare() as bare:
        before = {k: v.clone() for k, v in bare.state_dict().items()}
        global_phases.warm_up_phases(bare, shapes, vocab=64, device="cpu", autocast_dtype=None)
        assert all(torch.equal(before[k], v) for k, v in bare.state_dict().items())  # no step
        assert all(p.grad is None for p in bare.parameters())
        assert sorted(recorder.seen) == sorted(shapes)  # one forward a shape
        recorder.seen.clear()

        class Ranked:  # finetune's view of a World: this rank of `world`, the gradients kept as they are
            def __init__(self):
                self.rank, self.world_size = rank, world

            def sync_grads(self, params):
                pass

            def agree(self, value):
                return value

        stats = finetune(bare, tokens, docs, settings, seq_len=24, device="cpu", autocast_dtype=None,
                         shard=Ranked() if world > 1 else None)  # fmt: skip
    assert stats.steps > 2 and set(recorder.seen) == shapes and len(shapes) > 1
    if micro is not None:  # a forward's padded tokens within micro rows of seq_len (every width is 24 here)
        assert max(rows * width for rows, width in shapes) == micro * 24


def test_phase_forwards_fill_their_token_budget_and_add_up_to_the_step():
    """A step's rows (longest first) go to forwards that each hold as many rows as fit in the budget of padded
    tokens (rows x the width of the first): never over it, and a forward is closed only when its next row would not
    fit; together the forwards hold the step's rows in order, so the step's summed gradient is the same."""
    rows = [(0, 2000), (10, 900), (20, 700), (30, 300), (40, 250), (50, 120), (60, 64), (70, 60), (80, 10), (90, 3)]
    budget = 2 * 2048
    forwards = global_phases._forwards(rows, 2048, budget)
    assert [r for f in forwards for r in f] == rows
    widths = [global_phases._width(f, 2048) for f in forwards]
    assert all(len(f) * w <= budget for f, w in zip(forwards, widths))
    assert all((len(f) + 1) * w > budget for f, w in zip(forwards[:-1], widths[:-1]))
    # 2 rows at width 2048; 700 opens a forward at width 1024 with room for 4; 64 opens one at width 64 (room for 64)
    assert [len(f) for f in forwards] == [2, 4, 4] and widths == [2048, 1024, 64]
    assert global_phases._forwards(rows, 2048, None) == [rows]
    assert global_phases._forwards([], 2048, budget) == []


@pytest.mark.parametrize("tied", [True, False])
def test_every_target_adapts_and_fresh_adapters_add_nothing(tied):
    """Each target alone (the head, tied or untied, and the bypasses included) lowers the loss of a repetitive
    document below the unadapted score of the same chunks; with lr 0 the adapted scores are the base scores."""
    from speedrun.config.specs import TTT_TARGETS

    m = ttt_gpt(tied=tied)
    if not tied:
        with torch.no_grad():
            m.lm_head.weight.normal_(0, 0.05)  # zero-initialised otherwise: no logits to adapt
    g = torch.Generator().manual_seed(3)
    tokens = torch.cat([torch.tensor([BOS]), torch.randint(1, 64, (6,), generator=g).repeat(12)])
    for target in TTT_TARGETS:
        s = TTTSettings(rank=4, lr=0.05, chunk_size=CHUNK, targets=target, alpha=8.0)
        res = ttt_evaluate(m, tokens, byte_luts(), s, bos_id=BOS, seq_len=24)
        assert res.val_loss < res.base_val_loss - 0.02, (target, res.val_loss, res.base_val_loss)  # q, k: 0.04+
        frozen = ttt_evaluate(m, tokens, byte_luts(), TTTSettings(rank=4, lr=0.0, chunk_size=CHUNK, targets=target),
                              bos_id=BOS, seq_len=24)  # fmt: skip
        # the steps' last layer call runs at the chunk's columns (GPT.forward's pick: another attention kernel),
        # the base passes over documents' starts at every column: equal up to float rounding, where any adapter's
        # term would show at 1e-3
        assert frozen.val_loss == pytest.approx(frozen.base_val_loss, rel=1e-7, abs=0), target


def test_alpha_scales_the_delta_and_warm_start_keeps_a():
    m = ttt_gpt()
    plain = LoRAModel(m, ("q", "head"), rank=4, slots=2, seed=0)
    scaled = LoRAModel(m, ("q", "head"), rank=4, slots=2, seed=0, scale=144 / 96)
    x = torch.randn(2, 5, TTT_TINY.d_model)
    for a, b in zip(plain.deltas, scaled.deltas):
        assert torch.equal(a.A, b.A) and not a.B.any()  # the same seeded A; B = 0: a fresh adapter adds nothing
        with torch.no_grad():
            a.B.normal_()
            b.B.copy_(a.B)
        torch.testing.assert_close(b(x[..., : a.A.shape[2]]), a(x[..., : a.A.shape[2]]) * 1.5)
    drawn = [d.A.clone() for d in plain.deltas]
    with torch.no_grad():
        for d in plain.deltas:
            d.A.add_(1.0)
    plain.reset(keep_a=True)  # warm start: A as the last batch left it, B back to 0
    assert all(torch.equal(d.A, a + 1.0) and not d.B.any() for d, a in zip(plain.deltas, drawn))
    plain.reset(keep_a=False)  # after a phase: the seeded draw again
    assert all(torch.equal(d.A, a) for d, a in zip(plain.deltas, drawn))


def test_warm_start_chains_carry_a_within_a_chain_only():
    """4 batches: with as many chains as batches every batch starts from the seeded A, exactly as with warm_start_a
    off; with fewer, a chain's first batch still does, and each later batch of a chain scores differently (it starts
    from the A its chain's previous batch left)."""
    m, tokens = ttt_gpt(), docs_stream(LENGTHS, seed=2)
    warm = dataclasses.replace(CONFIGS["warm"], phased=GlobalSettings())
    cold = scores(m, tokens, dataclasses.replace(warm, warm_start_a=False))[1]

    def batch_nats(table, b):
        return [c.nats for c in table.values() if c.batch == b]

    for chains in (1, 2, 4):
        table = scores(m, tokens, dataclasses.replace(warm, warm_start_chains=chains))[1]
        docs = split_documents(tokens, BOS)
        batches = document_batches(docs, CHUNK, [], 2, 0)
        costs = [
            batch_cost(docs, b, CHUNK, TTT_TINY.seq_len, "eager", slots=2, score_base=warm.score_base) for b in batches
        ]
        _, chain_of = deal_batches(costs, [], 1, chains)
        assert len(set(chain_of)) == min(chains, len(batches))
        for b in range(len(batches)):
            first_of_chain = chain_of.index(chain_of[b]) == b
            assert (batch_nats(table, b) == batch_nats(cold, b)) == first_of_chain, (chains, b)


# ---- CUDA (device machine) -------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_bf16_record_ttt_with_phases_agrees_with_cpu():
    """The records' kind of TTT (warm A, head and bypass adapters, 2 global phases) under bf16 autocast on CUDA:
    the same tokens, bytes and phases as on CPU in fp32, the score close."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    tokens = docs_stream(LENGTHS, seed=1)
    cpu = ttt_evaluate(ttt_gpt(), tokens, byte_luts(), CONFIGS["warm"], bos_id=BOS, seq_len=24)
    gpu = ttt_evaluate(ttt_gpt().cuda(), tokens, byte_luts(), CONFIGS["warm"], bos_id=BOS, seq_len=24, device="cuda",
                       autocast_dtype=torch.bfloat16)  # fmt: skip
    assert gpu.complete and (gpu.tokens_scored, gpu.bytes, gpu.phases_done) == (cpu.tokens_scored, cpu.bytes, 2)
    assert abs(gpu.val_loss - cpu.val_loss) < 0.1, (gpu.val_loss, cpu.val_loss)


def test_frozen_linears_cast_once_score_exactly_as_autocast_casting_every_call():
    """Under bf16 autocast, TTT keeps the frozen copy's linears in bf16 (cast once, not at every forward): the scores,
    the unadapted scores and every global phase are bit for bit those of casting at every call, and the model
    passed in keeps its float weights."""
    import dataclasses

    tokens = docs_stream(LENGTHS, seed=5)
    settings = dataclasses.replace(CONFIGS["warm"], score_base=True)
    m = ttt_gpt()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    results = []
    for cast_weights in (True, False):
        s = dataclasses.replace(settings, cast_weights=cast_weights)
        res = ttt_evaluate(
            m,
            tokens,
            byte_luts(),
            s,
            bos_id=BOS,
            seq_len=TTT_TINY.seq_len,
            autocast_dtype=torch.bfloat16,
            record_chunks=True,
        )
        assert res.complete and res.phases_done == 2
        results.append(res)
    once, every = results
    assert [c.nats for c in once.chunks] == [c.nats for c in every.chunks]
    assert (once.val_loss, once.base_val_loss) == (every.val_loss, every.base_val_loss)
    assert all(torch.equal(v, before[k]) and v.dtype == before[k].dtype for k, v in m.state_dict().items())


def test_a_cast_lora_copy_trains_its_float_masters_in_the_global_phases():
    """cast_linear_weights leaves plain linears in bf16 and names their float masters; LoRAModel.bare hands global
    TTT the float weights (the model exactly as never cast), and after it the fine-tuned floats, cast again."""
    m = ttt_gpt()
    lora = LoRAModel(m, ("q", "v"), rank=2, slots=1, seed=0, cast_dtype=torch.bfloat16)
    linears = [mod for mod in lora.model.modules() if type(mod) is torch.nn.Linear]
    assert linears and all(mod.weight.dtype == torch.bfloat16 for mod in linears)
    first = linears[0].weight
    with lora.bare() as bare:
        assert first.dtype == torch.float32 and torch.equal(first, dict(m.named_parameters())[_name(bare, first)])
        with torch.no_grad():
            first.add_(1.0)  # what an SGD step does to the float master
        trained = first.detach().clone()
    assert first.dtype == torch.bfloat16 and torch.equal(first, trained.to(torch.bfloat16))
    with lora.bare():
        assert torch.equal(first, trained)  # the master kept its float value, not the bf16 round trip


def _name(module, param):
    return next(name.replace(".module.", ".") for name, p in module.named_parameters() if p is param)
