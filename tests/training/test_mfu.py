"""MFU: the peak of the card that ran (from the table of cards, tests/hardware/test_cards.py), mfu_profile for an
emulated profile, and each token charged the context length of the stage it was trained in."""

from __future__ import annotations

import logging
import types

from speedrun.config import to_config
from speedrun.plan import resolve
from speedrun.run.mfu import stage_tokens, training_flops
from support.devices import fake_device


def plan_on(compose, profile, *overrides, name=None):
    return resolve(to_config(compose(list(overrides))), fake_device(profile, name))


def test_mfu_divides_by_the_card_that_ran_not_the_profile(compose):
    # an H100 PCIe is detected as the h100 profile (its recipe), but its bf16 peak is 756, not the SXM's 989.5
    plan = plan_on(compose, "h100", name="NVIDIA H100 PCIe")
    assert (plan.hardware, plan.card, plan.peak_flops, plan.emulated) == ("h100", "H100 PCIe", 756e12, False)
    unknown = plan_on(compose, "a100", name="NVIDIA RTX 6000 Ada Generation")
    assert unknown.card is None and unknown.peak_flops is None


def test_h100_profile_on_an_h200_is_emulation_with_the_h200s_peak(compose):
    plan = plan_on(compose, "h200", "hardware=h100", name="NVIDIA H200 NVL")
    assert plan.emulated and plan.memory_cap_gb == 80.0 and plan.card == "H200 NVL"
    assert (plan.peak_flops, plan.profile_peak_flops) == (835.5e12, 989e12)


def _record(plan, stages, steps, seconds, caplog=None):
    """The runner's own recording of a finished training (JobRecord.record_training, Job.training_keys) on a fake
    state."""
    from speedrun.core.train import TrainState
    from speedrun.run.job import Job
    from speedrun.run.job_record import JobRecord

    job = Job(JobRecord(types.SimpleNamespace(run_dir=None), {}, None))
    job.record.plan = plan
    job.record.state = TrainState(
        steps=steps,
        tokens=steps * plan.tokens_per_step,
        train_seconds=seconds,
        compile_seconds=0.0,
        last_loss=1.0,
        stages=stages,
        recompiles=0,
    )
    job.record.record_training()
    return job.record.result


def test_runner_records_mfu_against_the_card_and_mfu_profile_when_emulated(compose, caplog):
    plan = plan_on(compose, "h200", "hardware=h100")  # emulated: the recipe of an h100 on an H200
    result = _record(plan, [{"seq_len": plan.model.seq_len, "start_step": 0}], 100, 60.0)
    flops = 100 * plan.tokens_per_step * plan.model.flops_per_token(plan.model.seq_len)
    assert result["mfu"] == round(flops / 60.0 / 989.5e12, 4) and result["card"] == "H200 SXM"
    assert result["mfu_profile"] == round(flops / 60.0 / 989e12, 4) and "mfu_device" not in result
    with caplog.at_level(logging.WARNING, logger="speedrun"):
        unknown = _record(
            plan_on(compose, "a100", name="NVIDIA RTX 6000 Ada Generation"),
            [{"seq_len": 1024, "start_step": 0}],
            100,
            60.0,
        )
    assert unknown["mfu"] is None and unknown["tokens_per_s"] > 0
    assert "no peak FLOP/s known for 'NVIDIA RTX 6000 Ada Generation'" in caplog.text


def test_progressive_schedule_charges_each_token_its_own_stage(compose):
    """pgolf_progressive's stages as they ran on an H100: 1024 from step 0, 2048 from step
    46, 3072 from step 293, 404 steps. Charging every token at 3072 overstates the FLOPs (and MFU)."""
    plan = plan_on(compose, "h100", "experiment=pgolf_progressive")
    stages = [
        {"seq_len": 1024, "start_step": 0},
        {"seq_len": 2048, "start_step": 46},
        {"seq_len": 3072, "start_step": 293},
    ]
    step_tokens = plan.tokens_per_step
    assert stage_tokens(stages, 404, step_tokens, 3072) == [
        (1024, 46 * step_tokens),
        (2048, 247 * step_tokens),
        (3072, 111 * step_tokens),
    ]
    m = plan.model
    expected = step_tokens * (
        46 * m.flops_per_token(1024) + 247 * m.flops_per_token(2048) + 111 * m.flops_per_token(3072)
    )
    result = _record(plan, stages, 404, 300.0)
    assert result["train_flops"] == expected
    assert result["mfu"] == round(expected / 300.0 / 989.5e12, 4)
    assert result["flops_per_token"] < m.flops_per_token(3072)


def test_a_sliding_window_charges_the_window_and_a_document_mask_the_full_context():
    from speedrun.core.model import ModelShape

    m = ModelShape(vocab_size=1024, n_layer=2, d_model=64, n_head=2, n_kv_head=1, mlp_mult=2, seq_len=2048)
    assert training_flops(m, [(2048, 10)], window=256) == 10 * m.flops_per_token(256)
    assert training_flops(m, [(128, 10)], window=256) == 10 * m.flops_per_token(128)  # the window is longer
    assert training_flops(m, [(2048, 10)]) == 10 * m.flops_per_token(2048)  # no window (masks or not): full T
