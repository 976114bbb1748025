"""Score-first LoRA TTT: causality, per-document independence, identity at init, budget stop, parsing, resolver,
and the whole finalize step (eval + int6 + TTT) on a tiny model."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from speedrun.config import to_config
from speedrun.config.specs import TTT_PRESETS, parse_short_chunks, parse_targets
from speedrun.core.attention import get_backend
from speedrun.core.model import GPT
from speedrun.core.ttt_docs import chunk_size_for, short_chunks_of, split_documents
from speedrun.core.ttt_lora import targets_of
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from support.devices import fake_device
from support.tiny import BOS, TINY, byte_luts, docs_stream
from support.ttt import run, ttt_gpt


def test_changing_later_chunks_never_changes_earlier_scores():
    """Chunks of 8 in windows of 24: changing every token of chunk k+1 onward (of one document) leaves the score
    of chunks 0..k of that document, and all of every other document, bit-identical, while later scores move."""
    m = ttt_gpt()
    lengths = [61, 45, 70]  # documents 0 and 2 share a batch of 2 (sorted by length: [45], [61, 70] -> 2 batches)
    tokens = docs_stream(lengths)
    base = {(c.doc, c.chunk): (c.nats, c.tokens) for c in run(m, tokens, batch_size=2).chunks}
    starts = [0, 61, 106]
    doc, k = 2, 3  # change document 2 from chunk 4 on: its targets 33.. are tokens starts[2] + 33 ..
    changed = tokens.clone()
    lo, hi = starts[doc] + (k + 1) * 8 + 1, starts[doc] + lengths[doc]
    changed[lo:hi] = (changed[lo:hi] + 7) % 63 + 1  # never BOS: same documents
    after = {(c.doc, c.chunk): (c.nats, c.tokens) for c in run(m, changed, batch_size=2).chunks}
    assert set(after) == set(base)
    for (d, c), score in base.items():
        if d != doc or c <= k:
            assert after[(d, c)] == score, (d, c)
    assert any(after[(doc, c)] != base[(doc, c)] for c in range(k + 1, 9))
    # score before update: every document's first chunk is scored before any step, so it is the base model's
    frozen = {(c.doc, c.chunk): (c.nats, c.tokens) for c in run(m, tokens, batch_size=2, lr=0.0).chunks}
    for d in range(3):
        assert frozen[(d, 0)] == base[(d, 0)] and frozen[(d, 1)] != base[(d, 1)]


def test_adapters_start_as_the_base_model_and_leave_it_untouched():
    """lr=0: TTT scores equal the base model's own scores of each document (in one window, since documents here
    fit in seq_len and attention is causal); and the model passed in is never modified."""
    m = ttt_gpt()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    lengths = [20, 13, 24]
    tokens = docs_stream(lengths)
    res = run(m, tokens, lr=0.0, batch_size=3)
    assert res.complete and res.tokens_scored == sum(lengths) - 1 == tokens.numel() - 1
    direct, start = 0.0, 0
    for n in lengths:
        end = min(start + n, tokens.numel() - 1)  # each document's targets run to the next BOS
        with torch.no_grad():
            direct += float(
                m(tokens[start:end][None], tokens[start + 1 : end + 1][None], reduction="none").double().sum()
            )
        start += n
    assert abs(res.val_loss * res.tokens_scored - direct) < 1e-6 * abs(direct)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_ttt_adapts_to_a_repetitive_document():
    m = ttt_gpt()
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(1, 64, (6,), generator=g)
    tokens = torch.cat([torch.tensor([BOS]), motif.repeat(30)])
    frozen = run(m, tokens, lr=0.0)
    adapted = run(m, tokens, lr=0.05)
    assert adapted.val_loss < frozen.val_loss - 0.5, (adapted.val_loss, frozen.val_loss)


def test_unadapted_baseline_scores_the_same_chunks_and_windows_without_adaptation():
    """val_bpb_ttt_base: the same chunks and windows scored with no adaptation, in the same pass. It equals a run
    whose adapters never move (lr=0), so val_bpb_ttt_base - val_bpb_ttt is what adaptation alone bought."""
    m = ttt_gpt()
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(1, 64, (6,), generator=g)
    tokens = torch.cat([docs_stream([40, 30]), torch.tensor([BOS]), motif.repeat(20)])  # several chunks each
    adapted = run(m, tokens, lr=0.05, batch_size=2)
    frozen = run(m, tokens, lr=0.0, batch_size=2)
    assert adapted.complete and adapted.base_val_loss is not None
    # equal up to fp32 rounding: a step runs its last layer at the chunk's columns (GPT.forward's pick), another
    # attention kernel than the base pass's whole window (1.2e-9 apart on one CPU, under 1e-9 on another)
    assert abs(adapted.base_val_loss - frozen.val_loss) < 1e-7 * frozen.val_loss
    assert abs(adapted.base_val_bpb - frozen.val_bpb) < 1e-7 * frozen.val_bpb
    assert adapted.val_loss < adapted.base_val_loss  # the repeated motif is learnt: a real, measured gain
    assert run(m, tokens, score_base=False).base_val_bpb is None


def test_time_budget_stops_cleanly_and_says_how_much_was_scored():
    m = ttt_gpt()
    tokens = docs_stream([40, 50, 30])
    none = run(m, tokens, max_seconds=1e-9)
    assert not none.complete and none.tokens_scored == 0 and none.fraction == 0.0 and none.val_bpb is None
    full = run(m, tokens, max_seconds=600.0)
    assert full.complete and full.fraction == 1.0 and full.tokens_scored == tokens.numel() - 1
    assert full.bytes > 0 and full.val_bpb > 0 and full.docs_done == full.docs_total == 3


def test_short_document_chunk_schedule():
    assert parse_short_chunks("") == []
    steps = parse_short_chunks("2000:24, 256:8")
    assert steps == [(256, 8), (2000, 24)] == short_chunks_of("2000:24, 256:8")  # the core reads what config checked
    assert short_chunks_of("") == []
    assert [chunk_size_for(n, 48, steps) for n in (1, 256, 257, 2000, 2001)] == [8, 8, 24, 24, 48]
    for bad in ("256-8", "0:8", "256:0", "a:b", "256:8:1", "256:8,256:4"):
        with pytest.raises(ValueError, match="ttt.short_chunks"):
            parse_short_chunks(bad)
    # a short document gets more, smaller chunks: 3 documents x ceil(n / chunk) chunks
    res = run(ttt_gpt(), docs_stream([10, 30, 40]), short_chunks="12:2,32:4")
    per_doc = {}
    for c in res.chunks:
        per_doc.setdefault(c.doc, []).append(c.tokens)
    assert per_doc == {0: [2] * 5, 1: [4] * 7 + [2], 2: [8] * 4 + [7]}  # the last document ends at M


def test_targets_and_documents():
    assert parse_targets("all") == ("q", "k", "v", "o", "up", "down")
    assert parse_targets("no_qv") == ("k", "o", "up", "down")
    assert parse_targets("q, v,mlp") == ("q", "v", "up", "down")
    assert parse_targets("q,head,mlp_bypass") == ("q", "head", "mlp_bypass")
    assert parse_targets("record") == ("q", "k", "v", "attn_bypass", "mlp_bypass", "head")
    with pytest.raises(ValueError, match="unknown target"):
        parse_targets("q,x")
    # the core expands what config checked the same way (its own table: the core imports no config)
    for spec in [*TTT_PRESETS, "q, v,mlp", "q,head,mlp_bypass", "mlp,up,q"]:
        assert targets_of(spec) == parse_targets(spec), spec
    assert split_documents(torch.tensor([0, 5, 6, 0, 7, 0, 8]), 0) == [(0, 3), (3, 2), (5, 1)]
    assert split_documents(torch.tensor([5, 6, 0, 7]), 0) == [(0, 2), (2, 1)]  # a leading fragment
    lora_only_qv = run(ttt_gpt(), docs_stream([30]), targets="qv")
    assert lora_only_qv.complete


def plan_for(compose, *overrides):
    return resolve(to_config(compose(list(overrides))), fake_device("cpu"))


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["ttt=lora", "ttt.short_chunks=256-8"], "LEN:CHUNK"),
        (["ttt=lora", "model=tiny", "ttt.chunk_size=300"], "model.seq_len=256"),
        (["ttt=lora", "ttt.targets=lm"], "unknown target 'lm'"),
        (["ttt=lora", "ttt.momentum=0.9"], "ttt.optimizer=sgd"),
        (["ttt=lora", "ttt.optimizer=sgd", "ttt.momentum=1.0"], "ttt.momentum=0.9"),
        (["ttt=lora", "ttt.alpha=0"], "ttt.alpha=144"),
        (["ttt=lora", "ttt.beta2=1.0"], "0.999"),
        (["ttt.phased.phases=3"], "add ttt=lora"),
        (["ttt=lora", "ttt.phased.phases=3", "ttt.phased.prefix_docs=2"], "ttt.phased.prefix_docs=2000"),
        (["ttt=lora", "ttt.phased.phases=1", "ttt.phased.momentum=1"], "ttt.phased.momentum"),
        (["ttt=lora", "ttt.phased.phases=1", "ttt.phased.batch_seqs=0"], "32768, 32 and 1"),
        (["ttt=lora", "ttt.rank=0"], "ttt.rank"),
        (["ttt=lora", "ttt.max_seconds=0"], "ttt.max_seconds"),
        (["ttt=lora", "ttt.compile_scope=layers"], "ttt.compile_scope=blocks"),
        (["ttt=lora", "ttt.row_widths=pow3"], "use ttt.row_widths=pow2, half_octave or e.g. 128"),
        (["ttt=lora", "ttt.row_widths=8"], "a multiple of at least 16 tokens"),
        (["ttt=lora", "ttt.graph_rows=pow3"], "ttt.graph_rows=pow2"),
        (["ttt=lora", "ttt.max_batch_share=0"], "max_batch_share=0.0 must be in (0, 1]"),
        (["ttt=lora", "ttt.warm_start_chains=0"], "ttt.warm_start_chains=0 must be >= 1"),
    ],
)
def test_ttt_refusals(compose, overrides, needle):
    with pytest.raises(ConfigError) as e:
        plan_for(compose, *overrides)
    assert needle in str(e.value)


def test_finalize_scores_quantizes_and_adapts(compose, tmp_path):
    """The runner's last step on a tiny model: sliding eval, int6 GPTQ (+ lzma), TTT on the dequantized model."""
    from speedrun.run.finish import evaluate_and_export

    cfg = to_config(
        compose(
            [
                "hardware=cpu",
                "model=tiny",
                "model.n_layer=2",
                "model.d_model=32",
                "model.seq_len=32",
                "data.vocab_size=64",
                "hardware.micro_batch=4",
                "budget.tokens_per_step=128",
                "eval=sliding",
                "eval.stride=16",
                "quant=int6",
                "quant.calib_batches=2",
                "ttt=lora",
                "ttt.chunk_size=16",
                "ttt.short_chunks=20:4",
            ]
        )
    )
    plan = resolve(cfg, fake_device("cpu"))
    assert (plan.model.seq_len, plan.model.vocab_size, plan.eval.batch_size) == (32, 64, 4)
    gpt = GPT(TINY, get_backend("sdpa", kernel="math"))
    with torch.no_grad():
        for p in gpt.parameters():
            p.add_(0.05 * torch.randn_like(p))

    def eval_forward(x, y):
        return gpt(x, y, reduction="none")

    seen = []

    def train_batches():
        while True:
            x = torch.randint(1, 64, (4, 32))
            seen.append(x)
            yield x, x

    data = types.SimpleNamespace(
        val_tokens=docs_stream([50, 15, 32]), luts=byte_luts(), bos_id=BOS, train_batches=train_batches
    )
    lines = []
    out = evaluate_and_export(plan, gpt, eval_forward, data, tmp_path, lines.append)
    assert len(seen) == 2  # Hessians from exactly calib_batches training batches
    assert out["eval_mode"] == "sliding:16" and out["eval_tokens"] == 96
    assert out["val_bpb"] > 0 and abs(out["val_bpb_quant"] - out["val_bpb"]) < 0.05
    assert out["ttt_complete"] and out["ttt_fraction"] == 1.0 and out["ttt_tokens_scored"] == 96
    assert out["val_bpb_ttt"] > 0 and out["ttt_seconds"] >= 0 and out["val_bpb_ttt_base"] > 0
    assert out["artifact_ok"] and out["artifact_bytes"] == out["artifact_model_bytes"] + out["artifact_code_bytes"]
    assert (tmp_path / "model.int6.lzma").stat().st_size == out["artifact_model_bytes"]


# ---- CUDA (device machine) -------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_bf16_ttt_completes_and_agrees_with_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    m = ttt_gpt()
    tokens = docs_stream([200, 90, 300, 40])
    cpu = run(m, tokens, batch_size=2)
    gpu = run(m.cuda(), tokens, batch_size=4, device="cuda", autocast_dtype=torch.bfloat16, short_chunks="64:4")
    assert gpu.complete and gpu.tokens_scored == cpu.tokens_scored and gpu.bytes == cpu.bytes
    assert abs(gpu.val_loss - cpu.val_loss) < 0.1, (gpu.val_loss, cpu.val_loss)


def test_the_record_recipe_runs_the_records_ttt(compose):
    """experiment=pgolf_record sets the same TTT as ttt=record (only its time budget differs, it compiles TTT,
    which on a GPU brings CUDA graphs, and pads its rows to multiples of its chunk, the graphed steps' row counts to
    half octaves; debug=smoke does not compile), and
    ttt=record resolves with the record model's context."""
    recipe = to_config(compose(["experiment=pgolf_record"])).ttt
    option = to_config(compose(["ttt=record"])).ttt
    assert recipe.compile and not option.compile
    assert (recipe.row_widths, option.row_widths) == (str(recipe.chunk_size), "pow2") == ("48", "pow2")
    assert (recipe.graph_rows, option.graph_rows) == ("half_octave", "pow2")
    padded = to_config(compose(["ttt=record", "ttt.row_widths=128", "ttt.graph_rows=half_octave"])).ttt
    assert (padded.row_widths, padded.graph_rows) == ("128", "half_octave")  # a number on the command line
    assert dataclasses.replace(recipe, max_seconds=None, compile=False, row_widths="pow2", graph_rows="pow2") == option
    assert not to_config(compose(["experiment=pgolf_record", "debug=smoke"])).ttt.compile
    assert (option.rank, option.alpha, option.targets, option.phased.phases, option.warm_start_a) == (
        96,
        144,
        "record",
        3,
        True,
    )
    plan = resolve(to_config(compose(["experiment=pgolf_record"])), fake_device("h100"))
    assert plan.ttt.batch_size == 64 and plan.ttt.phased.prefix_docs == 2000 and plan.ttt.cuda_graphs is True
