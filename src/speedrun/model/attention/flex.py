"""FlexAttention: causal + optional document mask + optional sliding window, one compiled kernel.

prepare() builds the BlockMask once per model forward with create_block_mask; every layer reuses it. The
mask_mod says a query q may attend key k when k <= q, and (document mask, bos_id given) both lie in the same
document, where documents start at BOS (doc id = cumsum(idx == bos_id)), and (window set) q - k < window.

flex_attention itself is wrapped in torch.compile once per process (a lazy module-level cache), since the
uncompiled function is a slow reference. Inside a torch.compile'd model the wrapper is inlined into the
model's graph.

Hardware: training needs CUDA. On CPU the forward works (inductor's C++ template; the first call compiles
for ~20 s), the backward does not (flex's backward is a Triton kernel). Triton tiling comes from
``kernel_options``, passed through unchanged: unprefixed BLOCK_M / BLOCK_N reach only the forward kernel (the
backward's tiles are BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2); fwd_* and bwd_* keys reach one kernel each
(torch/_inductor/kernel/flex/flex_attention.py strips the prefix for its own kernel and drops the other's). The
kernel group chooses them (speedrun.kernels.tiles: per head_dim from the shared-memory budget on sm75).
``block_size`` is the mask's sparsity block (default 128); every tile must divide it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from speedrun.model.attention.base import (
    AttentionBackend,
    Capabilities,
    allowed_keys,
    check_shapes,
    check_window,
    document_ids,
)

KERNEL_OPTION_KEYS = (
    "BLOCK_M",
    "BLOCK_N",
    "num_warps",
    "num_stages",
    "fwd_BLOCK_M",
    "fwd_BLOCK_N",
    "fwd_num_warps",
    "fwd_num_stages",
    "bwd_BLOCK_M1",
    "bwd_BLOCK_N1",
    "bwd_BLOCK_M2",
    "bwd_BLOCK_N2",
    "bwd_num_warps",
    "bwd_num_stages",
)
TILE_KEYS = ("BLOCK_N", "fwd_BLOCK_M", "fwd_BLOCK_N", "bwd_BLOCK_M1", "bwd_BLOCK_N1", "bwd_BLOCK_M2", "bwd_BLOCK_N2")
"""Tiles that must divide the BlockMask's block_size (BLOCK_M too, but it was never checked and stays so)."""

_compiled_flex: Callable[..., torch.Tensor] | None = None


def compiled_flex_attention() -> Callable[..., torch.Tensor]:
    """torch.compile(flex_attention), built on first use and shared by every FlexAttention backend."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def block_mask(
    docs: torch.Tensor | None, B: int, T: int, window: int | None, block_size: int, device: torch.device
) -> Any:
    """BlockMask for causal attention, within documents (docs: (B, T) ids, or None) and a window."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        if docs is None:
            return allowed_keys(q_idx, kv_idx, window)
        return allowed_keys(q_idx, kv_idx, window, docs[b, q_idx], docs[b, kv_idx])

    return create_block_mask(
        mask_mod, B if docs is not None else None, None, T, T, device=device, BLOCK_SIZE=block_size
    )


_compiled_block_mask: Callable[..., Any] | None = None


def compiled_block_mask() -> Callable[..., Any]:
    """torch.compile(block_mask): one graph per (docs or not, shape, window), reused across batches."""
    global _compiled_block_mask
    if _compiled_block_mask is None:
        _compiled_block_mask = torch.compile(block_mask, dynamic=False)
    return _compiled_block_mask


class FlexAttention(AttentionBackend):
    name = "flex"
    kernel = "flex"
    # Triton's tl.dot needs K >= 16, so a head_dim below 16 cannot compile ("embedding dimension ... must be at
    # least 16"); training needs CUDA (flex's backward is a Triton kernel; CPU has the forward only).
    capabilities = Capabilities(
        devices=("cuda",), document_mask=True, window=True, min_head_dim=16, why="flex compiles Triton kernels for CUDA"
    )
    plain_softmax = True

    @classmethod
    def plan_options(cls, request, profile, precision, model):
        # The profile's forward blocks; speedrun.plan.kernel_choice replaces them with the kernel group's tiles (forward
        # and backward) where they are chosen per head_dim or set.
        block_m, block_n = profile.flex_blocks
        kernel_options = {"BLOCK_M": block_m, "BLOCK_N": block_n}
        return {"window": request.window, "kernel_options": kernel_options}, "flex"

    def __init__(
        self,
        window: int | None = None,
        kernel_options: dict[str, Any] | None = None,
        block_size: int = 128,
        compile: bool = True,
    ):
        """window: sliding-window length in tokens (None: full causal). kernel_options: Triton tiling for
        flex's kernel (see module doc); None or {} lets flex choose. block_size: BlockMask block.
        compile: False runs flex's eager reference path (slow; for debugging and CPU tests only)."""
        self.window = check_window(window)
        opts = {k: v for k, v in (kernel_options or {}).items() if v is not None}
        for key, val in opts.items():
            if key in KERNEL_OPTION_KEYS and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
                raise ValueError(f"flex kernel option {key} must be a positive int, got {val!r}")
        self.kernel_options = opts or None
        if block_size < 16 or block_size & (block_size - 1):
            raise ValueError(f"flex block_size must be a power of two >= 16, got {block_size}")
        for key in TILE_KEYS:
            if key in opts and block_size % opts[key] != 0:
                raise ValueError(f"flex {key}={opts[key]} must divide block_size={block_size}")
        self.block_size = block_size
        self.compile = compile

    def prepare(self, idx: torch.Tensor, bos_id: int | None) -> Any:
        """The BlockMask for this batch: (B, 1) blocks with a document mask, broadcast (1, 1) without."""
        docs = document_ids(idx, bos_id) if bos_id is not None else None
        # Inside a compiled model the enclosing graph compiles the mask construction; in an eager model on
        # CUDA compile it separately (uncompiled, create_block_mask materialises a B x T x T mask).
        build = block_mask
        if idx.is_cuda and not torch.compiler.is_compiling():
            build = compiled_block_mask()
        return build(docs, idx.size(0), idx.size(1), self.window, self.block_size, idx.device)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Any) -> torch.Tensor:
        group = check_shapes(q, k, v)
        if ctx is None:
            raise ValueError("flex attention needs the BlockMask from prepare(); got ctx=None")
        if self.compile:
            fn = compiled_flex_attention()
        else:
            from torch.nn.attention.flex_attention import flex_attention as fn
        return fn(q, k, v, block_mask=ctx, enable_gqa=group > 1, kernel_options=self.kernel_options)
