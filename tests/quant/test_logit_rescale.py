"""quant.logit_rescale (the asymmetric logit rescale): the logits against the reference formula, what training and
phased global TTT do to its two scalars, the artifact's copy of them, and the plan's refusals. Tiny models."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from speedrun.config import to_config
from speedrun.config.choices import QuantName
from speedrun.config.quant import QuantConfig
from speedrun.core import quant as Q
from speedrun.core.model import GPT, ModelShape
from speedrun.core.ttt_docs import split_documents
from speedrun.core.ttt_global import finetune
from speedrun.core.ttt_lora import GlobalSettings, LoRAModel
from speedrun.errors import ConfigError, PlanError
from speedrun.plan import resolve
from speedrun.plan.model_choice import check_shape, resolve_model
from speedrun.records.quant_report import rules_of
from support.devices import fake_device
from support.tiny import BOS, TTT_TINY, tiny_gpt

RESCALED = replace(TTT_TINY, logit_rescale=True)


def pair(seed: int = 0) -> tuple[GPT, GPT]:
    """The same weights with the plain softcap and with the rescale."""
    plain = tiny_gpt(TTT_TINY, seed=seed)
    rescaled = tiny_gpt(RESCALED, seed=seed)
    # tiny_gpt jitters every parameter: the scalars start at the softcap as the model builds them
    rescaled.load_state_dict({**plain.state_dict(), "logit_rescale": torch.full((2,), TTT_TINY.logit_softcap)})
    return plain, rescaled


def test_at_the_softcap_the_logits_are_the_plain_models_bit_for_bit():
    plain, rescaled = pair()
    x = torch.randint(0, 64, (2, 24))
    with torch.no_grad():
        assert torch.equal(plain(x, None), rescaled(x, None))
        assert torch.equal(plain(x, x), rescaled(x, x))
    assert rescaled.logit_rescale.tolist() == [30.0, 30.0]


def test_logits_follow_pos_tanh_over_pos_and_neg_tanh_over_neg():
    _, rescaled = pair()
    uncapped = tiny_gpt(replace(TTT_TINY, logit_softcap=0.0), seed=0)
    with torch.no_grad():
        uncapped.load_state_dict({k: v for k, v in rescaled.state_dict().items() if k != "logit_rescale"})
        for m in (uncapped, rescaled):  # a larger head spreads the logits over both caps' curved range
            m.tok_emb.weight.mul_(40)
        rescaled.logit_rescale.copy_(torch.tensor([4.0, 11.0]))
        x = torch.randint(0, 64, (2, 24))
        raw, got = uncapped(x, None), rescaled(x, None)
    expect = torch.where(raw > 0, 4.0 * torch.tanh(raw / 4.0), 11.0 * torch.tanh(raw / 11.0))
    torch.testing.assert_close(got, expect, rtol=1e-6, atol=1e-6)
    assert float(got.max()) <= 4.0 < -float(got.min())  # asymmetric: the negative side reaches past -4


def test_training_leaves_the_scalars_alone_and_global_ttt_trains_them():
    _, m = pair()
    groups = m.param_groups()
    assert all(p is not m.logit_rescale for ps in groups.values() for p in ps)  # no optimizer holds them
    assert not m.logit_rescale.requires_grad
    m(torch.randint(0, 64, (2, 24)), torch.randint(0, 64, (2, 24))).backward()
    assert m.logit_rescale.grad is None
    # phased global TTT fine-tunes every weight of its copy, the two scalars among them
    tokens = torch.cat([torch.cat([torch.tensor([BOS]), torch.randint(1, 64, (5,)).repeat(8)]) for _ in range(3)])
    lora = LoRAModel(m, ("q",), rank=2, slots=1, seed=0)
    with lora.bare() as bare:
        finetune(bare, tokens, split_documents(tokens, BOS), GlobalSettings(phases=1, lr=0.3, batch_seqs=2),
                 seq_len=24, device="cpu", autocast_dtype=None)  # fmt: skip
        moved = bare.logit_rescale.detach().clone()
    assert not torch.equal(moved, torch.tensor([30.0, 30.0]))


def test_the_artifact_carries_the_scalars_in_fp32():
    _, m = pair()
    with torch.no_grad():
        m.logit_rescale.copy_(torch.tensor([17.25, 29.5]))
    packed = Q.quantize_int6(m.state_dict(), {}, QuantConfig(name=QuantName.int6))
    rules = rules_of(packed, {}, QuantConfig(name=QuantName.int6))
    entry = packed["logit_rescale"]
    assert list(entry) == ["raw"] and entry["raw"].dtype == torch.float32 and rules["logit_rescale"]["bits"] == 32
    assert Q.dequantize_state_dict(packed)["logit_rescale"].tolist() == [17.25, 29.5]


def test_refusals():
    with pytest.raises(ConfigError, match="quant.logit_rescale=true rescales the logit softcap, which "):
        check_shape(ModelShape(64, 1, 32, 4, 2, 2, 24, logit_softcap=0.0, logit_rescale=True))


def test_plan_sets_the_shape_and_refuses_other_archs(compose):
    def plan(*overrides):
        return resolve(to_config(compose(["debug=smoke", *overrides])), fake_device("cpu"))

    assert plan("quant=int6", "quant.logit_rescale=true").model.logit_rescale
    assert not plan("quant=int6").model.logit_rescale
    cfg = to_config(compose(["debug=smoke", "quant.logit_rescale=true"]))
    cfg.model.arch = "pkg.mod:OwnGPT"  # resolve_model reads the name only (resolve_arch imports it)
    with pytest.raises(PlanError, match="quant.logit_rescale=true rescales the built-in GPT's softcap; model.arch="):
        resolve_model(cfg, fake_device("cpu").profile)
