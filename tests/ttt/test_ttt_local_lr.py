"""ttt.local_lr_mult: the per-document adapters step at ttt.lr x the factor, exactly as with that learning rate, for
every adapter optimizer; global TTT's learning rate is left alone; the factor is checked and recorded."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speedrun.config import to_config
from speedrun.config.finishing import TTTConfig
from speedrun.core.ttt_lora import EverySlot, RowSlotsAdam, TTTSettings, adapter_optimizer
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from speedrun.plan.settings import ttt_settings
from speedrun.records.keys import ttt_setting_keys
from support.devices import fake_device

LR = 0.05


def adapters():
    g = torch.Generator().manual_seed(0)
    return [
        torch.nn.Parameter(torch.randn(4, 3, 5, generator=g)),
        torch.nn.Parameter(torch.randn(4, 5, 2, generator=g)),
    ]


def stepped(settings: TTTSettings) -> list[torch.Tensor]:
    params = adapters()
    opt = adapter_optimizer(params, settings)
    g = torch.Generator().manual_seed(1)
    for rows in (4, 4, 3, 1):
        opt.zero_grad()
        for p in params:
            p.grad = torch.zeros_like(p)
            p.grad[:rows] = torch.randn(p[:rows].shape, generator=g)
        opt.step(rows)
    opt.finish()
    return [p.detach() for p in params]


@pytest.mark.parametrize(
    "optimizer",
    [dict(optimizer="adam", beta1=0.0, weight_decay=1.0), dict(optimizer="adam", beta1=0.9), dict(optimizer="sgd")],
)
def test_the_adapters_step_as_with_lr_times_the_factor(optimizer):
    base = TTTSettings(rank=3, lr=LR, chunk_size=8, **optimizer)
    scaled = stepped(dataclasses.replace(base, local_lr_mult=0.75))
    same = stepped(dataclasses.replace(base, lr=LR * 0.75))
    plain = stepped(base)
    for a, b, c in zip(scaled, same, plain, strict=True):
        assert torch.equal(a, b) and not torch.equal(a, c)
    opt = adapter_optimizer(adapters(), dataclasses.replace(base, local_lr_mult=0.75))
    lr = opt.lr if isinstance(opt, RowSlotsAdam) else opt.opt.param_groups[0]["lr"]
    assert isinstance(opt, (RowSlotsAdam, EverySlot)) and lr == LR * 0.75


def test_global_ttt_keeps_its_own_lr_and_the_factor_is_recorded(compose):
    plan = resolve(
        to_config(compose(["debug=smoke", "ttt=record", "ttt.lr=1e-4", "ttt.local_lr_mult=0.75"])), fake_device("cpu")
    )
    s = ttt_settings(plan)
    assert (s.lr, s.local_lr_mult, s.phased.lr) == (1e-4, 0.75, plan.ttt.phased.lr) and s.phased.lr == 1e-3
    assert ttt_setting_keys(plan.ttt)["ttt_local_lr_mult"] == 0.75


@pytest.mark.parametrize("bad", [0.0, -0.5, float("nan")])
def test_a_factor_that_is_not_positive_is_refused(bad):
    with pytest.raises(ConfigError, match=rf"ttt.local_lr_mult={bad} must be > 0"):
        TTTConfig(local_lr_mult=bad)
