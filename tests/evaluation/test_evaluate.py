"""The eval group: sliding windows score every target exactly once (tail included), equal the standard eval when
the stride is the window, and document isolation goes through the backend's document mask."""

from __future__ import annotations

import types

import pytest
import torch

from speedrun.config import to_config
from speedrun.core.attention import get_backend
from speedrun.core.data import ByteLUTs
from speedrun.core.evaluate import document_mask, evaluate, evaluate_sliding, run_eval, sliding_windows
from speedrun.core.model import GPT
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from speedrun.run.finish import eval_fingerprint
from support.devices import fake_device
from support.tiny import TINY, tiny_gpt


def luts_for(vocab: int, seed: int = 0) -> ByteLUTs:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(1, 5, (vocab,), generator=g).to(torch.int16)
    lead = torch.rand(vocab, generator=g) < 0.5
    boundary = torch.zeros(vocab, dtype=torch.bool)
    boundary[0] = True
    base[0] = 0
    return ByteLUTs(base, lead, boundary)


def tiny_model(attn="sdpa", seed=0, **opts):
    if attn == "sdpa":
        opts.setdefault("kernel", "math")
    return tiny_gpt(TINY, seed=seed, attention=get_backend(attn, **opts)).eval()


def stream(n: int, vocab: int = 64, seed: int = 1, bos_every: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(1, vocab, (n,), generator=g)
    if bos_every:
        t[::bos_every] = 0
    return t


@pytest.mark.parametrize("seq_len", [1, 5, 32])
def test_sliding_windows_score_every_target_exactly_once(seq_len):
    for n_targets in range(1, 3 * seq_len + 7):
        for stride in range(1, seq_len + 1):
            windows = sliding_windows(n_targets, seq_len, stride)
            T = min(seq_len, n_targets)
            counts = torch.zeros(n_targets + 1, dtype=torch.int64)
            for i, (start, score_from) in enumerate(windows):
                assert 0 <= start and start + T <= n_targets and 0 <= score_from < T
                if i > 0:  # every later window keeps at least T - stride tokens of context
                    assert score_from >= T - stride
                counts[start + score_from + 1 : start + T + 1] += 1
            assert counts[0] == 0 and bool((counts[1:] == 1).all()), (n_targets, seq_len, stride, windows)


def test_sliding_eval_counts_each_position_once_end_to_end():
    """forward returns the target id as its 'loss' on a stream whose ids are the positions: the sums are then
    sum(1..M) and sum(1..M)^2 only if every target position was scored exactly once, tail included."""
    n = 203  # M = 202 targets; with T = 32, S = 12 the last full stride stops short: a tail window is needed
    tokens = torch.arange(n)
    ones = ByteLUTs(
        torch.ones(n, dtype=torch.int16), torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    )
    assert (n - 1 - 32) % 12 != 0
    m = n - 1
    for power, expected in ((1, m * (m + 1) // 2), (2, m * (m + 1) * (2 * m + 1) // 6)):
        res = evaluate_sliding(
            lambda x, y, power=power: y.double() ** power,
            tokens,
            ones,
            seq_len=32,
            stride=12,
            batch_size=5,
            device="cpu",
            autocast_dtype=None,
        )
        assert res.tokens == m and res.bytes == m
        assert round(res.val_loss * res.tokens) == expected


def test_sliding_with_stride_equal_to_window_is_the_standard_eval_exactly():
    model = tiny_model()
    tokens, luts = stream(5 * 32 + 1), luts_for(64)
    forward = lambda x, y: model(x, y, reduction="none")  # noqa: E731
    kw = dict(seq_len=32, batch_size=2, device="cpu", autocast_dtype=None)
    standard = evaluate(forward, tokens, luts, **kw)
    sliding = evaluate_sliding(forward, tokens, luts, stride=32, **kw)
    assert sliding == standard  # same nats sum, bytes and token count, bit for bit
    finer = run_eval("sliding", forward, tokens, luts, stride=8, **kw)
    assert finer.tokens == standard.tokens and finer.bytes == standard.bytes and finer.val_loss != standard.val_loss


def test_document_isolation_uses_the_backend_mask_and_restores_the_model():
    model = tiny_model(attn="math")
    tokens, luts = stream(4 * 32 + 1, bos_every=11), luts_for(64)
    forward = lambda x, y: model(x, y, reduction="none")  # noqa: E731
    kw = dict(seq_len=32, stride=8, batch_size=4, device="cpu", autocast_dtype=None)
    plain = evaluate_sliding(forward, tokens, luts, **kw)
    with document_mask(model, 0):
        isolated = evaluate_sliding(forward, tokens, luts, **kw)
        assert model.bos_id == 0
    assert model.bos_id is None
    assert isolated.tokens == plain.tokens and isolated.bytes == plain.bytes and isolated.val_loss != plain.val_loss
    # isolation == scoring each window's documents separately: one window holding a BOS mid-way
    x, y = tokens[:32][None], tokens[1:33][None]
    with document_mask(model, 0):
        masked = model(x, y, reduction="none")[0]
    second_doc = model(x[:, 22:], y[:, 22:], reduction="none")[0]  # BOS at 22: the doc starting there, alone
    torch.testing.assert_close(masked[22:], second_doc, rtol=1e-5, atol=1e-6)


def plan_for(compose, device, *overrides):
    return resolve(to_config(compose(list(overrides))), fake_device(device))


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["eval=sliding", "eval.stride=0"], "eval.stride"),
        (["eval=sliding", "model=tiny", "eval.stride=257"], "model.seq_len=256"),
        (["eval=standard", "eval.stride=64"], "use eval=sliding"),
        (["attn=sdpa", "eval.document_isolated=true"], "use attn=flex (CUDA) or attn=math"),
    ],
)
def test_eval_refusals(compose, overrides, needle):
    with pytest.raises(ConfigError) as e:
        plan_for(compose, "cpu", *overrides)
    assert needle in str(e.value)


def test_eval_options_resolve(compose):
    plan_for(compose, "cpu", "eval=sliding", "eval.stride=256", "model=tiny")
    plan_for(compose, "cpu", "attn=math", "eval.document_isolated=true")
    plan_for(compose, "h100", "attn=flex", "eval=sliding", "eval.document_isolated=true")


# ---- CUDA (device machine) -------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_document_isolated_sliding_eval_flex_matches_math():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from dataclasses import replace

    # head_dim 16: flex's Triton kernels need at least 16 (TINY's 8 is refused by the resolver for attn=flex)
    cfg = replace(TINY, seq_len=128, d_model=64)
    tokens, luts = stream(4 * 128 + 1, bos_every=37), luts_for(64)
    results = {}
    for attn in ("math", "flex"):
        torch.manual_seed(0)
        m = GPT(cfg, get_backend(attn)).cuda().eval()
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.05 * torch.randn_like(p))
        with document_mask(m, 0):
            results[attn] = evaluate_sliding(
                lambda x, y, m=m: m(x, y, reduction="none"),
                tokens,
                luts,
                seq_len=128,
                stride=48,
                batch_size=3,
                device="cuda",
                autocast_dtype=torch.bfloat16,
            )
    assert results["flex"].tokens == results["math"].tokens == 4 * 128
    assert abs(results["flex"].val_loss - results["math"].val_loss) < 2e-2


# ---- eval.max_seconds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["standard", "sliding"])
def test_a_time_budget_stops_after_the_batch_that_spends_it_and_says_so(monkeypatch, mode):
    """Each batch costs one second of a fake clock and 'scores' its targets' positions: with 2.5 s the pass stops
    after its third batch, and the sums are those of targets 1..tokens exactly (a prefix, each once)."""
    import speedrun.core.evaluate as E

    clock = [0.0]
    monkeypatch.setattr(E, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def forward(x, y):
        clock[0] += 1.0
        return y.double()

    n = 403
    tokens = torch.arange(n)
    ones = ByteLUTs(
        torch.ones(n, dtype=torch.int16), torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    )
    kw = dict(seq_len=32, stride=12 if mode == "sliding" else None, batch_size=2, device="cpu", autocast_dtype=None)
    cut = run_eval(mode, forward, tokens, ones, max_seconds=2.5, **kw)
    windows = sliding_windows(n - 1, 32, 12)[:6] if mode == "sliding" else [(0, 0)] * 6
    m = sum(32 - score_from for _, score_from in windows)  # 3 batches of 2 windows
    assert (cut.tokens, cut.bytes, cut.complete) == (m, m, False) and round(cut.val_loss * m) == m * (m + 1) // 2
    full = run_eval(mode, forward, tokens, ones, **kw)
    assert cut.tokens_total == full.tokens_total == full.tokens and full.complete
    assert run_eval(mode, forward, tokens, ones, max_seconds=1e6, **kw) == full  # a budget never spent: the same


def test_a_partial_eval_is_visible_in_the_record_and_the_result_block(compose, tmp_path):
    from speedrun.run.finish import evaluate_and_export
    from speedrun.tables import format_result_block

    cfg = to_config(
        compose(
            [
                *("hardware=cpu", "model=tiny", "model.n_layer=2", "model.d_model=32", "model.seq_len=32"),
                *("data.vocab_size=64", "hardware.micro_batch=2", "budget.tokens_per_step=64", "quant=off"),
                "eval.max_seconds=1e-9",
            ]
        )
    )
    plan = resolve(cfg, fake_device("cpu"))
    model = tiny_model()
    data = types.SimpleNamespace(val_tokens=stream(6 * 32 + 1), luts=luts_for(64), bos_id=0)
    lines: list[str] = []
    out = evaluate_and_export(plan, model, lambda x, y: model(x, y, reduction="none"), data, tmp_path, lines.append)
    assert out["eval_complete"] is False and out["val_tokens_scored"] == out["eval_tokens"] == 2 * 32
    assert out["val_tokens_total"] == 6 * 32 and out["eval_tokens_per_s"] > 0 and out["eval_recompiles"] == 0
    assert out["eval_fingerprint"] == eval_fingerprint(data.val_tokens[: 2 * 32 + 1])  # of what was scored
    assert any("PARTIAL" in line for line in lines)
    block = dict(line.split(":", 1) for line in format_result_block(out).splitlines())
    assert block["eval_complete"].strip() == "False"
