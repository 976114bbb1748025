"""The kernel part of the plan: the kernel group (and, under kernel=tuned, this card's table) resolved against the
device, the precision, the attention backend and the budget. Every refusal names what works instead; nothing is
dropped silently (a CUDA graph that cannot be captured is refused here, not skipped at run time).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from speedrun.config import Config
from speedrun.config.kernel import FP8_TARGETS, GRAPHING_MODES
from speedrun.core.model import ModelShape
from speedrun.errors import PlanError
from speedrun.hardware.profiles import HardwareProfile
from speedrun.kernels import GRAPH_EAGER_CALLS
from speedrun.plan.model_choice import model_class
from speedrun.plan.types import KernelPlan

_TILE_KEYS = {
    "flex_fwd.block_m": "block_m",
    "flex_fwd.block_n": "block_n",
    "flex_fwd.num_warps": "fwd_num_warps",
    "flex_fwd.num_stages": "fwd_num_stages",
    "flex_bwd.block_m1": "block_m1",
    "flex_bwd.block_n1": "block_n1",
    "flex_bwd.block_m2": "block_m2",
    "flex_bwd.block_n2": "block_n2",
    "flex_bwd.num_warps": "bwd_num_warps",
    "flex_bwd.num_stages": "bwd_num_stages",
}
"""kernel-group tile settings -> FlexTiles fields."""

FLEX_BLOCK_SIZE = 128
"""The BlockMask block of attention/flex.py; every tile must divide it."""


def kernel_settings(cfg: Config, profile: HardwareProfile, model_name: str) -> tuple[dict[str, Any], str]:
    """-> (the kernel fields that apply: this card's tuned table under kernel=tuned with the command line's fields
    on top, flat as KernelConfig.explicit(); where they come from, for KernelPlan.source)."""
    k = cfg.kernel
    explicit = k.explicit()
    table: dict[str, Any] = {}
    source = str(k.name)
    if k.name == "tuned":
        from speedrun.kernels.tuned import load_entry  # kernel=tuned alone reads its tables

        table, _ = load_entry(profile.name, model_name)
        source = f"tuned:{profile.name}/{model_name}"
    if explicit and k.name != "default":
        source += "+set"
    return {**table, **explicit}, source


def kernel_micro_batch(cfg: Config, settings: dict[str, Any]) -> int | None:
    """The micro-batch the kernel settings choose, or None when hardware.micro_batch (or the profile) decides.
    hardware.micro_batch, set, wins over a tuned table's value; set beside kernel.micro_batch, the two must agree."""
    chosen = settings.get("micro_batch")
    hardware = cfg.hardware.micro_batch
    if chosen is None or hardware is None:
        return chosen
    if cfg.kernel.micro_batch is not None and hardware != chosen:
        raise PlanError(
            f"hardware.micro_batch={hardware} and kernel.micro_batch={chosen} both set the micro-batch: "
            f"keep one of them"
        )
    return None  # the hardware group's micro-batch (a run's or an experiment's choice) wins over a table


def resolve_kernel(
    cfg: Config,
    profile: HardwareProfile,
    precision: str,
    model: ModelShape,
    attn: str,
    attn_options: dict[str, Any],
    *,
    settings: dict[str, Any],
    source: str,
    micro_batch: int | None,
    compile_on: bool,
    grad_accum: int,
    warmup_steps: int,
) -> tuple[KernelPlan, dict[str, Any]]:
    """-> (the KernelPlan, the attention options with flex's tiles in them). settings, source: kernel_settings';
    micro_batch: kernel_micro_batch's."""
    k = cfg.kernel
    explicit = k.explicit()
    on_cuda = profile.device_type == "cuda"

    compile_mode, dynamic, cdt, scope = _compile_settings(settings, compile_on)
    graphs = bool(settings.get("cuda_graphs"))
    if graphs:
        _check_graphs(on_cuda, compile_mode, dynamic, grad_accum, warmup_steps, profile)
    fp8, fp8_impl = _resolve_fp8(settings, precision, profile)
    fused_qkv = bool(settings.get("fused_qkv"))
    if fused_qkv and ({"attn_qkv", "all"} & set(fp8)):
        raise PlanError(
            f"kernel.fused_qkv=true runs q, k and v as one matmul of their concatenated weights, and "
            f"kernel.fp8=[{','.join(fp8)}] makes them fp8 linears: use kernel.fp8=[mlp] (or mlp_down, attn_proj) "
            f"with kernel.fused_qkv=true, or kernel.fused_qkv=false"
        )
    fused_ce_chunk = _fused_ce_chunk(cfg, settings, model)
    options = dict(attn_options)
    tiles, smem = None, ()
    if attn == "flex":
        tiles, smem, options = _resolve_tiles(settings, profile, precision, model, options)
    elif any(key in explicit for key in _TILE_KEYS):
        raise PlanError(
            f"kernel.flex_fwd / kernel.flex_bwd tiles are for attn=flex, and attn={attn} runs here: "
            f"add attn=flex, or drop the kernel.flex_* settings"
        )
    plan = KernelPlan(
        source=source,
        compile_mode=compile_mode,
        compile_scope=scope,
        cuda_graphs=graphs,
        dynamic_shapes=dynamic,
        coordinate_descent_tuning=cdt,
        fused_qkv=fused_qkv,
        fused_ce=bool(fused_ce_chunk),
        fused_ce_chunk=fused_ce_chunk,
        fp8=fp8,
        fp8_impl=fp8_impl,
        flex_tiles=tiles,
        flex_smem=smem,
        micro_batch=micro_batch,
        profile=k.profile,
        profile_steps=k.profile_steps,
    )
    return plan, options


FUSED_CE_LOGITS = 1 << 25
"""kernel.fused_ce's default chunk: the rows that make this many logits (128 MB in fp32; a chunk's in-place work
peaks at about three such tensors). The chunk loop runs inside operators torch.compile keeps whole, so the size
trades memory against kernel launches, not compile time: 24 chunks for a record micro-batch at vocab 8192."""


def _fused_ce_chunk(cfg: Config, settings: dict[str, Any], model: ModelShape) -> int:
    """kernel.fused_ce's rows per chunk, or 0 when it is off."""
    chunk = settings.get("fused_ce_chunk")
    if not settings.get("fused_ce"):
        if chunk is not None:
            raise PlanError(
                f"kernel.fused_ce_chunk={chunk} sizes the fused loss's chunks, and kernel.fused_ce is off: add "
                f"kernel.fused_ce=true, or drop kernel.fused_ce_chunk"
            )
        return 0
    if not hasattr(model_class(cfg.model.arch), "fused_ce"):
        raise PlanError(
            f"kernel.fused_ce=true replaces the built-in GPT's loss (speedrun.core.model.GPT.fused_ce), and "
            f"model.arch={cfg.model.arch} has no such attribute: drop kernel.fused_ce, or use model.arch=gpt"
        )
    return int(chunk or max(128, FUSED_CE_LOGITS // model.vocab_size // 128 * 128))


def _compile_settings(settings: dict[str, Any], compile_on: bool) -> tuple[str, bool, bool, str]:
    """The compile mode, dynamic shapes, coordinate-descent tuning and compile scope, checked against each other
    and against torch.compile being on."""
    compile_mode = settings.get("compile_mode") or "default"
    dynamic = bool(settings.get("dynamic_shapes"))
    cdt = bool(settings.get("coordinate_descent_tuning"))
    if (compile_mode != "default" or dynamic or cdt) and not compile_on:
        what = (
            f"kernel.compile_mode={compile_mode}"
            if compile_mode != "default"
            else "kernel.dynamic_shapes=true"
            if dynamic
            else "kernel.coordinate_descent_tuning=true"
        )
        raise PlanError(
            f"{what} needs torch.compile, which is off here: set hardware.compile=true, or use "
            f"kernel.compile_mode=default kernel.dynamic_shapes=false "
            f"kernel.coordinate_descent_tuning=false"
        )
    scope = settings.get("compile_scope") or "model"
    if scope == "blocks" and not compile_on:
        raise PlanError(
            "kernel.compile_scope=blocks compiles each block with torch.compile, which is off here: set "
            "hardware.compile=true, or drop kernel.compile_scope"
        )
    if scope == "blocks" and compile_mode in GRAPHING_MODES:
        raise PlanError(
            f"kernel.compile_scope=blocks with kernel.compile_mode={compile_mode}: inductor would record a CUDA "
            f"graph per block call; use kernel.compile_mode=max-autotune-no-cudagraphs (or default), or "
            f"kernel.compile_scope=model"
        )
    return compile_mode, dynamic, cdt, scope


def _check_graphs(
    on_cuda: bool, compile_mode: str, dynamic: bool, grad_accum: int, warmup_steps: int, profile: HardwareProfile
) -> None:
    if not on_cuda:
        raise PlanError(
            f"kernel.cuda_graphs=true needs a CUDA GPU ({profile.name} has none); use kernel.cuda_graphs=false"
        )
    if compile_mode in GRAPHING_MODES:
        raise PlanError(
            f"kernel.cuda_graphs=true captures the step itself, and kernel.compile_mode={compile_mode} "
            f"makes inductor record its own CUDA graphs inside it: use "
            f"kernel.compile_mode=max-autotune-no-cudagraphs (or default) with kernel.cuda_graphs=true, "
            f"or kernel.cuda_graphs=false"
        )
    if dynamic:
        raise PlanError(
            "kernel.cuda_graphs=true replays fixed shapes and kernel.dynamic_shapes=true compiles for "
            "changing ones: use kernel.dynamic_shapes=false (one static graph per context length) or "
            "kernel.cuda_graphs=false"
        )
    if warmup_steps < 1:
        raise PlanError(
            f"kernel.cuda_graphs=true captures each context length during warm-up, and budget.warmup_steps="
            f"{warmup_steps} skips it: use budget.warmup_steps=1 (raised to the {graph_warmup_steps(grad_accum)} "
            f"step(s) capture needs at {grad_accum} micro-batches per step), or kernel.cuda_graphs=false"
        )


def graph_warmup_steps(grad_accum: int) -> int:
    """Warm-up steps that let CUDA graphs capture: GRAPH_EAGER_CALLS eager micro-batches, then the capture. The
    plan raises budget.warmup_steps to this (warm-up is untimed and undone, so more of it changes no result)."""
    return -(-(GRAPH_EAGER_CALLS + 1) // grad_accum)


def _resolve_fp8(settings: dict[str, Any], precision: str, profile: HardwareProfile) -> tuple[tuple[str, ...], str]:
    requested = settings.get("fp8")
    if requested is None:
        targets: tuple[str, ...] = ("all",) if precision == "fp8" else ()
    else:
        wanted = {t for t in requested if t != "none"}
        targets = ("all",) if "all" in wanted else tuple(t for t in FP8_TARGETS if t in wanted)
    impl = settings.get("fp8_impl") or "speedrun"
    if precision == "fp8" and not targets:
        raise PlanError(
            "precision=fp8 runs the block linears in fp8, and kernel.fp8=[] asks for none: use "
            "precision=bf16 kernel.fp8=[], or drop kernel.fp8"
        )
    if not targets:
        return (), impl
    shown = "[" + ",".join(targets) + "]"
    capability = profile.capability or (0, 0)  # None: no GPU
    if profile.device_type != "cuda" or capability < (8, 9):
        where = "no GPU" if profile.device_type != "cuda" else f"sm{capability[0]}{capability[1]}"
        raise PlanError(
            f"kernel.fp8={shown} needs compute capability >= 8.9 (fp8 tensor cores); {profile.name} is "
            f"{where} - use kernel.fp8=[]"
        )
    if precision not in ("bf16", "fp8"):
        raise PlanError(
            f"kernel.fp8={shown} runs fp8 linears inside bf16 autocast, and precision={precision}: use "
            f"precision=bf16, or kernel.fp8=[]"
        )
    if impl == "torchao" and importlib.util.find_spec("torchao") is None:
        raise PlanError(
            "kernel.fp8_impl=torchao needs the torchao package (pip install torchao, built for this "
            "torch); use kernel.fp8_impl=speedrun"
        )
    return targets, impl


def _resolve_tiles(
    settings: dict[str, Any], profile: HardwareProfile, precision: str, model: ModelShape, options: dict[str, Any]
) -> tuple[str | None, tuple, dict[str, Any]]:
    """Flex's tiles: the profile's (per head_dim where the card needs it) with the kernel group's on top; checked
    against the shared memory one program may use."""
    # attn=flex alone has tiles: a Plan's choice
    from speedrun.kernels.tiles import FlexTiles, choose_tiles, fitting_bwd, fitting_fwd, tiles_smem

    chosen = {field: settings[key] for key, field in _TILE_KEYS.items() if key in settings}
    smem_block = (profile.smem_per_block_kb or profile.smem_per_sm_kb or 0) * 1024
    elem = 4 if precision == "fp32" else 2
    if profile.flex_tiles_by_head_dim:
        try:
            base = choose_tiles(model.head_dim, (profile.smem_per_sm_kb or 0) * 1024, smem_block, elem)
        except ValueError as e:
            raise PlanError(
                f"attn=flex on {profile.name}: {e}; use attn=sdpa or a smaller model.d_model / model.n_head"
            ) from None
    elif not chosen:
        return None, (), options  # today's path: the profile's forward blocks from flex's plan_options
    else:
        block_m, block_n = profile.flex_blocks
        base = FlexTiles(block_m=block_m, block_n=block_n)
    import dataclasses

    tiles = dataclasses.replace(base, **chosen)
    big = [
        f"{k}={v}"
        for k, v in dataclasses.asdict(tiles).items()
        if k.startswith("block") and v is not None and FLEX_BLOCK_SIZE % v
    ]
    if big:
        raise PlanError(
            f"flex tiles {', '.join(big)} must divide the block mask's {FLEX_BLOCK_SIZE}: use tiles of "
            f"16, 32, 64 or 128"
        )
    smem = tiles_smem(tiles, model.head_dim, elem, pipelined=(profile.capability or (0, 0)) >= (8, 0))
    for part, need in smem.items():
        if smem_block and need > smem_block:
            fits = (
                fitting_fwd(model.head_dim, smem_block, elem)
                if part == "fwd"
                else fitting_bwd(model.head_dim, smem_block, elem)
            )
            shown = ", ".join("x".join(map(str, f)) if part == "fwd" else "/".join(map(str, f)) for f in fits[:4])
            names = "block_m x block_n" if part == "fwd" else "block_m1/block_n1/block_m2/block_n2"
            raise PlanError(
                f"kernel.flex_{part} tiles ({tiles.label()}) need ~{need // 1024} KB of shared memory per program "
                f"for head_dim {model.head_dim} (tiles padded to {1 << (model.head_dim - 1).bit_length()}); "
                f"{profile.name} has {smem_block // 1024} KB: use {names} = {shown or 'none fits: use attn=sdpa'}"
            )
    return tiles.label(), tuple(sorted(smem.items())), {**options, "kernel_options": tiles.kernel_options()}
