"""The resolver: every hardware x attention x precision either resolves to a Plan or raises PlanError."""

from __future__ import annotations

import copy
import itertools

import pytest

from speedrun.config import to_config
from speedrun.errors import ConfigError
from speedrun.plan import PlanError, resolve
from support.devices import fake_device

HARDWARE = ["auto", "cpu", "t4", "a100", "h100", "b200"]
ATTN = ["auto", "sdpa", "math", "flex", "fa3"]
KERNELS = ["auto", "flash", "cudnn", "efficient", "math"]
PRECISION = ["auto", "fp32", "bf16", "fp16", "fp8"]
DEVICES = ["cpu", "t4", "h100", "h200", "b200"]


def plan_for(compose, device, *overrides):
    return resolve(to_config(compose(list(overrides))), fake_device(device))


@pytest.fixture(scope="module")
def default_config():
    from hydra import compose, initialize_config_dir

    from speedrun.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_config(compose("config"))


@pytest.mark.parametrize("device", DEVICES)
def test_every_combination_resolves_or_names_the_conflict(default_config, device):
    outcomes = {}
    for hw, attn, kernel, prec in itertools.product(HARDWARE, ATTN, KERNELS, PRECISION):
        if attn != "sdpa" and kernel != "auto":
            continue
        overrides = [f"hardware={hw}", f"attn={attn}", f"attn.kernel={kernel}", f"precision={prec}"]
        cfg = copy.deepcopy(default_config)
        cfg.hardware.name, cfg.attn.name, cfg.attn.kernel, cfg.precision.name = hw, attn, kernel, prec
        try:
            plan = resolve(cfg, fake_device(device))
        except PlanError as e:
            msg = str(e)
            assert "use " in msg or "choose one of" in msg, f"{overrides}: error without a way out: {msg}"
            outcomes[tuple(overrides)] = "refused"
            continue
        assert plan.grad_accum * plan.micro_batch * plan.model.seq_len == plan.tokens_per_step
        assert plan.precision in ("fp32", "bf16", "fp16", "fp8")
        if plan.attn == "sdpa":
            assert plan.attn_kernel.startswith("sdpa:") and "auto" not in plan.attn_kernel
        outcomes[tuple(overrides)] = plan.attn_kernel
    assert "refused" in outcomes.values() or device == "cpu"
    assert any(v != "refused" for v in outcomes.values())


def test_cpu_default_is_small_and_pinned(compose):
    plan = plan_for(compose, "cpu")
    assert (plan.device, plan.hardware, plan.precision, plan.model_name) == ("cpu", "cpu", "fp32", "tiny")
    assert plan.attn_kernel == "sdpa:flash" and not plan.compile and plan.peak_flops is None


def test_gpu_default_trains_pgolf_baseline_in_bf16(compose):
    plan = plan_for(compose, "h100")
    assert (plan.model_name, plan.precision, plan.tokens_per_step, plan.compile) == (
        "pgolf_baseline",
        "bf16",
        524288,
        True,
    )
    assert plan.grad_accum == 8 and plan.peak_flops == 989.5e12 and not plan.emulated and plan.card == "H100 SXM"


def test_t4_on_h100_is_emulated_with_its_recipe(compose):
    plan = plan_for(compose, "h100", "hardware=t4")
    assert plan.emulated and plan.memory_cap_gb == 15.0
    assert (plan.precision, plan.grad_scaler, plan.attn_kernel) == ("fp16", True, "sdpa:efficient")
    # mfu divides by the card that ran (the H100's fp16 peak); the T4's figure is mfu_profile's
    assert (plan.peak_flops, plan.profile_peak_flops) == (989.5e12, 65e12) and plan.ns_dtype == "fp32"


def test_h200_is_the_h100_family_with_its_own_memory(compose):
    plan = plan_for(compose, "h200")
    assert plan.hardware == "h200" and plan.peak_flops == 989.5e12 and not plan.emulated
    assert plan.profile_peak_flops is None
    capped = plan_for(compose, "h200", "hardware=h100")
    assert capped.emulated and capped.memory_cap_gb == 80.0


# device, the request, a needle of the refusal, and the fix the message names (appended to the request).
REFUSALS = [
    ("cpu", ["hardware=h100"], "needs a CUDA GPU", ["hardware=cpu"]),
    ("t4", ["hardware=h100"], "larger than this device", ["hardware=auto"]),
    ("t4", ["precision=bf16"], "use precision=fp16", ["precision=fp16"]),
    ("h100", ["hardware=t4", "precision=bf16"], "compute capability >= 8.0", ["precision=fp16"]),
    ("t4", ["attn=sdpa", "attn.kernel=flash"], "attn.kernel=efficient", ["attn.kernel=efficient"]),
    ("h100", ["precision=fp32", "attn.kernel=flash"], "needs fp16 or bf16", ["attn.kernel=efficient"]),
    ("cpu", ["attn=flex"], "use attn=math or attn=sdpa", ["attn=sdpa"]),
    ("cpu", ["attn=flex"], "use attn=math or attn=sdpa", ["attn=math"]),
    ("cpu", ["attn.kernel=cudnn"], "needs a CUDA GPU", ["attn.kernel=flash"]),
    ("cpu", ["precision=fp16"], "needs a CUDA GPU", ["precision=fp32"]),
    ("h100", ["attn=sdpa", "attn.document_mask=true"], "use attn=flex or attn=math", ["attn=flex"]),
    ("h100", ["attn=math", "hardware.micro_batch=256"], "use attn=flex", ["attn=flex"]),
    ("h100", ["attn=flex", "model.d_model=64"], "needs head_dim >= 16", ["attn=sdpa"]),
    ("b200", ["attn=fa3"], "use attn=flex or attn=math or attn=sdpa", ["attn=sdpa"]),
    ("cpu", ["budget.tokens_per_step=5000"], "not a multiple of micro-batch tokens", ["budget.tokens_per_step=4096"]),
    ("cpu", ["model.n_kv_head=3", "model=tiny"], "must divide", ["model.n_kv_head=2"]),
]


@pytest.mark.parametrize("device,overrides,needle,fix", REFUSALS)
def test_refusals_name_the_problem_and_a_fix_that_resolves(compose, device, overrides, needle, fix):
    with pytest.raises(ConfigError) as e:
        plan_for(compose, device, *overrides)
    assert needle in str(e.value)
    for item in fix:  # the way out the message names is a real one
        assert item.split("=")[-1] in str(e.value), f"{item} is not the fix the message names: {e.value}"
    plan_for(compose, device, *overrides, *fix)


def test_a_misspelt_choice_is_refused_at_compose_time_listing_the_valid_values(compose):
    for override, valid in (
        ("quant.compressor=gzip", "zlib, lzma, brotli, zstd"),
        ("schedule.progress=steps", "time, step"),
        ("attn.kernel=flash2", "flash, cudnn"),
    ):
        with pytest.raises(Exception) as e:
            compose([override])
        chain, err = [], e.value
        while err is not None:  # Hydra wraps OmegaConf's message ("expected one of [...]")
            chain.append(str(err))
            err = err.__cause__ or err.__context__
        assert valid in " ".join(chain), chain


def test_math_kernel_fits_for_the_tiny_model_on_a_t4(compose):
    plan = plan_for(compose, "h100", "hardware=t4", "attn=math", "model=tiny", "hardware.micro_batch=8")
    assert plan.attn_kernel == "math"


def test_unknown_gpu_gets_nearest_profile_with_a_warning():
    from speedrun.hardware.profiles import profile_for_gpu

    with pytest.warns(UserWarning, match="nearest profile 'a100'"):
        assert profile_for_gpu("NVIDIA RTX 6000 Ada", (8, 9), 48.0).name == "a100"
    assert profile_for_gpu("NVIDIA H200", (9, 0), 141.0).name == "h200"


@pytest.mark.parametrize("device", ["cpu", "t4", "h100", "h200", "b200"])
def test_every_single_choice_with_the_rest_auto_resolves_on_its_own_device(default_config, device):
    """A refusal must come from what the user asked for, not from an auto pick that clashes with it."""
    for field, values in (("precision", ["fp32", "bf16", "fp16", "fp8"]), ("attn", ["sdpa", "math"])):
        for value in values:
            cfg = copy.deepcopy(default_config)
            getattr(cfg, field).name = value
            try:
                resolve(cfg, fake_device(device))
            except PlanError as e:
                assert f"{field}={value}" in str(e), f"{field}={value} on {device}: refused for another reason: {e}"


def test_model_overrides_apply_on_top_of_the_auto_preset(compose):
    plan = plan_for(compose, "cpu", "model.n_layer=2", "model.seq_len=128")
    assert (plan.model_name, plan.model.n_layer, plan.model.seq_len, plan.model.d_model) == ("tiny", 2, 128, 128)
    gpu = plan_for(compose, "h100", "model.d_model=256")
    assert (gpu.model_name, gpu.model.d_model, gpu.model.n_layer) == ("pgolf_baseline", 256, 9)


def test_the_profiles_micro_batch_is_lowered_to_split_the_step_over_the_ranks(compose):
    """CPU: 4096 tokens a step and 16 x 256 a micro-batch; over 2 ranks the profile's default could not split, so
    the resolver takes the largest micro-batch that does, whoever started the ranks."""
    from speedrun.plan import WorldInfo

    one = plan_for(compose, "cpu")
    assert (one.micro_batch, one.grad_accum, one.dist.world_size) == (16, 1, 1)
    two = plan_for(compose, "cpu", "dist.nproc=2")
    assert (two.micro_batch, two.grad_accum, two.dist.world_size) == (8, 1, 2)
    torchrun = WorldInfo(launcher="torchrun", rank=0, world_size=2, local_rank=0, local_world_size=2)
    started = resolve(to_config(compose([])), fake_device("cpu"), world=torchrun)
    assert (started.micro_batch, started.dist.world_size, started.dist.launch) == (8, 2, "torchrun")
    four = plan_for(compose, "cpu", "dist.nproc=4", "budget.tokens_per_step=2048")
    assert four.micro_batch * four.model.seq_len * four.grad_accum * 4 == 2048 and four.micro_batch == 2


def test_a_micro_batch_the_user_set_that_does_not_split_is_still_refused(compose):
    with pytest.raises(PlanError, match="does not split over 2 ranks") as e:
        plan_for(compose, "cpu", "dist.nproc=2", "hardware.micro_batch=16")
    assert "hardware.micro_batch=8" in str(e.value)
    assert plan_for(compose, "cpu", "dist.nproc=2", "hardware.micro_batch=8").micro_batch == 8


def test_the_default_micro_batch_also_holds_every_stage_length(compose):
    """256@0.5,384@1.0 over 18 sequences of 384: 9 divides the step but 9 x 384 is no multiple of 256; 6 is."""
    plan = plan_for(
        compose,
        "cpu",
        "schedule=progressive",
        'schedule.seq_len="256@0.5,384@1.0"',
        "budget.tokens_per_step=6912",
    )
    assert plan.micro_batch == 6 and [(s.seq_len, s.micro_batch) for s in plan.stages] == [(256, 9), (384, 6)]


def test_a_step_that_no_micro_batch_splits_names_no_micro_batch_that_breaks_the_stages(compose):
    """debug=smoke's 6144 tokens a step at pgolf_progressive's 3072 cannot split over 2 ranks: 1 sequence would, but
    1 x 3072 does not hold its 2048s, so the message offers only the fixes that resolve."""
    overrides = ["experiment=pgolf_progressive", "debug=smoke", "dist.nproc=2"]
    with pytest.raises(PlanError, match="budget.tokens_per_step=12288") as e:
        plan_for(compose, "cpu", *overrides)
    assert "hardware.micro_batch" not in str(e.value)
    plan_for(compose, "cpu", *overrides, "budget.tokens_per_step=12288")
