"""eval.include_tail (the validation tail that does not fill a window is scored too) and the byte sidecar (a target's
bytes read at its stream position, CaseOps data's original bytes) in the standard, sliding and TTT scoring."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speedrun.config import to_config
from speedrun.core.data import ByteLUTs, load_val_tokens, token_bytes
from speedrun.core.evaluate import evaluate, evaluate_sliding
from speedrun.data.bpb import stream_bytes
from speedrun.data.shards import write_shard
from speedrun.plan import resolve
from support.devices import fake_device
from support.tiny import TINY, tiny_gpt

T = 32


def ones(vocab: int) -> ByteLUTs:
    """Every token one byte: the byte sums count the targets."""
    return ByteLUTs(
        torch.ones(vocab, dtype=torch.int16), torch.zeros(vocab, dtype=torch.bool), torch.zeros(vocab, dtype=torch.bool)
    )


def positions_scored(fn, tokens: torch.Tensor, **kwargs) -> tuple[torch.Tensor, object]:
    """How often each stream position was scored, and the result."""
    counts = torch.zeros(tokens.numel(), dtype=torch.int64)

    def seen(positions, nats):
        counts.index_add_(0, positions.cpu(), torch.ones_like(positions.cpu()))

    res = fn(
        lambda x, y: y.double(),
        tokens,
        ones(tokens.numel()),
        device="cpu",
        autocast_dtype=None,
        **kwargs,
        on_token_scores=seen,
    )
    return counts, res


def test_load_val_tokens_keeps_the_tail_only_when_asked(tmp_path):
    shard = tmp_path / "fineweb_val_000000.bin"
    write_shard(shard, np.arange(1, 101, dtype=np.uint16))  # 100 tokens: 99 targets, 3 windows of 32 and 3 more
    assert load_val_tokens([shard], None, T).numel() == 3 * T + 1
    kept = load_val_tokens([shard], None, T, include_tail=True)
    assert kept.tolist() == list(range(1, 101))
    assert load_val_tokens([shard], 90, T, include_tail=True).numel() == 90  # eval.tokens still caps it


@pytest.mark.parametrize("n", [3 * T + 1, 3 * T + 4, 5 * T + T - 1])
def test_standard_eval_scores_the_tail_once_with_a_window_ending_at_the_last_token(n):
    tokens = torch.arange(n)
    counts, res = positions_scored(evaluate, tokens, seq_len=T, batch_size=2, include_tail=True)
    m = n - 1
    # without include_tail (the default) the targets past the last full window are not read
    default_counts, default = positions_scored(evaluate, tokens, seq_len=T, batch_size=2)
    assert default.tokens == m // T * T and int(default_counts[m // T * T + 1 :].sum()) == 0
    assert counts[0] == 0 and bool((counts[1:] == 1).all())
    # forward's 'loss' is the target id = its position: the sum is 1 + ... + M only with the tail scored once
    assert res.tokens == res.tokens_total == m and res.bytes == m
    assert res.val_loss * m == pytest.approx(m * (m + 1) / 2)


def test_the_tail_window_has_full_context_and_the_tail_changes_the_score():
    """On a tiny GPT: the tail's targets are scored by a full window ending at the last token (the same nats as
    scoring that window alone), and keeping the tail changes tokens, bytes and val_loss from the cut split."""
    model = tiny_gpt(TINY, seed=0).eval()
    g = torch.Generator().manual_seed(3)
    full = torch.randint(1, TINY.vocab_size, (2 * T + 9,), generator=g)  # 2 windows and an 8-target tail
    luts = ByteLUTs(
        torch.randint(1, 4, (TINY.vocab_size,), generator=g).to(torch.int16),
        torch.zeros(TINY.vocab_size, dtype=torch.bool),
        torch.zeros(TINY.vocab_size, dtype=torch.bool),
    )

    def forward(x, y):
        return model(x, y, reduction="none")

    kw = dict(seq_len=T, batch_size=4, device="cpu", autocast_dtype=None)
    cut = evaluate(forward, full[: 2 * T + 1], luts, **kw)
    kept = evaluate(forward, full, luts, include_tail=True, **kw)
    assert evaluate(forward, full, luts, **kw).tokens == cut.tokens  # the default leaves the tail unscored
    tail_nats = forward(full[-T - 1 : -1][None], full[-T:][None])[0, -8:].double().sum().item()
    tail_bytes = int(luts.base_bytes[full[-8:]].sum())
    assert (cut.tokens, kept.tokens) == (2 * T, 2 * T + 8)
    assert kept.bytes == cut.bytes + tail_bytes
    assert kept.val_loss * kept.tokens == pytest.approx(cut.val_loss * cut.tokens + tail_nats, rel=1e-9)
    assert kept.val_bpb != pytest.approx(cut.val_bpb, abs=1e-6)
    # the sliding eval (stride < window) on the kept stream scores the same targets, the tail included
    sliding = evaluate_sliding(forward, full, luts, stride=T // 2, **kw)
    assert sliding.tokens == kept.tokens and sliding.bytes == kept.bytes


def test_include_tail_reaches_the_plan(compose):
    plan = resolve(to_config(compose(["debug=smoke", "eval.include_tail=true"])), fake_device("cpu"))
    assert plan.eval.include_tail is True
    assert resolve(to_config(compose(["debug=smoke"])), fake_device("cpu")).eval.include_tail is False


def with_sidecar(luts: ByteLUTs, sidecar: torch.Tensor) -> ByteLUTs:
    return ByteLUTs(luts.base_bytes, luts.has_leading_space, luts.is_boundary, sidecar.to(torch.int32))


def test_the_sidecar_gives_each_target_its_bytes_by_position_not_by_id():
    tokens = torch.tensor([0, 5, 5, 5, 0, 5])  # one id everywhere: by id every target would count alike
    sidecar = torch.tensor([0, 1, 2, 3, 0, 7])
    luts = with_sidecar(ones(8), sidecar)
    x, y = tokens[:-1][None], tokens[1:][None]
    with pytest.raises(ValueError, match="pass the targets' positions"):
        token_bytes(x, y, luts)
    assert token_bytes(x, y, luts, torch.arange(1, 6)[None]).tolist() == [[1, 2, 3, 0, 7]]
    assert stream_bytes(tokens, luts) == 13
    assert stream_bytes(tokens, ones(8)) == 5


@pytest.mark.parametrize("stride", [None, 12, T])
def test_standard_and_sliding_scores_count_the_sidecars_bytes(stride):
    g = torch.Generator().manual_seed(5)
    n = 4 * T + 7
    tokens = torch.randint(1, 64, (n,), generator=g)
    sidecar = torch.randint(0, 9, (n,), generator=g)
    luts = with_sidecar(ones(64), sidecar)
    kw = dict(seq_len=T, batch_size=3, device="cpu", autocast_dtype=None)
    if stride is None:
        res = evaluate(lambda x, y: torch.ones_like(y, dtype=torch.float32), tokens, luts, include_tail=True, **kw)
    else:
        res = evaluate_sliding(lambda x, y: torch.ones_like(y, dtype=torch.float32), tokens, luts, stride=stride, **kw)
    assert res.tokens == n - 1 and res.bytes == int(sidecar[1:].sum())


def test_ttt_chunk_steps_count_the_sidecars_bytes():
    """speedrun.core.ttt_graphs.chunk_step scores chunks of rows (window begin, length, first scored column): with a
    sidecar the bytes are those of the scored targets' positions."""
    from speedrun.core.ttt_graphs import chunk_step

    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(1, 64, (100,), generator=g)
    sidecar = torch.randint(0, 9, (100,), generator=g)
    luts = with_sidecar(ones(64), sidecar)
    # row 0: window at 10 of 12 inputs, scoring columns 4..11 (targets 15..22); row 1: at 40, 6 inputs, all scored
    rows = torch.tensor([[10, 40], [12, 6], [4, 0], [0, 0]])

    def nats_of(fn, x, y, pick):
        out = torch.ones_like(y, dtype=torch.float32)
        return out if pick is None else out.gather(1, pick)

    for pick_width in (None, 8):
        out = chunk_step(None, tokens, luts, rows, 12, False, nats_of, pick_width=pick_width)
        expected = int(sidecar[15:23].sum()) + int(sidecar[41:47].sum())
        assert int(out.n_bytes) == expected, pick_width
