"""Schema of the kernel group: how fast the same math is done (compile mode, CUDA graphs, Triton tiles, FP8
targets, profiling). Precision says which dtype a run computes in; kernel says how it is computed, and a kernel
setting must not change the loss beyond a stated tolerance (``python -m speedrun.tune`` checks it).

``None`` on a field means "the default's value", or, under ``kernel=tuned``, the value in the tuned table of the
card that runs (conf/kernel/tuned/<card>.yaml); a value set on the command line always wins over the table.
Device-free checks live here; what needs the device (shared memory, FP8 capability, CUDA) is speedrun.plan.kernel_choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speedrun.config.choices import _require

COMPILE_MODES = ("default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead")
"""torch.compile modes. A str field checked here rather than an Enum: OmegaConf matches Enum members by name, and
these names have hyphens."""

GRAPHING_MODES = ("max-autotune", "reduce-overhead")
"""Compile modes that make inductor record CUDA graphs itself (CUDAGraph trees)."""

COMPILE_SCOPES = ("model", "blocks")
"""What torch.compile wraps: the whole model (one graph: the most fusion, the longest compile) or each transformer
block (regional compilation: the blocks share their compiled graphs, traced once; embedding, skips, head and loss
run eagerly)."""

FP8_TARGETS = ("none", "mlp_down", "mlp", "attn_proj", "attn_qkv", "all")
"""Which block linears multiply in FP8: mlp_down = the MLP's output projection, mlp = both MLP linears,
attn_proj = attention's output projection, attn_qkv = the q/k/v projections, all = every block linear (what
precision=fp8 means); none = no FP8. The lm_head never runs in FP8."""


@dataclass
class FlexFwdTiles:
    """Triton tiles of FlexAttention's forward kernel (kernel_options fwd_*). None: flex's own choice."""

    block_m: int | None = None
    """Query rows per program (fwd_BLOCK_M)."""
    block_n: int | None = None
    """Key/value rows per inner-loop step (fwd_BLOCK_N)."""
    num_warps: int | None = None
    """Warps per program (fwd_num_warps)."""
    num_stages: int | None = None
    """Software-pipelining stages (fwd_num_stages; no effect on sm75, which has no async copies)."""


@dataclass
class FlexBwdTiles:
    """Triton tiles of FlexAttention's backward kernel (kernel_options bwd_*). None: flex's own choice. The
    kernel computes dK/dV over a block of block_n1 keys iterating over queries in steps of block_m1, and dQ over
    block_m2 queries iterating over keys in steps of block_n2: block_n1 % block_m1 == 0, block_m2 % block_n2 == 0."""

    block_m1: int | None = None
    """dK/dV: query rows per inner step (bwd_BLOCK_M1)."""
    block_n1: int | None = None
    """dK/dV: key rows per program (bwd_BLOCK_N1)."""
    block_m2: int | None = None
    """dQ: query rows per program (bwd_BLOCK_M2)."""
    block_n2: int | None = None
    """dQ: key rows per inner step (bwd_BLOCK_N2)."""
    num_warps: int | None = None
    """Warps per program (bwd_num_warps)."""
    num_stages: int | None = None
    """Software-pipelining stages (bwd_num_stages)."""


TILE_FIELDS = {
    "fwd": ("block_m", "block_n", "num_warps", "num_stages"),
    "bwd": ("block_m1", "block_n1", "block_m2", "block_n2", "num_warps", "num_stages"),
}


@dataclass
class KernelConfig:
    name: str = "default"
    """default (today's kernels: compile mode default, no CUDA graphs, flex tiles from the profile, FP8 only with
    precision=fp8), tuned (this card's table in conf/kernel/tuned/<card>.yaml, written by python -m
    speedrun.tune), or any name for a custom option YAML."""
    compile_mode: str | None = None
    """torch.compile mode: default, max-autotune, max-autotune-no-cudagraphs, reduce-overhead (the last and
    max-autotune record CUDA graphs inside inductor). Needs compile on. None: default."""
    compile_scope: str | None = None
    """model (one graph for the whole forward) or blocks (each block compiled, all sharing one graph: a fraction of
    the compile time, for sweeps of short jobs; the code between blocks runs eagerly, so steps may be slower).
    Needs compile on and a compile mode without inductor's CUDA graphs. None: model."""
    cuda_graphs: bool | None = None
    """Capture each micro-batch's forward+backward in a CUDA graph, one per context length (static shapes),
    replayed every step; the optimizer step stays outside. Refused, never dropped, where it cannot run. None: off."""
    coordinate_descent_tuning: bool | None = None
    """Let inductor tune its generated Triton kernels' block sizes by coordinate descent (what modded-nanogpt
    turns on); more compile time, faster elementwise/norm/loss kernels. Needs compile on. None: off."""
    dynamic_shapes: bool | None = None
    """Compile with dynamic shapes (one graph for every context length, recompiled less) instead of one static
    graph per length. Cannot go with CUDA graphs. None: off."""
    fused_qkv: bool | None = None
    """One matmul for each block's q, k and v projections in training (their weights concatenated per call)
    instead of three; the same parameters and the same math up to summation order. Not with fp8 on attn_qkv.
    Slower on an H100 (check ``kernel_fused_qkv``). None: off."""
    fused_ce: bool | None = None
    """The training loss as one fused linear + softcapped cross-entropy over row chunks (speedrun.core.fused_ce): no
    whole (tokens, vocab) fp32 logits or their gradient; the same math up to summation order. The built-in GPT
    only. None: off."""
    fused_ce_chunk: int | None = None
    """kernel.fused_ce's rows per chunk: its peak extra memory is a few (rows, vocab) fp32 tensors. None: the rows
    that make 2^25 logits (32,768 at vocab 1024, 4,096 at 8192; a multiple of 128)."""
    fp8: list[str] | None = None
    """FP8 targets (any of mlp_down, mlp, attn_proj, attn_qkv, all; [] or [none]: no FP8), e.g.
    kernel.fp8='[mlp_down]'. sm89+, with precision=bf16 (or fp8). None: all under precision=fp8, else none."""
    fp8_impl: str | None = None
    """speedrun (speedrun.core.fp8: torch._scaled_mm, tensorwise scales) or torchao (torchao.float8's tensorwise
    recipe; needs the torchao package). None: speedrun."""
    micro_batch: int | None = None
    """Sequences per micro-batch, chosen for speed (the tuner searches it): the same tokens per step in fewer or
    more accumulation steps, so the same gradients up to summation order. Wins over the profile's default;
    hardware.micro_batch, when set, wins over a tuned table's value (and must agree with one set here). None:
    hardware.micro_batch, else the profile's default."""
    flex_fwd: FlexFwdTiles = field(default_factory=FlexFwdTiles)
    """attn=flex forward tiles; unset fields come from the hardware profile (per head_dim on a T4)."""
    flex_bwd: FlexBwdTiles = field(default_factory=FlexBwdTiles)
    """attn=flex backward tiles; unset fields come from the hardware profile (per head_dim on a T4)."""
    profile: bool = False
    """Profile a few training steps after warm-up (untimed, undone): a Chrome trace in the run dir and a
    top-kernels table in run.log."""
    profile_steps: int = 3
    """Optimizer steps recorded by kernel.profile."""

    def __post_init__(self) -> None:
        _require(
            self.compile_mode is None or self.compile_mode in COMPILE_MODES,
            f"kernel.compile_mode={self.compile_mode!r} is not one of {', '.join(COMPILE_MODES)}",
        )
        _require(
            self.compile_scope is None or self.compile_scope in COMPILE_SCOPES,
            f"kernel.compile_scope={self.compile_scope!r} is not one of {', '.join(COMPILE_SCOPES)}",
        )
        _require(
            self.fp8_impl in (None, "speedrun", "torchao"),
            f"kernel.fp8_impl={self.fp8_impl!r}: use speedrun or torchao",
        )
        bad = [t for t in (self.fp8 or []) if t not in FP8_TARGETS]
        _require(
            not bad,
            f"kernel.fp8 targets {bad} unknown; choose from {', '.join(FP8_TARGETS)} (e.g. kernel.fp8='[mlp_down]')",
        )
        _require(
            not (self.fp8 and "none" in self.fp8 and len(set(self.fp8)) > 1),
            f"kernel.fp8={list(self.fp8 or [])} mixes none with targets; use [] for none",
        )
        _require(
            self.micro_batch is None or self.micro_batch >= 1,
            f"kernel.micro_batch={self.micro_batch} must be >= 1, or null for hardware.micro_batch",
        )
        _require(
            self.fused_ce_chunk is None or self.fused_ce_chunk >= 1,
            f"kernel.fused_ce_chunk={self.fused_ce_chunk} must be >= 1 (rows per chunk), or null for the default",
        )
        _require(self.profile_steps >= 1, f"kernel.profile_steps={self.profile_steps} must be >= 1")
        for part, names in TILE_FIELDS.items():
            tiles = getattr(self, f"flex_{part}")
            for key in names:
                value = getattr(tiles, key)
                ok = value is None or (value >= 1 and (key.startswith("num_") or value & (value - 1) == 0))
                _require(
                    ok,
                    f"kernel.flex_{part}.{key}={value} must be a power of two >= 16 (tiles) or >= 1 "
                    f"(num_warps, num_stages), or null for the profile's choice",
                )
                if key.startswith("block_") and value is not None:
                    _require(16 <= value <= 256, f"kernel.flex_{part}.{key}={value} must be in 16..256")
        b = self.flex_bwd
        _require(
            b.block_n1 is None or b.block_m1 is None or b.block_n1 % b.block_m1 == 0,
            f"kernel.flex_bwd.block_n1={b.block_n1} must be a multiple of block_m1={b.block_m1}",
        )
        _require(
            b.block_m2 is None or b.block_n2 is None or b.block_m2 % b.block_n2 == 0,
            f"kernel.flex_bwd.block_m2={b.block_m2} must be a multiple of block_n2={b.block_n2}",
        )

    def explicit(self) -> dict:
        """The fields set on this config (not None), flattened with dotted tile keys: what wins over a table."""
        out: dict = {}
        for key in (
            "compile_mode",
            "compile_scope",
            "cuda_graphs",
            "coordinate_descent_tuning",
            "dynamic_shapes",
            "fused_qkv",
            "fused_ce",
            "fused_ce_chunk",
            "fp8",
            "fp8_impl",
            "micro_batch",
        ):
            if getattr(self, key) is not None:
                out[key] = list(getattr(self, key)) if key == "fp8" else getattr(self, key)
        for part, names in TILE_FIELDS.items():
            for key in names:
                value = getattr(getattr(self, f"flex_{part}"), key)
                if value is not None:
                    out[f"flex_{part}.{key}"] = value
        return out
