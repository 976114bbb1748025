"""The throttled progress line of the long phases (speedrun.progress.Progress): at most one line an interval, with
its units, total and time left; evaluation, GPTQ and TTT tick it as they go, and score the same."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from speedrun.progress import Progress
from support.tiny import TINY, byte_luts, tiny_gpt


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_prints_at_most_every_interval():
    clock, lines = FakeClock(), []
    p = Progress("eval", lines.append, clock=clock)
    for t, done in [(5, 1000), (29.9, 5000), (30, 12_345), (45, 20_000), (59.9, 30_000), (61, 40_000), (200, 100_000)]:
        clock.now = 100.0 + t
        p.tick(done, 1_400_000)
    assert lines == [
        "eval: 12,345/1,400,000 tokens (0.9%), 30s, ~3,372s left",  # due 30 s after the start
        "eval: 40,000/1,400,000 tokens (2.9%), 61s, ~2,074s left",  # due 30 s after the line before (at 60 s)
        "eval: 100,000/1,400,000 tokens (7.1%), 200s, ~2,600s left",
    ]


def test_progress_units_totals_and_no_log():
    clock, lines = FakeClock(), []
    p = Progress("compress (lzma-9)", lines.append, unit="MB", every=10, clock=clock)
    clock.now += 10
    assert p.tick(3.0, 16.25)
    clock.now += 10
    assert p.tick(16.25, 16.25)
    clock.now += 10
    assert Progress("gptq", lines.append, unit="matrices", every=0, clock=clock).tick(7)
    assert lines == [
        "compress (lzma-9): 3.0/16.2 MB (18.5%), 10s, ~44s left",
        "compress (lzma-9): 16.2/16.2 MB (100.0%), 20s",
        "gptq: 7 matrices, 0s",
    ]
    silent = Progress("eval", None, every=0, clock=clock)
    assert not silent.tick(1, 2)


# ---------------------------------------------------------------------------------------------------------
# the long phases tick it: evaluation, GPTQ, compression, TTT


def every_tick(label: str, lines: list[str], unit: str = "tokens") -> Progress:
    return Progress(label, lines.append, unit=unit, every=0)


def done_counts(lines: list[str]) -> list[str]:
    return [line.split(": ", 1)[1].split(" ", 1)[0] for line in lines]


@pytest.mark.parametrize("mode", ["standard", "sliding"])
def test_evaluation_ticks_after_every_batch_and_scores_the_same(mode):
    from speedrun.core.evaluate import run_eval

    model = tiny_gpt(replace(TINY, seq_len=16)).eval()
    tokens = torch.randint(1, 64, (16 * 10 + 1,), generator=torch.Generator().manual_seed(1))
    kw = dict(seq_len=16, stride=8, batch_size=3, device="cpu", autocast_dtype=None)

    def forward(x, y):
        return model(x, y, reduction="none")

    lines: list[str] = []
    ticked = run_eval(mode, forward, tokens, byte_luts(), progress=every_tick("eval", lines), **kw)
    assert ticked == run_eval(mode, forward, tokens, byte_luts(), **kw)
    # standard: 10 windows of 16 in batches of 3; sliding: 19 windows (the first scores 16, the others 8)
    expected = ["48/160", "96/160", "144/160", "160/160"] if mode == "standard" else ["32/160"]
    assert done_counts(lines)[: len(expected)] == expected and done_counts(lines)[-1] == "160/160"
    assert lines[-1].startswith("eval: 160/160 tokens (100.0%), ")


def test_gptq_ticks_per_calibration_batch_and_per_matrix():
    from speedrun.core import gptq
    from speedrun.core import quant as Q

    model = tiny_gpt(replace(TINY, seq_len=16)).eval()
    batches = [(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))) for _ in range(3)]
    lines: list[str] = []
    H = gptq.collect_hessians(model, iter(batches), 3, device="cpu", progress=every_tick("hessians", lines, "batches"))
    settings = Q.QuantSettings(name="int6", bits=6, embed_bits=8, damp=0.01, block_size=8, clip_ratios=(1.0,))
    Q.quantize_int6(model.state_dict(), H, settings, every_tick("gptq", lines, "matrices"))
    assert done_counts(lines) == ["1/3", "2/3", "3/3"] + [f"{i}/{len(H)}" for i in range(1, len(H) + 1)]


def test_ttt_ticks_its_share_of_tokens(monkeypatch):
    import functools

    import speedrun.core.ttt_score

    monkeypatch.setattr(speedrun.core.ttt_score, "Progress", functools.partial(Progress, every=0))
    g = torch.Generator().manual_seed(0)
    parts = []
    for n in (9, 30, 17):
        parts += [torch.tensor([0]), torch.randint(1, 64, (n - 1,), generator=g)]
    tokens = torch.cat(parts)
    lines: list[str] = []
    settings = speedrun.core.ttt_score.TTTSettings(rank=2, lr=0.01, chunk_size=8)
    res = speedrun.core.ttt_score.ttt_evaluate(
        tiny_gpt(replace(TINY, seq_len=24)).eval(),
        tokens,
        byte_luts(),
        settings,
        bos_id=0,
        seq_len=24,
        log=lines.append,
    )
    ticks = [line for line in lines if line.startswith("ttt: ")]
    assert ticks and ticks[-1].startswith(f"ttt: {res.tokens_total}/{res.tokens_total} tokens (100.0%)")
