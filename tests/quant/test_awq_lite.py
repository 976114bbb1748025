"""quant.awq (AWQ-lite): which column groups are promoted (against the saliency formula), how they are rounded (against
round-to-nearest on a finer grid), what the artifact stores and reads back, and the config's checks. Tiny tensors."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from speedrun.config.choices import Compressor, QuantClip, QuantName
from speedrun.config.quant import AWQConfig, QuantConfig
from speedrun.core import pergroup
from speedrun.core import quant as Q
from speedrun.core.gptq import FineColumns, awq_groups, collect_hessians, quantize_gptq_fine, sigma_scales
from speedrun.errors import ConfigError
from speedrun.records.keys import quant_keys
from speedrun.records.quant_report import rules_of
from support.tiny import BOS, QUANT_TINY, calibration_batches, tiny_gpt


def int6(**levers) -> QuantConfig:
    return QuantConfig(name=QuantName.int6, block_size=8, clip=QuantClip.sigma, **levers)


def reference_groups(weights, hessians, size, top_k):
    """The saliency of the records' AWQ-lite, column by column: rms(x_c) x mean_r |w_rc|, summed per group."""
    scored = []
    for name, w in weights.items():
        rms = [float(hessians[name][c, c]) ** 0.5 for c in range(w.shape[1])]
        for g in range(w.shape[1] // size):
            cols = range(g * size, (g + 1) * size)
            scored.append((sum(rms[c] * float(w[:, c].abs().mean()) for c in cols), name, g * size))
    scored.sort(key=lambda t: -t[0])
    chosen: dict[str, list[int]] = {}
    for _, name, start in scored[:top_k]:
        chosen.setdefault(name, []).append(start)
    return {name: sorted(starts) for name, starts in chosen.items()}


def test_groups_are_the_most_salient_by_activation_rms_times_mean_abs_weight():
    torch.manual_seed(0)
    weights, hessians = {}, {}
    for i, cols in enumerate((32, 40, 24)):  # 40: a trailing partial group of 8 columns is never a candidate
        x = torch.randn(200, cols) * torch.rand(cols) * 3
        weights[f"m{i}"] = torch.randn(16, cols) * torch.rand(cols)
        hessians[f"m{i}"] = x.T @ x / len(x)
    for top_k in (1, 3, 7):
        assert awq_groups(weights, hessians, 16, top_k) == reference_groups(weights, hessians, 16, top_k)
    # one strongly used input column decides the group, whichever matrix holds it
    hessians["m2"][5, 5] = 1e6
    assert awq_groups(weights, hessians, 8, 1) == {"m2": [0]}


def test_promoted_columns_round_on_their_own_finer_step():
    """With a diagonal Hessian GPTQ propagates no error, so each column is round-to-nearest: the promoted ones at
    awq.bits with step k x row std / (2^(bits-1) - 1) (the records' s_hi), the rest at the matrix's bits."""
    torch.manual_seed(0)
    w = torch.randn(12, 48) * torch.logspace(-2, 0, 12)[:, None]
    H = torch.diag(torch.rand(48) + 0.5)
    k = 12.0
    fine = FineColumns(starts=(16,), size=16, bits=8)
    codes, scale, step = quantize_gptq_fine(w, H, bits=6, sigma=k, fine=fine, block_size=8)
    assert torch.equal(scale, sigma_scales(w, k, 31)) and torch.equal(step, sigma_scales(w, k, 127))
    promoted = torch.zeros(48, dtype=torch.bool)
    promoted[16:32] = True
    s, s_fine = scale.float()[:, None], step.float()[:, None]
    expect = torch.where(
        promoted, torch.clamp(torch.round(w / s_fine), -127, 127), torch.clamp(torch.round(w / s), -31, 31)
    )
    assert torch.equal(codes, expect.to(torch.int8))
    assert int(codes[:, 16:32].abs().max()) > 31  # the finer grid uses codes beyond int6's
    # no promoted columns: the plain solve, code for code
    plain, plain_scale = quantize_gptq_fine(w, H, bits=6, sigma=k, block_size=8)[:2]
    again, _, none = quantize_gptq_fine(w, H, bits=6, sigma=k, block_size=8)
    assert torch.equal(plain, again) and none is None


def test_clip_search_promotes_over_the_same_clip():
    torch.manual_seed(1)
    w = torch.randn(8, 32)
    H = torch.eye(32)
    _, scale, step = quantize_gptq_fine(w, H, bits=6, clip_ratios=[1.0, 0.9], fine=FineColumns((0,), 8, 8))
    assert torch.equal(step, (scale.float() * 31 / 127).half())


@pytest.fixture(scope="module")
def tiny():
    model = tiny_gpt(replace(QUANT_TINY), seed=0, doc_bos_id=BOS)
    state = model.state_dict()
    H = collect_hessians(model, iter(calibration_batches()), 3, device="cpu")
    return state, H


def test_int6_export_promotes_top_k_groups_and_reads_them_back(tiny):
    state, H = tiny
    q = int6(awq=AWQConfig(top_k=2, bits=8, group_size=8))
    packed = Q.quantize_int6(state, H, q)
    rules = rules_of(packed, H, q)
    chosen = reference_groups({n: state[n] for n in H}, H, 8, 2)
    marked = {n: e["awq_start"].tolist() for n, e in packed.items() if "awq_start" in e}
    assert marked == chosen and sum(map(len, marked.values())) == 2
    for name, starts in marked.items():
        entry = packed[name]
        assert rules[name]["awq"] == {"starts": starts, "size": 8, "bits": 8}
        w = entry["q"].float() * entry["scale"].float()[:, None]
        for start in starts:
            w[:, start : start + 8] = entry["q"][:, start : start + 8].float() * entry["awq_scale"].float()[:, None]
        assert torch.equal(Q.dequantize_entry(entry), w)
    # the artifact holds the fields bit for bit (pergroup container: the step with the scales, starts as raw ints)
    blob, _ = pergroup.pack(packed, "lzma", 1)
    read = pergroup.unpack(blob)
    for name, entry in packed.items():
        for field, t in entry.items():
            assert torch.equal(read[name][field], t), (name, field)
    # off (top_k 0): no field added, the same codes as an export without the lever
    off = Q.quantize_int6(state, H, int6())
    assert not any(k.startswith("awq") for e in off.values() for k in e)
    for name in off:
        if name not in marked:
            assert all(torch.equal(off[name][f], packed[name][f]) for f in off[name]), name


def test_promotion_lowers_the_promoted_matrix_output_error(tiny):
    state, H = tiny
    on = Q.quantize_int6(state, H, int6(awq=AWQConfig(top_k=1, bits=8, group_size=8)))
    off = Q.quantize_int6(state, H, int6())
    (name,) = [n for n, e in on.items() if "awq_start" in e]

    def output_error(entry):  # what GPTQ minimises: tr(E H E^T), E = W - dequant(Q)
        e = state[name].float() - Q.dequantize_entry(entry)
        return float(torch.einsum("ij,jk,ik->", e, H[name].float(), e))

    assert output_error(on[name]) < output_error(off[name])


def test_config_checks_and_result_keys():
    with pytest.raises(ConfigError, match=r"quant.awq.bits=6 must exceed quant.bits=6"):
        int6(awq=AWQConfig(top_k=1, bits=6))
    with pytest.raises(ConfigError, match=r"quant.awq.top_k=1 act on GPTQ's export: add quant=int6"):
        QuantConfig(name=QuantName.int8, compressor=Compressor.zlib, awq=AWQConfig(top_k=1))
    with pytest.raises(ConfigError, match=r"quant.awq.group_size=0 must be >= 1"):
        AWQConfig(group_size=0)
    keys = quant_keys(int6(awq=AWQConfig(top_k=1)))
    assert (keys["quant_awq_top_k"], keys["quant_awq_bits"], keys["quant_awq_group_size"]) == (1, 8, 64)
    off = quant_keys(int6())
    assert (off["quant_awq_top_k"], off["quant_awq_bits"], off["quant_awq_group_size"]) == (0, None, None)
