"""Periodic validation on several ranks (training.periodic with a World): two gloo ranks on CPU against one process.

The periodic evaluation shards its fixed slice over the ranks and all-reduces float64 sums (as the final eval does),
so every rank holds the same val_loss / val_bpb, equal to one process scoring the same weights; it runs at the same
steps on every rank, and only rank 0 writes the val records."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from conftest import fake_device, start_ranks
from speedrun.config import to_config
from speedrun.plan import WorldInfo, resolve
from test_dist import TINY_RUN, _free_port, _luts, _val_tokens, plan_for

PERIODIC = [*TINY_RUN, "eval.every_steps=2", "eval.periodic_tokens=512"]  # 16 windows of 32: 8 batches of 2


def _train_with_periodic_eval(plan, shard: Path, world) -> dict:
    """Train with the real loop and LoopExtras (real PeriodicEval, sharded over ``world``); returns every result
    the evaluator computed on this rank (step 0: before training, the same weights everywhere) and the records
    this rank wrote."""
    from speedrun.data.loader import TokenStream
    from speedrun.model.attention import get_backend
    from speedrun.training.build import build_model
    from speedrun.training.loop import Stepper, TrainState, train
    from speedrun.training.periodic import LoopExtras, PeriodicEval

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
    state = train(stepper, batches, state=TrainState(), log=lambda _: None, on_metrics=records.append, extras=extras)
    vals = [(r["step"], r["val_loss"], r["val_bpb"]) for r in records if "val_bpb" in r]
    return {"results": results, "vals": vals, "steps": state.steps}


def _rank_main(rank: int, port: int, plan, shard: str, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
    )
    torch.set_num_threads(1)
    from speedrun.distributed import world as dist

    world = dist.current()
    world.init(plan)
    out = _train_with_periodic_eval(plan, Path(shard), world)
    torch.save(out, Path(out_dir) / f"r{rank}.pt")
    world.shutdown(clean=True)


def test_two_ranks_validate_periodically_like_one_process(compose, tmp_path):
    """eval.every_steps=2 over 4 steps: evaluations at steps 2 and 4 on both ranks, the same numbers on both. The
    first (warm-up, step 0: the same weights) equals one process's to 1e-12 (the sharded sums are exact; measured:
    bit for bit); after training the weights differ by the gradient sums' order (test_dist: losses within 2e-6
    relative), so the periodic val_loss / val_bpb are held to 1e-5 relative (measured: equal here). Only rank 0 writes val records."""
    from speedrun.data.shards import write_shard
    from speedrun.distributed.world import SINGLE

    shard = tmp_path / "fineweb_train_000000.bin"
    write_shard(shard, torch.randint(0, 1024, (40_000,), generator=torch.Generator().manual_seed(2)).numpy())
    one = plan_for(compose, *PERIODIC)
    two = plan_for(compose, *PERIODIC, world=WorldInfo("torchrun", 0, 2, 0, 2, 0))
    assert (one.grad_accum, two.grad_accum, two.eval.every_steps) == (4, 2, 2)
    start_ranks(_rank_main, (_free_port(), two, str(shard), str(tmp_path)))
    r0, r1 = (torch.load(tmp_path / f"r{r}.pt", weights_only=False) for r in (0, 1))
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
