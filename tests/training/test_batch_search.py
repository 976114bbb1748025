"""hardware.micro_batch=auto / eval.batch_size=auto: the search logic, with a fake device that runs out of memory
above a threshold (the real search needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from speedrun.config import to_config
from speedrun.errors import ConfigError
from speedrun.plan import resolve
from speedrun.run.batch_search import fits_probe, largest_fitting, plan_with_batches, search_batches
from support.devices import fake_device


def oom_above(limit_tokens: int, seen: list):
    def attempt(seq_len: int, micro_batch: int) -> None:
        seen.append((seq_len, micro_batch))
        if seq_len * micro_batch > limit_tokens:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")

    return attempt


def test_largest_fitting_is_a_binary_search_that_catches_only_oom():
    tried: dict = {}
    fits = fits_probe(lambda n: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("x")) if n > 24 else None)
    assert largest_fitting([1, 2, 4, 8, 16, 32, 64, 128], fits, tried) == 16
    assert len(tried) <= 4 and tried[32] is False and tried[16] is True
    assert largest_fitting([4, 8], fits_probe(lambda n: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError()))) is None
    with pytest.raises(ValueError):  # a real bug is not mistaken for "too big"
        fits_probe(lambda n: (_ for _ in ()).throw(ValueError("bug")))(4)


def test_auto_micro_batch_keeps_tokens_per_step_and_fits_every_stage(compose):
    cfg = to_config(
        compose(
            [
                "model=tiny",
                "hardware.micro_batch=auto",
                "budget.tokens_per_step=8192",
                "schedule=progressive",
                "schedule.seq_len=[64@0.5,128@1.0]",
            ]
        )
    )
    plan = resolve(cfg, fake_device("cpu"))
    assert plan.micro_batch_search and plan.eval.batch_search  # eval follows hardware.micro_batch=auto
    seen: list = []
    # the 128-length stage may use 3000 tokens, the 64-length one only 2000: the choice must fit both
    limits = {128: 3000, 64: 2000}

    def attempt(seq_len, micro_batch):
        seen.append((seq_len, micro_batch))
        if seq_len * micro_batch > limits[seq_len]:
            raise torch.cuda.OutOfMemoryError("fake")

    def attempt_eval(batch):
        if batch > 16:
            raise torch.cuda.OutOfMemoryError("fake")

    new, report = plan_with_batches(plan, attempt, attempt_eval, lambda _: None)
    assert new.micro_batch * 128 == 1024  # 1024 tokens: fits 2000 and 3000, divides 8192, both lengths divide it
    assert [(s.seq_len, s.micro_batch) for s in new.stages] == [(64, 16), (128, 8)]
    assert new.grad_accum * new.micro_batch * 128 == 8192 == new.tokens_per_step
    assert new.eval.batch_size == 16 and report["eval"]["32"] is False
    assert seen  # only divisors of the sequences per step were tried:
    assert all((8192 // L) % mb == 0 for L, mb in seen)


def test_nothing_fits_is_an_out_of_memory_error(compose):
    plan = resolve(to_config(compose(["model=tiny", "hardware.micro_batch=auto"])), fake_device("cpu"))
    with pytest.raises(torch.cuda.OutOfMemoryError, match="not even 1 sequence"):
        plan_with_batches(plan, oom_above(0, []), lambda b: None, lambda _: None)


def test_on_cpu_the_plan_keeps_its_start_values(compose):
    plan = resolve(to_config(compose(["model=tiny", "hardware.micro_batch=auto"])), fake_device("cpu"))
    lines: list = []
    same, report = search_batches(plan, torch.nn.Linear(1, 1), lines.append)
    assert same is plan and report == {"skipped": "cpu"} and "needs a CUDA device" in lines[0]
    assert plan.micro_batch == 4096 // plan.model.seq_len  # the profile's default, which divides the step


@pytest.mark.parametrize(
    "value,ok", [("auto", True), (8, True), ("8", True), (None, True), (0, False), ("big", False), (True, False)]
)
def test_the_batch_fields_take_an_int_auto_or_null(compose, value, ok):
    override = f"hardware.micro_batch={'null' if value is None else value}"
    if ok:
        cfg = to_config(compose([override]))
        assert cfg.hardware.micro_batch == (int(value) if value not in (None, "auto") else value)
    else:
        with pytest.raises(ConfigError, match="hardware.micro_batch"):
            to_config(compose([override]))


@pytest.mark.gpu
def test_the_real_search_runs_on_cuda(compose):
    """On a GPU: the eager tries run, a tiny model fits every candidate, and an impossible size is reported."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from speedrun.core.attention import get_backend
    from speedrun.hardware import profiles as hardware
    from speedrun.run.build import build_model

    plan = resolve(
        to_config(
            compose(["model=tiny", "hardware.micro_batch=auto", "budget.tokens_per_step=16384", "eval.tokens=8192"])
        ),
        hardware.detect(),
    )
    model, _, _, _ = build_model(plan, get_backend(plan.attn, **dict(plan.attn_options)), bos_id=1)
    lines: list = []
    new, report = search_batches(plan, model, lines.append)
    sequences = 16384 // plan.model.seq_len
    assert new.micro_batch == sequences and new.grad_accum == 1  # a tiny model fits the whole step at once
    assert new.eval.batch_size == 8192 // plan.model.seq_len and report["eval"]
    assert any("micro-batch search" in line for line in lines)
