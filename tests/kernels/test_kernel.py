"""The kernel group: it composes, resolves against the device with refusals that name a fix that works, picks flex
tiles that fit a T4's shared memory per head_dim, reads tuned tables with their provenance, and the tuner's
numerics check rejects a wrong candidate however fast it is."""

from __future__ import annotations

import pytest

from speedrun.config import to_config
from speedrun.errors import ConfigError, PlanError
from speedrun.kernels.tiles import bwd_smem_bytes, choose_tiles, fwd_smem_bytes
from speedrun.plan import resolve
from support.devices import fake_device


def plan_for(compose, device, *overrides):
    return resolve(to_config(compose(list(overrides))), fake_device(device))


def test_default_and_tuned_options_compose(compose):
    cfg = to_config(compose(["kernel.compile_mode=max-autotune-no-cudagraphs", "kernel.fp8=[mlp_down]"]))
    assert (cfg.kernel.name, cfg.kernel.compile_mode, cfg.kernel.fp8) == (
        "default",
        "max-autotune-no-cudagraphs",
        ["mlp_down"],
    )
    assert to_config(compose(["kernel=tuned"])).kernel.name == "tuned"


@pytest.mark.parametrize(
    "override,needle",
    [
        ("kernel.compile_mode=fast", "max-autotune-no-cudagraphs"),
        ("kernel.fp8=[mlp_up]", "mlp_down"),
        ("kernel.flex_fwd.block_m=48", "power of two"),
        ("kernel.flex_bwd.block_n1=16", "multiple of block_m1"),
    ],
)
def test_schema_checks_name_the_valid_values(compose, override, needle):
    extra = ["kernel.flex_bwd.block_m1=32"] if "block_n1" in override else []
    with pytest.raises(ConfigError, match=needle):
        to_config(compose([override, *extra]))


def test_default_is_todays_behaviour(compose):
    plan = plan_for(compose, "h100")
    assert (plan.kernel.compile_mode, plan.kernel.cuda_graphs, plan.kernel.fp8) == ("default", False, ())
    flex = plan_for(compose, "h100", "attn=flex")
    assert dict(flex.attn_options)["kernel_options"] == {"BLOCK_M": 128, "BLOCK_N": 64}  # unprefixed, as before
    assert flex.kernel.flex_tiles is None
    assert plan_for(compose, "h100", "precision=fp8").kernel.fp8 == ("all",)  # the shorthand
    keys = plan.kernel.result_keys()
    assert keys["kernel_compile_mode"] == "default" and keys["kernel_fp8"] == "none" and keys["kernel"] == "default"


def test_settings_reach_the_plan(compose):
    plan = plan_for(
        compose,
        "h100",
        "kernel.cuda_graphs=true",
        "kernel.fp8=[mlp,attn_proj]",
        "kernel.compile_mode=max-autotune-no-cudagraphs",
        "kernel.coordinate_descent_tuning=true",
    )
    k = plan.kernel
    assert k.coordinate_descent_tuning and plan.kernel.result_keys()["kernel_coordinate_descent"] is True
    fused = plan_for(compose, "h100", "kernel.fused_qkv=true", "kernel.fp8=[mlp]").kernel
    assert fused.fused_qkv and fused.result_keys()["kernel_fused_qkv"] is True and "fused qkv" in fused.describe()
    assert plan_for(compose, "h100").kernel.result_keys()["kernel_fused_qkv"] is False
    assert (k.cuda_graphs, k.fp8, k.compile_mode, plan.precision) == (
        True,
        ("mlp", "attn_proj"),
        "max-autotune-no-cudagraphs",
        "bf16",
    )
    assert plan.kernel.result_keys()["kernel_fp8"] == "mlp,attn_proj" and "cuda graphs on" in plan.describe()
    tiles = plan_for(
        compose,
        "h100",
        "attn=flex",
        "kernel.flex_bwd.block_m1=32",
        "kernel.flex_bwd.block_n1=64",
        "kernel.flex_bwd.block_m2=64",
        "kernel.flex_bwd.block_n2=32",
    )
    opts = dict(tiles.attn_options)["kernel_options"]
    assert opts == {
        "fwd_BLOCK_M": 128,
        "fwd_BLOCK_N": 64,
        "bwd_BLOCK_M1": 32,
        "bwd_BLOCK_N1": 64,
        "bwd_BLOCK_M2": 64,
        "bwd_BLOCK_N2": 32,
    }


# device, the request, a needle of the refusal, and the fix the message names (appended to the request).
REFUSALS = [
    ("cpu", ["kernel.cuda_graphs=true"], "needs a CUDA GPU", ["kernel.cuda_graphs=false"]),
    (
        "h100",
        ["kernel.cuda_graphs=true", "kernel.compile_mode=reduce-overhead"],
        "own CUDA graphs",
        ["kernel.compile_mode=max-autotune-no-cudagraphs"],
    ),
    (
        "h100",
        ["kernel.cuda_graphs=true", "kernel.dynamic_shapes=true"],
        "changing ones",
        ["kernel.dynamic_shapes=false"],
    ),
    ("h100", ["kernel.cuda_graphs=true", "budget.warmup_steps=0"], "during warm-up", ["budget.warmup_steps=1"]),
    ("h100", ["hardware=t4", "kernel.fp8=[mlp_down]"], "compute capability >= 8.9", ["kernel.fp8=[]"]),
    ("h100", ["hardware=a100", "kernel.fp8=[mlp_down]"], "compute capability >= 8.9", ["kernel.fp8=[]"]),
    ("h100", ["precision=fp16", "kernel.fp8=[mlp_down]"], "precision=bf16", ["precision=bf16"]),
    ("h100", ["precision=fp8", "kernel.fp8=[]"], "asks for none", ["precision=bf16"]),
    ("h100", ["kernel.fused_qkv=true", "kernel.fp8=[attn_qkv]"], "one matmul", ["kernel.fp8=[mlp]"]),
    ("h100", ["kernel.fused_qkv=true", "precision=fp8"], "one matmul", ["kernel.fused_qkv=false"]),
    (
        "h100",
        ["hardware.compile=false", "kernel.compile_mode=max-autotune"],
        "needs torch.compile",
        ["kernel.compile_mode=default"],
    ),
    (
        "h100",
        ["hardware.compile=false", "kernel.coordinate_descent_tuning=true"],
        "needs torch.compile",
        ["kernel.coordinate_descent_tuning=false"],
    ),
    ("h100", ["kernel.flex_fwd.block_m=64"], "are for attn=flex", ["attn=flex"]),
    (
        "h100",
        [
            "hardware=t4",
            "attn=flex",
            "model=hd80",
            "kernel.flex_bwd.block_m1=64",
            "kernel.flex_bwd.block_n1=64",
            "kernel.flex_bwd.block_m2=64",
            "kernel.flex_bwd.block_n2=64",
        ],
        "has 64 KB",
        [
            "kernel.flex_bwd.block_m1=32",
            "kernel.flex_bwd.block_n1=32",
            "kernel.flex_bwd.block_m2=32",
            "kernel.flex_bwd.block_n2=32",
        ],
    ),
]


@pytest.mark.parametrize("device,overrides,needle,fix", REFUSALS)
def test_refusals_name_a_fix_that_resolves(compose, device, overrides, needle, fix):
    with pytest.raises(PlanError) as e:
        plan_for(compose, device, *overrides)
    assert needle in str(e.value)
    if "kernel.flex_bwd" in fix[0]:
        assert "32/32/32/32" in str(e.value)  # the tiles named as fitting are the fix
    else:
        assert all(f in str(e.value) for f in fix), f"{fix} not named in: {e.value}"
    plan_for(compose, device, *overrides, *fix)


# ---- T4 tiles -------------------------------------------------------------------------------------------------

# Shared memory Triton 3.6 reported (metadata.shared) for kernels with flex's structure compiled for sm75, fp16,
# num_warps 4 (scripts/flex_smem.py --mimic, in the repository's history at e74be17): (kind, tiles, head_dim, bytes). The estimate must reproduce them
# exactly, or over-estimate by at most the R x S scratch it adds for safety.
MEASURED_SM75 = [
    ("fwd", (64, 32), 64, 24576),
    ("fwd", (64, 64), 128, 65536),
    ("fwd", (128, 64), 128, 98304),
    ("bwd", (16, 16, 16, 16), 64, 12288),
    ("bwd", (32, 32, 32, 32), 64, 24576),
    ("bwd", (64, 64, 64, 64), 64, 49152),
    ("bwd", (32, 64, 64, 32), 64, 40960),
    ("bwd", (64, 128, 128, 64), 64, 98304),
    ("bwd", (16, 16, 16, 16), 128, 24576),
    ("bwd", (32, 32, 32, 32), 128, 49152),
    ("bwd", (32, 64, 64, 32), 128, 81920),
    ("bwd", (32, 128, 128, 32), 128, 147456),
]


@pytest.mark.parametrize("kind,tiles,head_dim,measured", MEASURED_SM75)
def test_smem_estimate_matches_triton_sm75(kind, tiles, head_dim, measured):
    est = fwd_smem_bytes(*tiles, head_dim) if kind == "fwd" else bwd_smem_bytes(*tiles, head_dim)
    scratch = 0 if kind == "fwd" else 2 * max(tiles[1] * tiles[0], tiles[2] * tiles[3])
    assert measured <= est <= measured + scratch, (est, measured)


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128])
def test_t4_tiles_per_head_dim_fit_and_reach_both_kernels(compose, head_dim):
    n_head = 8
    plan = plan_for(compose, "h100", "hardware=t4", "attn=flex", "model=hd80", f"model.d_model={n_head * head_dim}")
    assert plan.model.head_dim == head_dim
    opts = dict(plan.attn_options)["kernel_options"]
    assert {"fwd_BLOCK_M", "fwd_BLOCK_N", "bwd_BLOCK_M1", "bwd_BLOCK_N1", "bwd_BLOCK_M2", "bwd_BLOCK_N2"} <= set(opts)
    smem = dict(plan.kernel.flex_smem)
    assert set(smem) == {"fwd", "bwd"} and max(smem.values()) <= 32 * 1024  # two programs per 64 KB SM
    assert smem["fwd"] == fwd_smem_bytes(opts["fwd_BLOCK_M"], opts["fwd_BLOCK_N"], head_dim)
    # 80 and 96 are padded to 128 inside flex's tiles, so they get 128's tiles
    if head_dim in (80, 96):
        assert choose_tiles(head_dim, 65536, 65536) == choose_tiles(128, 65536, 65536)


def test_tile_choice_prefers_two_programs_per_sm_then_one():
    t = choose_tiles(64, 65536, 65536)
    assert (t.block_m, t.block_n, t.block_m1, t.block_n1) == (64, 64, 32, 32)
    big = choose_tiles(256, 65536, 65536)  # nothing fits half the SM: the largest that fits one program
    assert bwd_smem_bytes(big.block_m1, big.block_n1, big.block_m2, big.block_n2, 256) <= 65536
    with pytest.raises(ValueError, match="no flex tiling"):
        choose_tiles(512, 65536, 65536)


def test_flex_backend_takes_prefixed_options_and_checks_them():
    from speedrun.core.attention import get_backend

    flex = get_backend("flex", kernel_options={"fwd_BLOCK_M": 64, "bwd_BLOCK_N1": 32, "bwd_num_warps": 4})
    assert flex.kernel_options == {"fwd_BLOCK_M": 64, "bwd_BLOCK_N1": 32, "bwd_num_warps": 4}
    with pytest.raises(ValueError, match="divide"):
        get_backend("flex", kernel_options={"bwd_BLOCK_M2": 96})


def test_cuda_graphs_raise_the_warm_up_to_what_capture_needs(compose):
    """Two eager micro-batches, then the capture: at 2 micro-batches per step one warm-up step is too few, so the
    plan runs 2 (untimed, undone); at 8 per step the requested 1 is enough."""
    h100 = fake_device("h100")
    two = resolve(to_config(compose(["kernel.cuda_graphs=true", "kernel.micro_batch=256"])), h100)
    assert (two.grad_accum, two.warmup_steps) == (2, 2)
    eight = resolve(to_config(compose(["kernel.cuda_graphs=true"])), h100)
    assert (eight.grad_accum, eight.warmup_steps) == (8, 1)
    assert resolve(to_config(compose(["kernel.micro_batch=256"])), h100).warmup_steps == 1  # no graphs: as asked


def test_fused_qkv_reaches_the_built_model(compose):
    from speedrun.run.build import build_attention, build_model

    for fused in (False, True):
        plan = plan_for(compose, "cpu", f"kernel.fused_qkv={str(fused).lower()}")
        model = build_model(plan, build_attention(plan), bos_id=1)[0]
        assert [b.attn.fused_qkv for b in model.blocks] == [fused] * plan.model.n_layer
