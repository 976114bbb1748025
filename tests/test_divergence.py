"""A run whose loss blows up is recorded diverged, not ok. The divergence verdict on lists of losses, the training
loop carrying it (every step judged, also when metrics.jsonl keeps one record per flush; kept across a
checkpoint), and the throttled progress line of the long phases after training."""

from __future__ import annotations

import dataclasses
import io
import math

import pytest
import torch

from conftest import fake_device
from speedrun.config import to_config
from speedrun.plan import resolve
from speedrun.progress import Progress
from speedrun.training.dense_metrics import DIVERGENCE_MARGIN, EARLY_MARGIN, SMOOTH_STEPS, divergence

LN_1024 = math.log(1024)

# what CPU runs printed (metrics.jsonl), start to end
ISSUE_RUN = [6.93, 11.8, 15.0]  # model=pgolf_baseline budget.train_seconds=10: 3 steps, val_loss 17.1
FAST_RUN = [6.928, 7.502]  # tests/test_run_outcomes.py: 2 steps of 256 tokens
SMOKE_RUN = [6.929, 6.749, 5.991, 6.095]  # debug=smoke
TINY_BATCHES = [6.928, 7.502, 6.659, 6.972, 7.148, 6.957, 6.401, 6.285, 7.4, 6.872]
TINY_BATCHES += [6.534, 6.081, 6.023, 6.974, 6.748, 6.552, 5.87, 6.139, 6.514, 6.192]


# ---------------------------------------------------------------------------------------------------------
# the verdict


def test_the_issue_run_is_diverged_at_its_end():
    found = divergence(ISSUE_RUN, 1024)
    assert found is not None and found.step == 3
    assert found.reason == (
        "training loss rose from 6.9300 at step 1 to 13.4000 (mean of steps 2-3, last 15.0000), "
        f"above ln(1024) = {LN_1024:.4f} (uniform guessing)"
    )


@pytest.mark.parametrize("losses", [FAST_RUN, SMOKE_RUN, TINY_BATCHES], ids=["fast", "smoke", "tiny-batches"])
def test_short_and_noisy_runs_that_trained_are_not_diverged(losses):
    assert divergence(losses, 1024) is None


def test_a_rise_in_the_middle_that_comes_back_down_is_training():
    assert divergence([6.93] + [5.0] * 50 + [9.5] * 30 + [4.5] * 20, 1024) is None


def test_neither_a_last_spike_nor_a_spike_just_before_the_last_step_decides():
    healthy = [6.93] + [4.0] * 100
    assert divergence(healthy + [14.0], 1024) is None  # the mean of the last steps is fine
    assert divergence(healthy + [40.0, 4.0], 1024) is None  # the last step is fine
    assert divergence(healthy + [14.0] * SMOOTH_STEPS, 1024) is not None  # both are not


def test_the_margin_is_what_a_loss_may_rise_above_its_first():
    first = 6.5  # below ln(1024): only the rise counts
    steady = [first] + [first + DIVERGENCE_MARGIN - 0.01] * SMOOTH_STEPS
    assert divergence(steady, 1024) is None
    found = divergence([first] + [first + DIVERGENCE_MARGIN + 0.01] * SMOOTH_STEPS, 1024)
    assert found is not None and found.reason.startswith("training loss rose from 6.5000 at step 1 to 7.5100")
    assert "uniform" not in found.reason


def test_a_short_run_gets_the_early_margin():
    """Before SMOOTH_STEPS steps a bounce of a nat or two is the start of training; a blow-up is many nats."""
    assert divergence([6.92, 8.20], 1024) is None  # the tiny preset's 2-step sweep job
    assert divergence([6.5, 6.5 + EARLY_MARGIN - 0.01], 1024) is None
    found = divergence([6.5, 6.5 + EARLY_MARGIN + 0.01], 1024)
    assert found is not None and found.reason.startswith(
        "training loss rose from 6.5000 at step 1 to 10.5100 at step 2"
    )


def test_a_run_that_ends_above_uniform_guessing_is_diverged_even_below_its_first_loss():
    found = divergence([14.0, 13.0, 12.5, 12.0], 1024)  # started worse than uniform and stayed there
    assert found is not None and found.step == 4
    assert found.reason.startswith("training loss ended at 12.5000 (mean of steps 2-4, last 12.0000)")
    assert found.reason.endswith("above ln(1024) = 6.9315 (uniform guessing)")
    assert divergence([14.0, 13.0, 12.5, 9.5], 1024) is None  # last step within the early margin of uniform
    long = [14.0] + [8.5] * SMOOTH_STEPS  # a long run: the 1-nat margin
    assert divergence(long, 1024) is not None and divergence(long[:-1] + [7.5], 1024) is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_loss_diverges_at_its_step_whatever_follows(bad):
    found = divergence([6.9, 5.0, bad, 4.0], 1024, start_step=11)
    assert found is not None and found.step == 13
    assert found.reason == f"non-finite training loss ({bad}) at step 13"


def test_nothing_to_judge():
    assert divergence([], 1024) is None
    assert divergence([25.0], 1024) is None  # one step: the run has not trained yet


def test_the_loop_form_last_steps_and_the_first_loss_judges_as_the_whole_run():
    runs = [ISSUE_RUN, SMOKE_RUN, TINY_BATCHES, [6.93] + [5.0] * 40 + [12.0] * 12, [6.93] + [3.0] * 30]
    for losses in runs:
        tail = losses[-SMOOTH_STEPS:]
        start = len(losses) - len(tail) + 1
        assert divergence(tail, 1024, start_step=start, first=(1, losses[0])) == divergence(losses, 1024)


# ---------------------------------------------------------------------------------------------------------
# the training loop


class Batches:
    def __init__(self, *args, position=0, **kwargs):
        self.position = position

    def __next__(self):
        self.position += 1
        return None

    def state_dict(self):
        return {"position": self.position}


def make_batches(seq_len, micro_batch, position=0):
    return Batches(position=position)


class Scripted:
    """A Stepper whose steps return the given losses (device tensors, as the real one does)."""

    def __init__(self, plan, losses):
        from speedrun.distributed.world import SINGLE

        self.plan, self.losses, self.optimizers, self.world = plan, iter(losses), [], SINGLE
        self.ema = None  # the loop updates a Stepper's weight average after each step; these steps have none

    def __call__(self, batches):
        next(batches)
        return torch.tensor(next(self.losses))


def plan_for(compose, steps: int, *overrides: str):
    cfg = compose(
        [
            "model=tiny",
            f"budget.max_steps={steps}",
            "budget.train_seconds=600",
            "budget.warmup_steps=0",
            "schedule.progress=step",
            *overrides,
        ]
    )
    return resolve(to_config(cfg), fake_device("cpu"))


def train_on(plan, losses, state=None):
    from speedrun.training.loop import TrainState, train

    records = []
    state = train(
        Scripted(plan, losses),
        make_batches,
        state=state or TrainState(),
        log=lambda _: None,
        on_metrics=records.append,
    )
    return state, records


def test_the_loop_records_the_issue_runs_divergence(compose):
    plan = plan_for(compose, 3)
    assert plan.model.vocab_size == 1024
    state, _ = train_on(plan, ISSUE_RUN)
    assert state.diverged and state.diverged_step == 3 and state.steps == 3
    assert state.divergence == divergence(ISSUE_RUN, 1024).reason
    assert (state.first_loss, state.first_loss_step) == (pytest.approx(6.93), 1)


def test_a_healthy_run_is_not_diverged_and_keeps_its_last_losses(compose):
    losses = [6.93] + [5.0] * 10 + [9.0] * 5 + [4.0] * 14
    state, records = train_on(plan_for(compose, len(losses)), losses)
    assert not state.diverged and state.diverged_step is None and state.divergence is None
    assert state.recent_losses == pytest.approx(losses[-SMOOTH_STEPS:])
    assert [r["step"] for r in records] == list(range(1, len(losses) + 1))  # dense: every step written


def test_a_non_finite_loss_is_caught_at_the_next_flush_and_named_by_its_step(compose):
    losses = [6.93, 6.0, 5.5, 5.0, float("nan"), 4.0, 4.0, 4.0, 4.0, 4.0]
    state, records = train_on(plan_for(compose, 10, "logger.flush_every_steps=4"), losses)
    assert state.diverged and state.diverged_step == 5 and state.steps == 8  # the flush after steps 5-8
    assert state.divergence == "non-finite training loss (nan) at step 5"
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5] and math.isnan(records[-1]["train_loss"])


def test_every_step_is_judged_when_metrics_keep_one_record_per_flush(compose):
    # dense=false writes the last record of each flush only: the loss of the steps between is still seen
    losses = [6.93, 5.0, 5.0, float("inf"), 5.0, 5.0]
    state, records = train_on(plan_for(compose, 6, "logger.dense=false", "logger.flush_every_steps=6"), losses)
    assert state.diverged_step == 4 and len(records) == 1
    rising = [6.93, 5.0, 5.0, 5.0, 5.0, 5.0] + [9.0] * SMOOTH_STEPS
    plan = plan_for(compose, len(rising), "logger.dense=false", "logger.flush_every_steps=5")
    state, records = train_on(plan, rising)
    assert state.diverged and state.divergence.startswith("training loss rose from 6.9300 at step 1 to 9.0000")
    assert len(records) < len(rising)


def test_a_resumed_run_is_judged_against_the_first_loss_of_the_whole_run(compose):
    from speedrun.training.loop import TrainState

    state, _ = train_on(plan_for(compose, 5), [6.93, 6.0, 5.0, 4.5, 4.0])
    assert not state.diverged
    # a checkpoint keeps the progress as plain values and loads them with weights_only=True
    buf = io.BytesIO()
    torch.save({"progress": dataclasses.asdict(state)}, buf)
    buf.seek(0)
    progress = torch.load(buf, weights_only=True)["progress"]
    resumed = TrainState(**{k: v for k, v in progress.items() if k != "budget_end"})
    resumed, _ = train_on(plan_for(compose, 20), [8.5] * 15, state=resumed)
    assert resumed.steps == 20 and resumed.diverged and resumed.diverged_step == 20
    assert resumed.divergence.startswith("training loss rose from 6.9300 at step 1 to 8.5000 (mean of steps 11-20")


# ---------------------------------------------------------------------------------------------------------
# the progress line


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


def tiny_gpt(seq_len: int = 16):
    from speedrun.model.attention import get_backend
    from speedrun.model.gpt import GPT
    from speedrun.model.shape import ModelShape

    torch.manual_seed(0)
    shape = ModelShape(vocab_size=64, n_layer=2, d_model=32, n_head=4, n_kv_head=2, mlp_mult=2, seq_len=seq_len)
    model = GPT(shape, get_backend("sdpa", kernel="math"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def luts64():
    from speedrun.data.bpb import ByteLUTs

    base = torch.full((64,), 2, dtype=torch.int16)
    base[0] = 0
    boundary = torch.zeros(64, dtype=torch.bool)
    boundary[0] = True
    return ByteLUTs(base, torch.arange(64) % 3 == 0, boundary)


def every_tick(label: str, lines: list[str], unit: str = "tokens") -> Progress:
    return Progress(label, lines.append, unit=unit, every=0)


def done_counts(lines: list[str]) -> list[str]:
    return [line.split(": ", 1)[1].split(" ", 1)[0] for line in lines]


@pytest.mark.parametrize("mode", ["standard", "sliding"])
def test_evaluation_ticks_after_every_batch_and_scores_the_same(mode):
    from speedrun.evaluation.evaluate import run_eval

    model = tiny_gpt()
    tokens = torch.randint(1, 64, (16 * 10 + 1,), generator=torch.Generator().manual_seed(1))
    kw = dict(seq_len=16, stride=8, batch_size=3, device="cpu", autocast_dtype=None)

    def forward(x, y):
        return model(x, y, reduction="none")

    lines: list[str] = []
    ticked = run_eval(mode, forward, tokens, luts64(), progress=every_tick("eval", lines), **kw)
    assert ticked == run_eval(mode, forward, tokens, luts64(), **kw)
    # standard: 10 windows of 16 in batches of 3; sliding: 19 windows (the first scores 16, the others 8)
    expected = ["48/160", "96/160", "144/160", "160/160"] if mode == "standard" else ["32/160"]
    assert done_counts(lines)[: len(expected)] == expected and done_counts(lines)[-1] == "160/160"
    assert lines[-1].startswith("eval: 160/160 tokens (100.0%), ")


def test_gptq_ticks_per_calibration_batch_and_per_matrix():
    from speedrun.quant import quantize as Q

    model = tiny_gpt()
    batches = [(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))) for _ in range(3)]
    lines: list[str] = []
    H = Q.collect_hessians(model, iter(batches), 3, device="cpu", progress=every_tick("hessians", lines, "batches"))
    Q.quantize_state_dict_gptq(
        model.state_dict(),
        H,
        bits=6,
        embed_bits=8,
        damp=0.01,
        block_size=8,
        clip_ratios=[1.0],
        progress=every_tick("gptq", lines, "matrices"),
    )
    assert done_counts(lines) == ["1/3", "2/3", "3/3"] + [f"{i}/{len(H)}" for i in range(1, len(H) + 1)]


def test_ttt_ticks_its_share_of_tokens(monkeypatch):
    import functools

    import speedrun.ttt.score_first

    monkeypatch.setattr(speedrun.ttt.score_first, "Progress", functools.partial(Progress, every=0))
    g = torch.Generator().manual_seed(0)
    parts = []
    for n in (9, 30, 17):
        parts += [torch.tensor([0]), torch.randint(1, 64, (n - 1,), generator=g)]
    tokens = torch.cat(parts)
    lines: list[str] = []
    settings = speedrun.ttt.score_first.LoRASettings(rank=2, lr=0.01, chunk_size=8)
    res = speedrun.ttt.score_first.ttt_evaluate(
        tiny_gpt(24), tokens, luts64(), settings, bos_id=0, seq_len=24, log=lines.append
    )
    ticks = [line for line in lines if line.startswith("ttt: ")]
    assert ticks and ticks[-1].startswith(f"ttt: {res.tokens_total}/{res.tokens_total} tokens (100.0%)")


def payload() -> bytes:
    """A serialized int6 state dict of about 600 KB: what the compressors see, over several of brotli's blocks."""
    g = torch.Generator().manual_seed(0)
    packed = {
        f"w{i}": {"q": torch.clamp(torch.round(torch.randn(256, 512, generator=g) * 6), -31, 31).to(torch.int8)}
        for i in range(4)
    }
    packed["emb"] = {"half": torch.randn(128, 256, generator=g).half()}
    buf = io.BytesIO()
    torch.save(packed, buf)
    return buf.getvalue()


def test_chunked_compression_gives_the_one_shot_bytes_at_every_level():
    """The artifact's bytes must not change with its progress: at every level, chunks small and odd-sized
    (a multiple of nothing), the streamed output equals the compressor's one-shot call; levels that do not
    stream identically (STREAMS) compress in one call."""
    import importlib.util

    from speedrun.config import compressors
    from speedrun.quant import quantize as Q

    data = payload()
    streamed = []
    for name, (lo, hi) in compressors.LEVELS.items():
        if name in compressors.MODULES and importlib.util.find_spec(compressors.MODULES[name]) is None:
            continue
        for level in range(lo, hi + 1):
            streams = name in Q.STREAMS and Q.STREAMS[name][1](level)
            if not streams and level > lo or name == "lzma" and level not in (0, 6, 9):
                continue  # the one-shot call itself / three presets cover lzma's match finders
            one_shot = Q.COMPRESSORS[name][0](data, level)
            for chunk in (4099, 1 << 16):
                assert Q.compress(data, name, level, chunk_bytes=chunk) == one_shot, (name, level, chunk)
            streamed += [f"{name}-{level}"] if streams else []
    assert {"zlib-1", "zlib-9", "lzma-9", "brotli-11"} <= set(streamed)
    assert Q.STREAMS["zlib"][1](0) is False and Q.STREAMS["brotli"][1](9) is False and "zstd" not in Q.STREAMS


def test_compression_says_what_it_compresses_and_how_long_it_took():
    from speedrun.quant import quantize as Q

    data = payload()
    lines: list[str] = []
    blob = Q.compress(data, "lzma", 6, log=lines.append, chunk_bytes=1 << 16, progress_every=0)
    assert blob == lzma_one_shot(data, 6)
    mb = len(data) / 1e6
    assert lines[0] == f"compressing {mb:,.1f} MB with lzma-6 ..."
    ticks = lines[1:-1]
    assert len(ticks) == math.ceil(len(data) / (1 << 16)) and ticks[-1].startswith(
        f"compress (lzma-6): {mb:,.1f}/{mb:,.1f} MB (100.0%)"
    )
    assert lines[-1].startswith(f"compressed to {len(blob) / 1e6:,.2f} MB with lzma-6 in ")
    lines.clear()
    Q.compress(data, "zlib", 0, log=lines.append, progress_every=0)  # one call: the lines around it only
    assert len(lines) == 2 and lines[0].startswith("compressing") and lines[1].startswith("compressed to")


def lzma_one_shot(data: bytes, preset: int) -> bytes:
    import lzma

    return lzma.compress(data, preset=preset)
