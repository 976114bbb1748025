"""TTT over ranks. How its batches are dealt (speedrun.core.ttt_docs.deal_batches): by cost between global phases,
and with warm_start_a into chains that do not depend on the rank count. And TTT and evaluation on two gloo ranks
against one process: documents and batches dealt over the ranks, float64 sums all-reduced, global phases with
averaged gradients (every rank's model the same), and a time budget that every rank obeys at the same batch."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest
import torch

from speedrun.core.evaluate import run_eval
from speedrun.core.ttt_docs import BASE_TOKEN_COST, STEP_COST_TOKENS, batch_cost, deal_batches, split_heavy_batches
from speedrun.core.ttt_lora import GlobalSettings, TTTSettings
from support.ranks import on_ranks
from support.tiny import BOS, TTT_TINY, byte_luts, docs_stream
from support.ttt import RecordingGraphs, run, ttt_gpt

COSTS = [104, 3, 9, 40, 12, 7, 7, 30, 2, 18, 25, 5, 61, 8, 11, 4]  # one long document's batch, many short ones


def loads(costs, rank, world):
    return [sum(c for c, r in zip(costs, rank) if r == k) for k in range(world)]


def batch_steps(docs, batch, chunk):
    """Chunk steps a batch takes: its longest document's chunks."""
    return max(-(-docs[i][1] // chunk) for i in batch)


def test_a_batch_costs_its_longest_documents_steps_at_the_least():
    docs = [(0, 10), (11, 48), (60, 49), (110, 1)]
    for batch, steps in (([0, 1], 3), ([2], 4), ([3], 1)):
        assert steps < batch_cost(docs, batch, 16, 2048, mode="eager") < steps + 1


def test_batch_cost_counts_each_step_and_its_padded_tokens():
    """A step costs 1 plus its rows x padded width / STEP_COST_TOKENS. Eager steps run every document of the batch;
    compiled ones only those still going, at least 2."""
    docs = [(0, 100), (101, 40), (142, 30), (173, 10)]  # chunks of 32: 4, 2, 1 and 1 steps
    per = 1 / STEP_COST_TOKENS["eager"]
    # widths: windows of 32, 64, 96, 100 tokens -> 64, 64, 128, 128 (powers of two, at least 64)
    eager = 4 + 4 * (64 + 64 + 128 + 128) * per
    # 4 going, then 2, then 1 (run as 2), 1 (as 2)
    compact = 4 + (4 * 64 + 2 * 64 + 2 * 128 + 2 * 128) / STEP_COST_TOKENS["compact"]
    assert batch_cost(docs, [0, 1, 2, 3], 32, 2048, mode="eager") == pytest.approx(eager)
    assert batch_cost(docs, [0, 1, 2, 3], 32, 2048, mode="compact") == pytest.approx(compact)
    # windows stop growing at the context: a 5,000-token document's late steps are 2048 wide
    long = [(0, 5000)]
    assert batch_cost(long, [0], 1000, 2048, mode="eager") == pytest.approx(5 + (1024 + 2048 * 4) * per)


def test_a_long_documents_batch_costs_its_padded_rows():
    """One 4,000-token document beside 15 short ones: eager, every step runs 16 rows of up to 2048 tokens, so the
    batch costs about 44 times one of 16 documents of 150 tokens, where its steps alone (84 against 4) say 21."""
    docs = [(0, 4000)] + [(4001 + 50 * i, 40) for i in range(15)] + [(5000 + 200 * i, 150) for i in range(16)]
    tail, even = list(range(16)), list(range(16, 32))
    steps_ratio = batch_steps(docs, tail, 48) / batch_steps(docs, even, 48)  # 84 / 4
    cost_ratio = batch_cost(docs, tail, 48, 2048, mode="eager") / batch_cost(docs, even, 48, 2048, mode="eager")
    assert steps_ratio == 21 and cost_ratio > 1.5 * steps_ratio  # about 44: its steps run 16 rows up to 2048 wide
    # compiled, 2 rows instead of 16 once the short ones are done: the padded tokens' part of the cost falls 8x
    steps = batch_steps(docs, tail, 48)
    tokens_part = [
        (batch_cost(docs, tail, 48, 2048, mode=m) - steps) * STEP_COST_TOKENS[m] for m in ("eager", "compact")
    ]
    assert tokens_part[1] * 7 < tokens_part[0] < tokens_part[1] * 9


def test_graphed_steps_cost_their_rows_padded_to_a_power_of_two_and_the_base_its_passes():
    docs = [(0, 100), (101, 40), (142, 30), (173, 10), (184, 20)]  # chunks of 32: 4, 2, 1, 1 and 1 steps
    per = 1 / STEP_COST_TOKENS["graphs"]
    # 5 going (run as 8 of 8 slots), then 2, then 1 (as 2), 1 (as 2); widths 64, 64, 128, 128
    graphs = 4 + (8 * 64 + 2 * 64 + 2 * 128 + 2 * 128) * per
    assert batch_cost(docs, [0, 1, 2, 3, 4], 32, 2048, mode="graphs", slots=8) == pytest.approx(graphs)
    # the base: one window over each document's start (widths 128, 64, 64, 64, 64), in passes of one width whose
    # rows are padded as a step's: 1 document as 2 rows at 128, then 4 at 64
    base = BASE_TOKEN_COST * (2 * 128 + 4 * 64) * per
    with_base = batch_cost(docs, [0, 1, 2, 3, 4], 32, 2048, mode="graphs", slots=8, score_base=True)
    assert with_base == pytest.approx(graphs + base)


def test_heavy_batches_are_halved_until_none_is_more_than_its_share():
    """One batch of the longest documents is most of the work: halved (first documents, then the rest) until no
    batch costs more than the share, or it is one document; the others untouched, the order kept."""
    cost = {0: 50, 1: 30, 2: 10, 3: 10, 4: 2, 5: 2, 6: 1, 7: 1, 8: 1}
    batches = [[4, 5], [0, 1, 2, 3], [6, 7, 8]]
    out = split_heavy_batches(batches, lambda b: sum(cost[i] for i in b), share=0.25)  # limit: 27
    assert out == [[4, 5], [0], [1], [2, 3], [6, 7, 8]]  # [0] (50) is one document: it stays
    assert split_heavy_batches(batches, lambda b: sum(cost[i] for i in b), share=1.0) == batches
    assert sorted(i for b in out for i in b) == sorted(i for b in batches for i in b)


@pytest.mark.parametrize("world", [2, 4])
def test_batches_are_dealt_longest_first_onto_the_least_loaded_rank(world):
    rank, chain = deal_batches(COSTS, [], world)
    assert chain == [0] * len(COSTS) and set(rank) == set(range(world))
    # the long batch alone on its rank, the rest spread evenly: no rank carries more than the long batch or an even
    # share plus one batch, where round-robin puts 104 + 12 + 2 + 61 on rank 0 of 4
    bound = max(max(COSTS), sum(COSTS) / world + max(COSTS[1:]))
    assert max(loads(COSTS, rank, world)) <= bound
    assert max(loads(COSTS, rank, world)) < max(loads(COSTS, [b % world for b in range(len(COSTS))], world))


def test_each_stretch_between_phases_is_balanced_on_its_own():
    """Every rank waits at a phase: the batches before it are dealt among themselves, as are those after it."""
    costs = [10, 10, 10, 10, 1, 1, 1, 1]
    rank, _ = deal_batches(costs, [3], 4)
    assert sorted(rank[:4]) == [0, 1, 2, 3] and sorted(rank[4:]) == [0, 1, 2, 3]
    assert deal_batches(costs, [3], 4) == deal_batches(costs, [3], 4)  # deterministic


@pytest.mark.parametrize("seed", range(5))
def test_chains_do_not_depend_on_the_rank_count_and_stay_on_one_rank(seed):
    rng = random.Random(seed)
    costs = [rng.randint(1, 100) for _ in range(rng.randint(5, 40))]
    phases = sorted(rng.sample(range(len(costs) - 1), 2))
    chains = {world: deal_batches(costs, phases, world, chains=8) for world in (1, 2, 4, 8)}
    assert len({tuple(c) for _, c in chains.values()}) == 1  # the same chain for every batch on 1, 2, 4 or 8 ranks
    for world, (rank, chain) in chains.items():
        stretches = [range(0, phases[0] + 1), range(phases[0] + 1, phases[1] + 1), range(phases[1] + 1, len(costs))]
        for stretch in stretches:  # within a stretch, a chain's batches all run on one rank
            owner = {}
            for b in stretch:
                assert owner.setdefault(chain[b], rank[b]) == rank[b], (world, b)
        assert set(rank) <= set(range(world))


@pytest.mark.parametrize("mode", ["eager", "compact", "graphs"])
@pytest.mark.parametrize("widths,half_rows", [("pow2", False), ("half_octave", True), ("128", False)])
def test_batch_cost_counts_the_rows_and_widths_ttt_runs(mode, widths, half_rows):
    """batch_cost's padded tokens are those of the steps TTT runs (steps.batch_steps) and of the base passes it scores
    (base_scores.BaseScores, through a scorer that only counts), for every mode and padding, on random batches."""
    import torch

    from speedrun.core import ttt_docs
    from speedrun.core.ttt_scorers import BaseScores

    rng = random.Random(0)
    seq, chunk, slots = 512, 32, 6
    for _ in range(20):
        lengths = [rng.choice([rng.randint(1, 100), rng.randint(100, 1500)]) for _ in range(rng.randint(1, slots))]
        starts = [sum(lengths[:i]) + i for i in range(len(lengths))]
        docs = list(zip(starts, lengths))
        ordered = [docs[i] for i in ttt_docs.longest_first(docs, chunk)]
        steps = list(ttt_docs.batch_steps(ordered, chunk, seq, mode, slots, widths, half_rows))
        step_tokens = sum(len(table[0]) * width for _, table, width, _ in steps)
        passes: list[int] = []

        def count(_, x, y, pick, passes=passes):
            passes.append(x.numel())  # the blocks run every column; the head, only pick's (not counted)
            return torch.zeros(x.shape if pick is None else pick.shape)

        rows_for = (
            (lambda n: slots) if mode == "eager" else (lambda n: ttt_docs.rows_for(n, slots, mode, slots, half_rows))
        )
        tokens = torch.zeros(starts[-1] + lengths[-1] + 1, dtype=torch.long)
        base = BaseScores(None, count, tokens, ordered, chunk, seq, slots, rows_for, widths=widths)
        for k in range(base.most):
            base.chunk(k)
        per = STEP_COST_TOKENS[mode]
        kw = dict(mode=mode, widths=widths, slots=slots, half_rows=half_rows)
        plain = batch_cost(docs, list(range(len(docs))), chunk, seq, **kw)
        assert plain == pytest.approx(len(steps) + step_tokens / per)
        with_base = batch_cost(docs, list(range(len(docs))), chunk, seq, score_base=True, **kw)
        assert with_base - plain == pytest.approx(BASE_TOKEN_COST * sum(passes) / per)


def test_chain_costs_alone_cut_the_chains_and_costs_place_them():
    """Which batches share a chain of A changes the scores, so deal_batches cuts the chains by chain_costs alone;
    costs (the run's own, which the mode, the widths and the base score change) only place whole chains on ranks."""
    rng = random.Random(3)
    frozen = [rng.randint(1, 100) for _ in range(30)]
    runs = [[c * rng.uniform(0.5, 2.0) for c in frozen] for _ in range(4)]  # four settings' own costs
    chains = {tuple(deal_batches(costs, [9], 4, chains=8, chain_costs=frozen)[1]) for costs in runs}
    assert chains == {tuple(deal_batches(frozen, [9], 4, chains=8)[1])}
    assert len({tuple(deal_batches(costs, [9], 4, chains=8)[1]) for costs in runs}) > 1  # cut by their own: not


def test_ttt_cuts_its_chains_by_one_cost_whatever_the_speed_settings(monkeypatch):
    """ttt_evaluate hands deal_batches the same chain costs whether the base is scored, how rows are padded and
    whether the steps run eager or from (stand-in) graphs, while its own costs differ: the chains of A, and so
    val_bpb_ttt, do not depend on what only changes speed."""
    from speedrun.core import ttt_docs as schedule
    from speedrun.core import ttt_score as ttt_module
    from speedrun.core.attention import get_backend
    from speedrun.core.model import GPT

    monkeypatch.setattr(ttt_module, "GraphedChunkSteps", RecordingGraphs)
    seen = []
    real = schedule.deal_batches

    def spy(costs, phase_ends, world, chains=0, chain_costs=None):
        seen.append((costs, chain_costs))
        return real(costs, phase_ends, world, chains, chain_costs)

    monkeypatch.setattr(schedule, "deal_batches", spy)
    m = GPT(dataclasses.replace(TTT_TINY, seq_len=256), get_backend("sdpa", kernel="math"))
    tokens = docs_stream([300, 100, 100, 20, 20, 150, 180, 90, 17, 60, 250, 40], seed=4)
    kw = dict(seq_len=256, chunk_size=32, batch_size=2, warm_start_a=True, warm_start_chains=4)
    results = [
        run(m, tokens, **kw, **settings)
        for settings in (
            dict(score_base=True),
            dict(score_base=False),
            dict(score_base=True, row_widths="128"),
            dict(score_base=True, cuda_graphs=True, graph_rows="half_octave"),
        )
    ]
    assert len({tuple(c) for _, c in seen}) == 1 and seen[0][1] is not None
    assert len({tuple(c) for c, _ in seen}) == len(seen)  # the runs' own costs all differ
    assert max(r.val_loss for r in results) - min(r.val_loss for r in results) < 1e-6  # and so the scores do not


# ---------------------------------------------------------------------------------------------------------
# two gloo ranks against one process

SEQ = 24
PHASED = TTTSettings(
    rank=4, lr=0.05, chunk_size=8, batch_size=2, targets="q,v,head,mlp_bypass", alpha=8.0, beta1=0.0, beta2=0.999,
    weight_decay=0.5, phased=GlobalSettings(phases=2, prefix_docs=6, lr=0.05, chunk_tokens=64, batch_seqs=3),
    warm_start_a=True, warm_start_chains=2, max_batch_share=0.2,
)  # fmt: skip
"""A carried from batch to batch along 2 chains: one per rank on two ranks, both on the one process; the heavier
of the 5 batches of 2 halved (max_batch_share), the same on both."""
SLOW_WARM_UP = 4.0
"""Seconds rank 1's TTT warm-up is held up by: TTT's clock starts when every rank is ready, so it is not counted."""


def _tokens() -> torch.Tensor:
    return docs_stream([37, 20, 51, 29, 44, 33, 26, 48, 31, 40], seed=4)


def _score(world) -> dict:
    """What a rank (or the one process, world None) measures: evals, a direct global fine-tune, phased TTT."""
    from speedrun.core.ttt_docs import split_documents
    from speedrun.core.ttt_global import finetune
    from speedrun.core.ttt_lora import LoRAModel
    from speedrun.core.ttt_score import ttt_evaluate

    torch.set_num_threads(1)
    m, tokens = ttt_gpt(), _tokens()
    out: dict = {}
    forward = lambda x, y: m(x, y, reduction="none")  # noqa: E731
    kw = dict(seq_len=SEQ, batch_size=2, device="cpu", autocast_dtype=None, shard=world)
    out["standard"] = run_eval("standard", forward, tokens, byte_luts(), stride=None, **kw)
    out["sliding"] = run_eval("sliding", forward, tokens, byte_luts(), stride=8, **kw)
    out["cut"] = run_eval("standard", forward, tokens, byte_luts(), stride=None, max_seconds=1e-9, **kw)
    lora = LoRAModel(m, ("q",), rank=2, slots=1, seed=0)
    with lora.bare() as bare:
        finetune(bare, tokens, split_documents(tokens, BOS), PHASED.phased, seq_len=SEQ, device="cpu",
                 autocast_dtype=None, shard=world)  # fmt: skip
        out["tuned"] = torch.cat([p.detach().flatten() for p in lora.base_parameters()])
    if world is not None and world.rank == 1:  # a rank whose compile warm-up takes longer than the other's
        from speedrun.core import ttt_score as ttt_module

        warm_up = ttt_module.make_scorers
        ttt_module.make_scorers = lambda *a, **k: (time.sleep(SLOW_WARM_UP), warm_up(*a, **k))[1]
    out["ttt"] = ttt_evaluate(m, tokens, byte_luts(), PHASED, bos_id=BOS, seq_len=SEQ, shard=world)
    if world is not None:
        out["ranks_tuned"] = world.gather(out["tuned"])
    return out


def _on_rank(rank: int, world) -> dict | None:
    out = _score(world)
    return out if rank == 0 else None


def test_two_ranks_evaluate_and_test_time_train_like_one_process(tmp_path):
    """Evals: bit for bit (each float64 slot has one non-zero term). A time budget spent at once: both ranks stop
    after the first round, so the two scored batches are the stream's first two, bit for bit the one-process eval
    of them. Global fine-tune: both ranks hold the same weights, the one-process weights to 1e-6 (the gradient
    is summed in another order). Phased TTT with warm-started A: the same tokens, bytes and documents, val_bpb to
    1e-6 (with A carried along each rank's batches instead of chains, 2.6675 against 2.6717)."""
    two, _ = on_ranks(_on_rank, out_dir=tmp_path)
    one = _score(None)
    assert two["standard"] == one["standard"] and two["sliding"] == one["sliding"]
    cut = two["cut"]
    assert not cut.complete and cut.tokens == 2 * 2 * SEQ and cut.tokens_total == one["standard"].tokens
    m = ttt_gpt()
    prefix = run_eval("standard", lambda x, y: m(x, y, reduction="none"), _tokens()[: cut.tokens + 1], byte_luts(),
                      seq_len=SEQ, stride=None, batch_size=2, device="cpu", autocast_dtype=None)  # fmt: skip
    assert (cut.val_loss, cut.val_bpb, cut.bytes) == (prefix.val_loss, prefix.val_bpb, prefix.bytes)
    r0, r1 = two["ranks_tuned"]
    assert torch.equal(r0, r1) and not torch.equal(r0, torch.cat([p.flatten() for p in ttt_gpt().parameters()]))
    torch.testing.assert_close(r0, one["tuned"], rtol=1e-6, atol=1e-6)
    a, b = two["ttt"], one["ttt"]
    assert (a.tokens_scored, a.bytes, a.docs_done, a.phases_done, a.global_steps) == (
        b.tokens_scored,
        b.bytes,
        b.docs_done,
        2,
        b.global_steps,
    )
    assert a.complete and abs(a.val_bpb - b.val_bpb) <= 1e-6 * b.val_bpb
    assert a.seconds < SLOW_WARM_UP  # rank 0 did not count rank 1's longer warm-up as TTT time (the slowest rank's)
    # each rank's own time and the cost the dealing predicted for it: together, the one process's
    assert len(a.rank_seconds) == 2 and min(a.rank_seconds) > 0 and len(b.rank_seconds) == 1
    assert min(a.rank_cost) > 0 and sum(a.rank_cost) == pytest.approx(b.rank_cost[0], abs=0.2)
