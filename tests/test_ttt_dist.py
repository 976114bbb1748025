"""TTT and evaluation on two gloo ranks against one process: documents and batches dealt over the ranks, float64
sums all-reduced, global phases with averaged gradients (every rank's model the same), and a time budget that
every rank obeys at the same batch."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch

from conftest import start_ranks
from speedrun.ttt.global_phases import GlobalSettings
from speedrun.ttt.score_first import LoRASettings

SEQ = 24
PHASED = LoRASettings(
    rank=4, lr=0.05, chunk_size=8, batch_size=2, targets="q,v,head,mlp_bypass", alpha=8.0, beta1=0.0, beta2=0.999,
    weight_decay=0.5, phased=GlobalSettings(phases=2, prefix_docs=6, lr=0.05, chunk_tokens=64, batch_seqs=3),
    warm_start_a=True, warm_start_chains=2, max_batch_share=0.2,
)  # fmt: skip
"""A carried from batch to batch along 2 chains: one per rank on two ranks, both on the one process; the heavier
of the 5 batches of 2 halved (max_batch_share), the same on both."""
SLOW_WARM_UP = 4.0
"""Seconds rank 1's TTT warm-up is held up by: TTT's clock starts when every rank is ready, so it is not counted."""


def _tokens() -> torch.Tensor:
    from test_ttt import docs_stream

    return docs_stream([37, 20, 51, 29, 44, 33, 26, 48, 31, 40], seed=4)


def _score(world) -> dict:
    """What a rank (or the one process, world None) measures: evals, a direct global fine-tune, phased TTT."""
    from speedrun.evaluation.evaluate import run_eval
    from speedrun.ttt.global_phases import finetune
    from speedrun.ttt.lora import LoRAModel
    from speedrun.ttt.score_first import split_documents, ttt_evaluate
    from test_ttt import BOS, luts
    from test_ttt_score_first import model

    torch.set_num_threads(1)
    m, tokens = model(), _tokens()
    out: dict = {}
    forward = lambda x, y: m(x, y, reduction="none")  # noqa: E731
    kw = dict(seq_len=SEQ, batch_size=2, device="cpu", autocast_dtype=None, shard=world)
    out["standard"] = run_eval("standard", forward, tokens, luts(), stride=None, **kw)
    out["sliding"] = run_eval("sliding", forward, tokens, luts(), stride=8, **kw)
    out["cut"] = run_eval("standard", forward, tokens, luts(), stride=None, max_seconds=1e-9, **kw)
    lora = LoRAModel(m, ("q",), rank=2, slots=1, seed=0)
    with lora.bare() as bare:
        finetune(bare, tokens, split_documents(tokens, BOS), PHASED.phased, seq_len=SEQ, device="cpu",
                 autocast_dtype=None, shard=world)  # fmt: skip
        out["tuned"] = torch.cat([p.detach().flatten() for p in lora.base_parameters()])
    if world is not None and world.rank == 1:  # a rank whose compile warm-up takes longer than the other's
        from speedrun.ttt import score_first as ttt_module

        warm_up = ttt_module.make_scorers
        ttt_module.make_scorers = lambda *a, **k: (time.sleep(SLOW_WARM_UP), warm_up(*a, **k))[1]
    out["ttt"] = ttt_evaluate(m, tokens, luts(), PHASED, bos_id=BOS, seq_len=SEQ, shard=world)
    if world is not None:
        out["ranks_tuned"] = world.gather(out["tuned"])
    return out


def _rank_main(rank: int, port: int, out_path: str) -> None:
    import torch.distributed as dist

    from speedrun.distributed.world import World
    from speedrun.plan import WorldInfo

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    out = _score(World(WorldInfo("torchrun", rank, 2, rank, 2, 0)))
    if rank == 0:
        torch.save(out, out_path)
    dist.barrier()  # both ranks done before either tears gloo down (a rank leaving early can abort its peer)
    dist.destroy_process_group()


def test_two_ranks_evaluate_and_test_time_train_like_one_process(tmp_path):
    """Evals: bit for bit (each float64 slot has one non-zero term). A time budget spent at once: both ranks stop
    after the first round, so the two scored batches are the stream's first two, bit for bit the one-process eval
    of them. Global fine-tune: both ranks hold the same weights, the one-process weights to 1e-6 (the gradient
    is summed in another order). Phased TTT with warm-started A: the same tokens, bytes and documents, val_bpb to
    1e-6 (with A carried along each rank's batches instead of chains, 2.6675 against 2.6717)."""
    from speedrun.evaluation.evaluate import run_eval
    from test_ttt import luts
    from test_ttt_score_first import model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_ranks(_rank_main, (port, str(tmp_path / "r0.pt")))
    two = torch.load(tmp_path / "r0.pt", weights_only=False)
    one = _score(None)
    assert two["standard"] == one["standard"] and two["sliding"] == one["sliding"]
    cut = two["cut"]
    assert not cut.complete and cut.tokens == 2 * 2 * SEQ and cut.tokens_total == one["standard"].tokens
    m = model()
    prefix = run_eval("standard", lambda x, y: m(x, y, reduction="none"), _tokens()[: cut.tokens + 1], luts(),
                      seq_len=SEQ, stride=None, batch_size=2, device="cpu", autocast_dtype=None)  # fmt: skip
    assert (cut.val_loss, cut.val_bpb, cut.bytes) == (prefix.val_loss, prefix.val_bpb, prefix.bytes)
    r0, r1 = two["ranks_tuned"]
    assert torch.equal(r0, r1) and not torch.equal(r0, torch.cat([p.flatten() for p in model().parameters()]))
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
