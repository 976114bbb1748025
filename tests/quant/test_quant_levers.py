"""The record's export levers (quant.clip=sigma, embed_gptq, lqer, gate_bits, reserve_seconds), each against a
reference formula or an invariant, the per-tensor report, and their config checks. Tiny tensors: seconds."""

from __future__ import annotations

import json
import math
import types
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from speedrun.config import QuantConfig, to_config
from speedrun.config.choices import Compressor, QuantClip, QuantName
from speedrun.config.model import AttnOutGateConfig, SmearGateConfig
from speedrun.config.quant import ClipSigmas, LQERConfig
from speedrun.core import gptq as lqer
from speedrun.core import quant as Q
from speedrun.core.gptq import collect_hessians, quantize_gptq_fine, quantize_rtn, sigma_scales
from speedrun.core.pergroup import tensor_class
from speedrun.core.train import Budget
from speedrun.errors import ConfigError, PlanError
from speedrun.plan import resolve
from speedrun.records.keys import quant_keys
from speedrun.records.quant_report import rules_of
from support.devices import fake_device
from support.tiny import BOS, QUANT_TINY, QUANT_TINY_RUN, byte_luts, calibration_batches, docs_stream, tiny_gpt


def gpt(tied: bool = True, seed: int = 0, **levers):
    return tiny_gpt(replace(QUANT_TINY, tie_embeddings=tied, **levers), seed=seed, doc_bos_id=BOS)


def int6(sigmas: dict | None = None, lqer: dict | None = None, **levers) -> QuantConfig:
    return QuantConfig(
        name=QuantName.int6,
        block_size=8,
        sigmas=ClipSigmas(**(sigmas or {})),
        lqer=LQERConfig(**(lqer or {})),
        **levers,
    )


# ---- quant.clip=sigma ------------------------------------------------------------------------------------


def test_sigma_scale_is_k_row_std_over_qmax_and_codes_round_to_it():
    torch.manual_seed(0)
    w = torch.randn(16, 64) * torch.logspace(-2, 0, 16)[:, None]
    k, qmax = 12.0, 31
    reference = (k * w.std(dim=1) / qmax).half()  # clip = k x row std; scale = clip / qmax, stored fp16
    assert torch.equal(sigma_scales(w, k, qmax), reference)
    q, scale = quantize_rtn(w, 6, sigma=k)
    assert torch.equal(scale, reference)
    assert torch.equal(q, torch.clamp(torch.round(w / reference.float()[:, None]), -qmax, qmax).to(torch.int8))
    # GPTQ fixes the same scales first, then spreads its rounding error
    H = torch.eye(64) + 0.1
    _, gptq_scale = quantize_gptq_fine(w, H, bits=6, sigma=k)[:2]
    assert torch.equal(gptq_scale, reference)


def test_a_large_sigma_makes_a_coarse_grid_with_fewer_distinct_codes():
    """The record's lever: k far beyond the absmax -> step ~ k sigma / qmax, so the codes of a Gaussian row
    spread over ~sigma / step = qmax / k levels (about 2.6 at k=12, int6) instead of the full int6 range."""
    torch.manual_seed(0)
    w = torch.randn(64, 512)
    q_abs, _ = quantize_rtn(w, 6)
    q_sig, _ = quantize_rtn(w, 6, sigma=12.0)
    assert float(q_sig.float().std()) == pytest.approx(31 / 12, rel=0.05)
    assert int(q_sig.abs().max()) < int(q_abs.abs().max()) == 31


def test_tensor_classes_of_the_gpt_state_dict():
    names = gpt(tied=False, skip_gates=True).state_dict()
    classes = {name: tensor_class(name) for name in names}
    assert classes["blocks.0.attn.c_q.weight"] == classes["blocks.1.attn.proj.weight"] == "attn"
    assert classes["blocks.0.mlp.fc.weight"] == classes["blocks.1.mlp.proj.weight"] == "mlp"
    assert classes["tok_emb.weight"] == classes["lm_head.weight"] == "embed"
    assert classes["skip_gates"] == "gate"
    assert tensor_class("blocks.0.attn.attn_gate_w") == tensor_class("smear_w") == "gate"  # gate before attn
    assert tensor_class("blocks.0.ffn.up.weight") == "matrix"


def test_sigma_clip_takes_k_by_class():
    model = gpt()
    state = model.state_dict()
    H = collect_hessians(model, iter(calibration_batches()), 3, device="cpu")
    q = int6(clip=QuantClip.sigma, sigmas={"attn": 13.0, "mlp": 12.0, "embed": 15.0, "matrix": 12.85})
    packed = Q.quantize_int6(state, H, q)
    rules = rules_of(packed, H, q)
    for name, k, qmax in (
        ("blocks.0.attn.c_k.weight", 13.0, 31),
        ("blocks.1.mlp.fc.weight", 12.0, 31),
        ("tok_emb.weight", 15.0, 127),  # embed_bits 8
    ):
        assert torch.equal(packed[name]["scale"], sigma_scales(state[name], k, qmax)), name
        assert rules[name]["clip"] == f"sigma {k:g}"


# ---- quant.embed_gptq --------------------------------------------------------------------------------------


def test_head_hessian_is_xtx_of_the_final_norm_output():
    """A tied embedding's Hessian is that of the head's input, rms_norm(final hidden state) (the record's
    final_norm output hook), captured where F.linear multiplies by the embedding."""
    model = gpt()
    seen = []
    head = model.head

    def watched_head(x, targets, reduction="mean"):  # GPT.head: rms_norm, then F.linear with the embedding
        seen.append(F.rms_norm(x.float(), (x.size(-1),)))
        return head(x, targets, reduction)

    model.head = watched_head  # an instance attribute: forward looks the head up on self
    H = collect_hessians(model, iter(calibration_batches()), 3, device="cpu", head=True)
    X = torch.cat([s.reshape(-1, 32) for s in seen])
    torch.testing.assert_close(H["tok_emb.weight"], X.T @ X / len(X), rtol=1e-4, atol=1e-6)
    assert "tok_emb.weight" not in collect_hessians(model, iter(calibration_batches()), 1, device="cpu")  # off: today's
    untied = collect_hessians(gpt(tied=False), iter(calibration_batches()), 1, device="cpu", head=True)
    assert "lm_head.weight" in untied and "tok_emb.weight" not in untied  # a looked-up table has no head role


def test_gptq_with_an_identity_hessian_is_round_to_nearest():
    """Why an untied (looked-up) embedding stays round-to-nearest: one-hot inputs give a diagonal Hessian, which
    couples no two columns, and GPTQ with uncoupled columns rounds each to nearest."""
    torch.manual_seed(0)
    w = torch.randn(24, 40)
    q_gptq, s_gptq = quantize_gptq_fine(w, torch.eye(40), bits=6, sigma=10.0)[:2]
    q_rtn, s_rtn = quantize_rtn(w, 6, sigma=10.0)
    assert torch.equal(s_gptq, s_rtn) and torch.equal(q_gptq, q_rtn)


def test_embed_gptq_lowers_the_head_output_error_at_embed_bits():
    model = gpt()
    state = model.state_dict()
    H = collect_hessians(model, iter(calibration_batches(4)), 4, device="cpu", head=True)
    packed_gptq = Q.quantize_int6(state, H, int6(embed_gptq=True, embed_bits=5))
    rules = rules_of(packed_gptq, H, int6(embed_gptq=True, embed_bits=5))
    no_head = {k: v for k, v in H.items() if k != "tok_emb.weight"}
    packed_rtn = Q.quantize_int6(state, no_head, int6(embed_bits=5))
    rules_rtn = rules_of(packed_rtn, no_head, int6(embed_bits=5))
    assert (rules["tok_emb.weight"]["method"], rules["tok_emb.weight"]["bits"]) == ("gptq", 5)
    assert rules_rtn["tok_emb.weight"]["method"] == "rtn"
    w = state["tok_emb.weight"]

    def out_err(entry):  # tr(E H E^T): the head's output error on the calibration activations
        e = w - Q.dequantize_entry(entry)
        return float(((e @ H["tok_emb.weight"]) * e).sum())

    assert out_err(packed_gptq["tok_emb.weight"]) < out_err(packed_rtn["tok_emb.weight"])
    assert int(packed_gptq["tok_emb.weight"]["q"].abs().max()) <= 15  # int5


# ---- quant.lqer ----------------------------------------------------------------------------------------------


def test_lqer_factors_reproduce_the_svd_truncation():
    torch.manual_seed(0)
    E = torch.randn(48, 80) @ torch.diag(torch.logspace(0, -2, 80))
    U, S, Vh = torch.linalg.svd(E, full_matrices=False)
    reference = U[:, :4] @ torch.diag(S[:4]) @ Vh[:4]
    a, b = lqer.low_rank(E, 4)
    assert a.shape == (4, 48) and b.shape == (4, 80)
    torch.testing.assert_close(a.T @ b, reference, rtol=1e-4, atol=1e-5)
    # Eckart-Young: what is left is the energy of the discarded singular values
    assert float((E - a.T @ b).norm() ** 2) == pytest.approx(float((S[4:] ** 2).sum()), rel=1e-4)
    # 8-bit factors: the stored correction is the truncation up to 1% of it
    stored = lqer.dequantize_correction(lqer.correction(E, 4, 8, 64))
    assert float((stored - reference).norm() / reference.norm()) < 0.01


def test_group_quantization_is_asymmetric_per_group_within_half_a_step():
    torch.manual_seed(0)
    m = torch.randn(3, 100) + torch.linspace(0, 5, 100)  # a drifting mean: groups span different ranges
    codes, lo, step = lqer.quantize_groups(m, 4, 64)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert lo.shape == step.shape == (3, 2)  # 100 values -> ceil(100 / 64) = 2 groups of 50
    back = lqer.dequantize_groups(codes, lo, step)
    per_value_step = step.float().repeat_interleave(50, dim=1)
    assert bool(((back - m).abs() <= per_value_step / 2 + 1e-2 * per_value_step + 1e-3).all())
    for g in range(2):  # each group's codes span its own [min, max]
        assert int(codes[:, g * 50 : (g + 1) * 50].min()) == 0 and int(codes[:, g * 50 : (g + 1) * 50].max()) == 15


def test_lqer_corrects_the_worst_matrices_and_dequantization_applies_it():
    model = gpt()
    state = model.state_dict()
    H = collect_hessians(model, iter(calibration_batches()), 3, device="cpu")
    plain = Q.quantize_int6(state, H, int6(clip=QuantClip.sigma, bits=4))
    packed = Q.quantize_int6(state, H, int6(clip=QuantClip.sigma, bits=4, lqer={"rank": 4, "top_k": 2}))
    rules = rules_of(packed, H, int6(clip=QuantClip.sigma, bits=4, lqer={"rank": 4, "top_k": 2}))
    err = {n: float((state[n] - Q.dequantize_entry(e)).norm()) for n, e in plain.items() if "q" in e}
    worst = sorted(err, key=lambda n: -err[n])[:2]
    assert sorted(n for n, e in packed.items() if "lqer_a" in e) == sorted(worst)
    for name in worst:
        before, after = err[name], float((state[name] - Q.dequantize_entry(packed[name])).norm())
        assert after < before, (name, after, before)
        assert rules[name]["lqer"] == {"rank": 4, "factor_bits": 4, "group": 64}
    restored = Q.dequantize_state_dict(Q.load_packed(Q.export_packed(packed, "lzma", 6).blob, "lzma"))
    torch.testing.assert_close(restored[worst[0]], Q.dequantize_entry(packed[worst[0]]))


# ---- quant.gate_bits -----------------------------------------------------------------------------------------


def test_gates_are_quantized_per_row_only_with_gate_bits():
    levers = dict(skip_gates=True, smear_gate=SmearGateConfig(window=4), attn_out_gate=AttnOutGateConfig(4, 1.0, 0.5))
    model = gpt(**levers)
    state = model.state_dict()
    gates = [n for n in state if tensor_class(n) == "gate"]
    assert set(gates) == {"skip_gates", "smear_w", "blocks.0.attn.attn_gate_w", "blocks.1.attn.attn_gate_w"}
    H = collect_hessians(model, iter(calibration_batches()), 2, device="cpu")
    off = Q.quantize_int6(state, H, int6())
    on = Q.quantize_int6(state, H, int6(gate_bits=6))
    rules = rules_of(on, H, int6(gate_bits=6))
    for name in gates:
        assert "q" not in off[name]  # float, as today
        entry, w = on[name], state[name]
        assert entry["q"].shape == w.shape and rules[name]["bits"] == 6
        rows = w.reshape(w.shape[0] if w.ndim > 1 else 1, -1)
        reference = (rows.abs().amax(dim=1) / 31).half()  # absmax per row over qmax
        assert torch.equal(entry["scale"], reference)
        back = Q.dequantize_entry(entry)
        assert back.shape == w.shape
        assert bool(((back - w).abs().reshape(len(reference), -1) <= reference.float()[:, None] / 2 + 1e-6).all())
    assert "q" not in on["smear_lambda"]  # the smear gate's strength is a scalar, not a gate weight


# ---- the per-tensor report -------------------------------------------------------------------------------------


def test_tensor_report_errors_and_bytes():
    from speedrun.records.quant_report import tensor_report

    model = gpt()
    state = model.state_dict()
    H = collect_hessians(model, iter(calibration_batches()), 3, device="cpu")
    packed = Q.quantize_int6(state, H, int6(clip=QuantClip.sigma, lqer={"rank": 2, "top_k": 1}))
    rules = rules_of(packed, H, int6(clip=QuantClip.sigma, lqer={"rank": 2, "top_k": 1}))
    for compressor in ("pergroup", "lzma"):
        artifact = Q.export_packed(packed, compressor, 6, codec="lzma")
        report = tensor_report(state, packed, rules, H, artifact.group_bytes, compressor)
        rows = {r["name"]: r for r in report["tensors"]}
        assert list(rows) == list(state)
        name = "blocks.0.mlp.fc.weight"
        w, e = state[name], state[name] - Q.dequantize_entry(packed[name])
        assert rows[name]["rel_error"] == pytest.approx(float(e.norm() / w.norm()), abs=1e-6)
        ref = math.sqrt(float(((e @ H[name]) * e).sum()) / float(((w @ H[name]) * w).sum()))
        assert rows[name]["rel_error_hessian"] == pytest.approx(ref, rel=1e-4)
        assert rows[name]["clip_summary"]["clip_over_std_mean"] == pytest.approx(12.0, rel=0.01)
        assert (rows[name]["class"], rows[name]["method"], rows[name]["bits"]) == ("mlp", "gptq", 6)
        header = artifact.group_bytes.get("header", 0)
        assert abs(sum(r["est_bytes"] for r in rows.values()) - (len(artifact.blob) - header)) <= len(rows)
        assert sum(c["tensors"] for c in report["classes"].values()) == len(rows)
        corrected = [r for r in rows.values() if "lqer" in r]
        assert len(corrected) == 1 and corrected[0]["rel_error"] < corrected[0]["rel_error_before_lqer"]
        if compressor == "pergroup":
            assert rows[name]["group"] == ["q.mlp", "scale"]


# ---- quant.reserve_seconds and the config ----------------------------------------------------------------------


def plan_for(compose, *overrides):
    return resolve(to_config(compose(["hardware=cpu", *overrides])), fake_device("cpu"))


def test_reserve_seconds_shortens_the_loop_budget(compose):
    plan = plan_for(compose, "quant=int6", "quant.reserve_seconds=8", "budget.train_seconds=60")
    assert plan.budget.hessian_reserve == 8 and Budget.of(plan.budget, 8).limits["time"] == 52
    assert "8 s of it for GPTQ" in plan.budget_text()
    measured = plan_for(compose, "quant=int6", "budget.train_seconds=60").budget
    assert measured.measures_reserve and "measured in warm-up" in measured.text()
    assert plan_for(compose, "quant=int8", "budget.train_seconds=60").budget.hessian_reserve == 0
    for overrides in (["budget.train_seconds=8"], ["budget.tokens=1000000"]):
        with pytest.raises(PlanError, match="quant.reserve_seconds=8"):
            plan_for(compose, "quant=int6", "quant.reserve_seconds=8", *overrides)
    with pytest.raises(PlanError, match="quant.reserve_seconds=0 would leave GPTQ's Hessians"):
        plan_for(compose, "quant=int6", "quant.reserve_seconds=0", "budget.train_seconds=60")


def test_the_export_collects_its_own_hessians_when_given_none(compose, tmp_path):
    """A caller without the job's Hessians (a script) gets them collected by the export, timed."""
    from speedrun.run.finish import evaluate_and_export

    model = gpt()
    data = types.SimpleNamespace(
        val_tokens=docs_stream([40, 30]),
        luts=byte_luts(),
        bos_id=BOS,
        train_batches=lambda: iter(calibration_batches()),
    )
    tiny = [*QUANT_TINY_RUN, "quant=int6", "quant.calib_batches=2", "quant.block_size=8"]
    plan = plan_for(compose, *tiny, "budget.train_seconds=60", "quant.keep_weights=true")
    out = evaluate_and_export(
        plan, model, lambda x, y: model(x, y, reduction="none"), data, tmp_path, lambda line: None
    )
    assert out["quant_hessian_seconds"] > 0 and out["compress_seconds"] >= 0
    report = json.loads((tmp_path / "artifact_tensors.json").read_text())
    assert {r["name"] for r in report["tensors"]} == set(model.state_dict())
    saved = torch.load(tmp_path / "model.pt", weights_only=True)  # quant.keep_weights
    assert set(saved) == set(model.state_dict())


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["quant.clip=sigma"], "add quant=int6"),
        (["quant.lqer.rank=4"], "quant.lqer.rank=4 act on GPTQ's export"),
        (["quant=int6", "quant.gate_bits=9"], "quant.gate_bits=9"),
        (["quant=int6", "quant.sigmas.mlp=0"], "quant.sigmas.mlp=0"),
        (["quant=int6", "quant.lqer.factor_bits=1"], "quant.lqer.factor_bits=1"),
        (["quant=int6", "quant.lqer.asym_group=1"], "quant.lqer.asym_group"),
        (["quant=int6", "quant.reserve_seconds=-1"], "quant.reserve_seconds=-1"),
        (["quant=int6", "quant.compressor=pergroup", "quant.pergroup_codec=lzma", "quant.level=11"], "use 0..9"),
    ],
)
def test_lever_refusals_name_the_fix(compose, overrides, needle):
    with pytest.raises((ConfigError, PlanError)) as e:
        plan_for(compose, *overrides)
    assert needle in str(e.value)


def test_result_keys_record_the_levers():
    assert all(v is None for v in quant_keys(QuantConfig()).values())  # int8: none of them applies
    keys = quant_keys(int6(clip=QuantClip.sigma, lqer={"rank": 4}, gate_bits=8, compressor=Compressor.pergroup))
    assert keys["quant_clip"] == "sigma" and keys["quant_sigmas_embed"] == 15.0 and keys["quant_sigmas_mlp"] == 12.0
    assert (keys["quant_lqer_rank"], keys["quant_lqer_top_k"], keys["quant_lqer_factor_bits"]) == (4, 3, 4)
    assert keys["quant_gate_bits"] == 8 and keys["quant_pergroup_codec"] == "brotli"
    assert quant_keys(int6())["quant_sigmas_attn"] is None and quant_keys(int6())["quant_lqer_top_k"] is None


# ---- CUDA (device machine) -------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_head_hessian_under_bf16_autocast_matches_cpu():
    """The head's Hessian is captured through F.linear under autocast on CUDA as on CPU (bf16 inputs, fp32 sums)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = gpt()
    cpu = collect_hessians(model, iter(calibration_batches()), 3, device="cpu", head=True)
    cuda = collect_hessians(
        model.cuda(), iter(calibration_batches()), 3, device="cuda", autocast_dtype=torch.bfloat16, head=True
    )
    assert set(cpu) == set(cuda)
    for name in ("tok_emb.weight", "blocks.0.attn.c_q.weight"):
        rel = float((cuda[name].cpu() - cpu[name]).norm() / cpu[name].norm())
        assert rel < 0.02, (name, rel)
    packed = Q.quantize_int6(model.state_dict(), cuda, int6(clip=QuantClip.sigma, embed_gptq=True))
    rules = rules_of(packed, cuda, int6(clip=QuantClip.sigma, embed_gptq=True))
    assert rules["tok_emb.weight"]["method"] == "gptq" and packed["tok_emb.weight"]["q"].device.type == "cpu"
