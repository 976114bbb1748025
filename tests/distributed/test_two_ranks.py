"""Two gloo ranks on CPU against one process, the real code on each (env:// rendezvous, tests/support/ranks.py):
training (Stepper, the train loop, Muon), the final eval and TTT sharded over the ranks; and periodic validation
(training.periodic with a World), which shards its fixed slice over the ranks and all-reduces float64 sums (as the
final eval does), so every rank holds the same val_loss / val_bpb, equal to one process scoring the same weights;
it runs at the same steps on every rank, and only rank 0 writes the val records."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from speedrun.config import to_config
from speedrun.plan import WorldInfo, resolve
from support.devices import fake_device
from support.ranks import STEPS, TINY_RUN, on_ranks, plan_for


def _luts(vocab: int):
    from speedrun.core.data import ByteLUTs

    g = torch.Generator().manual_seed(0)
    base = torch.randint(1, 5, (vocab,), generator=g).to(torch.int16)
    boundary = torch.zeros(vocab, dtype=torch.bool)
    boundary[1], base[1] = True, 0
    return ByteLUTs(base, torch.rand(vocab, generator=g) < 0.5, boundary)


def _val_tokens(vocab: int) -> torch.Tensor:
    t = torch.randint(2, vocab, (1 + 25 * 32,), generator=torch.Generator().manual_seed(1))
    t[::97] = 1  # BOS: documents for TTT
    return t


def _run(plan, shard: Path, world, state=None) -> dict:
    """Train STEPS steps with the real loop, then score: what a rank (or the single process) reports."""
    from speedrun.core.attention import get_backend
    from speedrun.core.data import TokenStream
    from speedrun.core.evaluate import run_eval
    from speedrun.core.train import Stepper, TrainState, train
    from speedrun.core.ttt_lora import TTTSettings
    from speedrun.core.ttt_score import ttt_evaluate
    from speedrun.run.build import build_model

    torch.manual_seed(world.rank)  # different seeds: World.prepare must give every rank rank 0's weights
    model, forward, eval_forward, optimizers = build_model(plan, get_backend("sdpa", kernel="math"), bos_id=1)
    world.prepare(model, optimizers)
    losses = []

    class Recording(Stepper):
        def __call__(self, batches):
            loss = super().__call__(batches)
            losses.append(float(loss))
            return loss

    def batches(seq_len, micro_batch, position=0):
        stream = TokenStream([shard], seq_len, micro_batch, rank=world.rank, world_size=world.world_size)
        stream.load_state_dict({"position": position})
        return stream

    out = {"losses": losses}
    if state is None:
        train(
            Recording(model, forward, optimizers, plan, world=world),
            batches,
            state=TrainState(),
            log=lambda _: None,
            on_metrics=lambda _: None,
        )
        out["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    else:  # score given weights (rank 0's, trained on two ranks) on one process
        model.load_state_dict(state)
    val, luts = _val_tokens(plan.model.vocab_size), _luts(plan.model.vocab_size)
    for mode, stride in (("standard", None), ("sliding", 8)):
        out[mode] = run_eval(
            mode,
            eval_forward,
            val,
            luts,
            seq_len=32,
            stride=stride,
            batch_size=2,
            device="cpu",
            autocast_dtype=None,
            shard=world,
        )
    settings = TTTSettings(rank=2, lr=0.01, chunk_size=8, batch_size=2, seed=0)
    out["ttt"] = ttt_evaluate(model, val, luts, settings, bos_id=1, seq_len=32, shard=world)
    return out


def _train_and_score(rank: int, world, plan, shard: str) -> dict | None:
    out = _run(plan, Path(shard), world)
    return out if rank == 0 else None


def test_two_ranks_train_and_score_like_one_process(compose, tmp_path):
    """Two ranks with accumulation 2 against one process with accumulation 4 (the same tokens each step): the
    same loss per step, fp32, to 2e-6 relative (the sums run in another order; measured: equal over these steps,
    final weights 8e-6 apart); the same final weights to 1e-5; eval sums of the same weights identical bit for bit
    (standard and sliding); TTT to 1e-12. Without the gradient all-reduce the losses differ by 5e-3 relative, with
    every rank orthogonalising the same share of Muon's matrices by 1e-4."""
    from speedrun.core.dist import SINGLE
    from speedrun.data.shards import write_shard

    shard = tmp_path / "fineweb_train_000000.bin"
    write_shard(shard, torch.randint(0, 1024, (40_000,), generator=torch.Generator().manual_seed(2)).numpy())
    one = plan_for(compose, *TINY_RUN)
    two = plan_for(compose, *TINY_RUN, world=WorldInfo("torchrun", 0, 2, 0, 2, 0))
    assert (one.grad_accum, two.grad_accum) == (4, 2)
    ranks, _ = on_ranks(_train_and_score, two, str(shard), out_dir=tmp_path, plan=two)
    torch.set_num_threads(1)
    single = _run(one, shard, SINGLE)
    assert len(ranks["losses"]) == len(single["losses"]) == STEPS
    for a, b in zip(ranks["losses"], single["losses"]):
        assert math.isfinite(a) and abs(a - b) <= 2e-6 * abs(b), (ranks["losses"], single["losses"])
    for key, value in single["state"].items():
        torch.testing.assert_close(ranks["state"][key], value, rtol=1e-5, atol=1e-5)
    same_weights = _run(one, shard, SINGLE, state=ranks["state"])
    for mode in ("standard", "sliding"):
        assert ranks[mode] == same_weights[mode]  # tokens, bytes, val_loss and val_bpb, exactly
    r, s = ranks["ttt"], same_weights["ttt"]
    assert (r.tokens_scored, r.bytes, r.docs_done, r.complete) == (s.tokens_scored, s.bytes, s.docs_done, True)
    assert abs(r.val_bpb - s.val_bpb) <= 1e-12 * s.val_bpb


# ---------------------------------------------------------------------------------------------------------
# periodic validation

PERIODIC = [*TINY_RUN, "eval.every_steps=2", "eval.periodic_tokens=512"]  # 16 windows of 32: 8 batches of 2


def _train_with_periodic_eval(plan, shard: Path, world) -> dict:
    """Train with the real loop and LoopExtras (real PeriodicEval, sharded over ``world``); returns every result
    the evaluator computed on this rank (step 0: before training, the same weights everywhere) and the records
    this rank wrote."""
    from speedrun.core.attention import get_backend
    from speedrun.core.data import TokenStream
    from speedrun.core.train import Stepper, TrainState, train
    from speedrun.run.build import build_model
    from speedrun.run.periodic import LoopExtras, PeriodicEval

    torch.manual_seed(world.rank)  # World.prepare gives every rank rank 0's weights
    model, forward, eval_forward, optimizers = build_model(plan, get_backend("sdpa", kernel="math"), bos_id=1)
    world.prepare(model, optimizers)
    results: list = []
    batches_scored = [0]

    def counted(x, y):
        batches_scored[0] += 1
        return eval_forward(x, y)

    class Recording(PeriodicEval):
        def __call__(self):
            batches_scored[0] = 0
            res = super().__call__()
            results.append((res.val_loss, res.val_bpb, res.tokens, batches_scored[0]))
            return res

    def batches(seq_len, micro_batch, position=0):
        stream = TokenStream([shard], seq_len, micro_batch, rank=world.rank, world_size=world.world_size)
        stream.load_state_dict({"position": position})
        return stream

    vocab = plan.model.vocab_size
    evaluator = Recording(plan, model, counted, _val_tokens(vocab), _luts(vocab), shard=world)
    stepper = Stepper(model, forward, optimizers, plan, world=world)
    records: list = []
    extras = LoopExtras(plan, shard.parent, stepper=stepper, evaluator=evaluator, meta={}, on_metrics=records.append)
    extras.warm()  # step 0: what the loop's warm-up scores
    state = train(
        stepper, batches, state=TrainState(), log=lambda _: None, on_metrics=records.append, between_steps=extras
    )
    vals = [(r["step"], r["val_loss"], r["val_bpb"]) for r in records if "val_bpb" in r]
    return {"results": results, "vals": vals, "steps": state.steps}


def _validate(rank: int, world, plan, shard: str) -> dict:
    return _train_with_periodic_eval(plan, Path(shard), world)


def test_two_ranks_validate_periodically_like_one_process(compose, tmp_path):
    """eval.every_steps=2 over 4 steps: evaluations at steps 2 and 4 on both ranks, the same numbers on both. The
    first (warm-up, step 0: the same weights) equals one process's to 1e-12 (the sharded sums are exact; measured:
    bit for bit); after training the weights differ by the gradient sums' order (test_dist: losses within 2e-6
    relative), so the periodic val_loss / val_bpb are held to 1e-5 relative (measured: equal here). Only rank 0 writes val records."""
    from speedrun.core.dist import SINGLE
    from speedrun.data.shards import write_shard

    shard = tmp_path / "fineweb_train_000000.bin"
    write_shard(shard, torch.randint(0, 1024, (40_000,), generator=torch.Generator().manual_seed(2)).numpy())
    one = plan_for(compose, *PERIODIC)
    two = plan_for(compose, *PERIODIC, world=WorldInfo("torchrun", 0, 2, 0, 2, 0))
    assert (one.grad_accum, two.grad_accum, two.eval.every_steps) == (4, 2, 2)
    r0, r1 = on_ranks(_validate, two, str(shard), out_dir=tmp_path, plan=two)
    torch.set_num_threads(1)
    single = _train_with_periodic_eval(one, shard, SINGLE)
    assert r0["steps"] == r1["steps"] == single["steps"] == 4
    assert r0["results"] == r1["results"]  # all-reduced: every rank holds the same numbers, at the same steps
    assert len(r0["results"]) == len(single["results"]) == 3  # warm-up, steps 2 and 4
    assert [step for step, *_ in single["vals"]] == [step for step, *_ in r0["vals"]] == [2, 4]
    assert r1["vals"] == []  # rank 0 writes the val records
    (loss0, bpb0, tok0, n0), (loss1, bpb1, tok1, n1) = r0["results"][0], single["results"][0]
    assert tok0 == tok1 == 512
    assert (n0, n1) == (4, 8)  # sharded: each rank scores 4 of the 8 batches of windows
    assert abs(loss0 - loss1) <= 1e-12 and abs(bpb0 - bpb1) <= 1e-12
    for (_, loss_a, bpb_a), (_, loss_b, bpb_b) in zip(r0["vals"], single["vals"]):
        assert abs(loss_a - loss_b) <= 1e-5 * loss_b and abs(bpb_a - bpb_b) <= 1e-5 * bpb_b


def test_periodic_validation_resolves_on_several_ranks(compose):
    ranks = WorldInfo(visible_gpus=2)
    for extra in (["eval.every_steps=10"], ["eval.every_seconds=30"]):
        plan = resolve(to_config(compose(["dist.nproc=2", *extra])), fake_device("h100"), world=ranks)
        assert plan.world_size == 2 and plan.eval.periodic
