"""FlexAttention's Triton tiles: how much shared memory a tiling needs, which tilings fit a card, and the
kernel_options that pass them to the forward AND the backward kernel.

The estimate (bytes of shared memory per program) is a fit to what Triton 3.6 reports (``metadata.shared``) for
kernels with flex's structure compiled for sm75, and was checked against flex's own generated kernels recompiled
for sm75 on an H100 (the measuring script, scripts/flex_smem.py, is in the repository's history at e74be17;
tests/kernels/test_kernel.py keeps its numbers). Every dot operand is staged through shared memory; the head dimension is padded to a power of two
(flex's QK_HEAD_DIM_ROUNDED: head_dim 80 and 96 cost what 128 costs), e is the element size:

    forward   e x 2 x (BLOCK_M + BLOCK_N) x D              the q tile, and a k and a v tile per step
    backward  max over its two branches of
              e x ((4 R + 2 S) x D + R x S)              R = the resident rows (BLOCK_M2 for dQ, BLOCK_N1 for
                                                          dK/dV), S = the streamed rows (BLOCK_N2, BLOCK_M1); R x S
                                                          is the scratch of a layout conversion of the scores

sm75 does not pipeline loads (no cp.async), so num_stages does not change it there; on sm80+ each extra stage
adds a k/v (q/do) buffer, which the estimate adds as (num_stages - 1) x the streamed tiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

_Pick = TypeVar("_Pick")

FWD_CANDIDATES = ((128, 64), (64, 64), (64, 32), (32, 32), (32, 16), (16, 16))
"""(BLOCK_M, BLOCK_N) tried for the forward, largest first."""
BWD_CANDIDATES = ((64, 64), (32, 64), (32, 32), (16, 32), (16, 16))
"""(S, R) tried for the backward, largest first: BLOCK_M1 = BLOCK_N2 = S (streamed), BLOCK_N1 = BLOCK_M2 = R
(resident), the symmetric shape flex's own configs use (R % S == 0 as the kernel asserts)."""


def rounded_head_dim(head_dim: int) -> int:
    """Flex pads the head dimension of its tiles to the next power of two (at least 16)."""
    return max(16, 1 << (head_dim - 1).bit_length())


@dataclass(frozen=True)
class FlexTiles:
    """One tiling of both flex kernels; None fields are left to flex (its per-GPU defaults)."""

    block_m: int | None = None
    block_n: int | None = None
    fwd_num_warps: int | None = None
    fwd_num_stages: int | None = None
    block_m1: int | None = None
    block_n1: int | None = None
    block_m2: int | None = None
    block_n2: int | None = None
    bwd_num_warps: int | None = None
    bwd_num_stages: int | None = None

    @property
    def has_fwd(self) -> bool:
        return self.block_m is not None and self.block_n is not None

    @property
    def has_bwd(self) -> bool:
        return None not in (self.block_m1, self.block_n1, self.block_m2, self.block_n2)

    def kernel_options(self) -> dict[str, int]:
        """flex_attention kernel_options: fwd_* reach only the forward kernel, bwd_* only the backward one
        (torch/_inductor/kernel/flex/flex_attention.py strips the prefix for its own kernel, drops the other's)."""
        keys = {
            "block_m": "fwd_BLOCK_M",
            "block_n": "fwd_BLOCK_N",
            "fwd_num_warps": "fwd_num_warps",
            "fwd_num_stages": "fwd_num_stages",
            "block_m1": "bwd_BLOCK_M1",
            "block_n1": "bwd_BLOCK_N1",
            "block_m2": "bwd_BLOCK_M2",
            "block_n2": "bwd_BLOCK_N2",
            "bwd_num_warps": "bwd_num_warps",
            "bwd_num_stages": "bwd_num_stages",
        }
        return {option: getattr(self, key) for key, option in keys.items() if getattr(self, key) is not None}

    def label(self) -> str:
        """Short text for result.json's kernel_flex_tiles, e.g. "fwd 64x32 w4 s1, bwd 16/32/32/16"."""
        parts = []
        if self.block_m or self.block_n:
            parts.append(
                f"fwd {self.block_m or '-'}x{self.block_n or '-'}" + _ws(self.fwd_num_warps, self.fwd_num_stages)
            )
        if any((self.block_m1, self.block_n1, self.block_m2, self.block_n2)):
            dims = "/".join(str(v or "-") for v in (self.block_m1, self.block_n1, self.block_m2, self.block_n2))
            parts.append(f"bwd {dims}" + _ws(self.bwd_num_warps, self.bwd_num_stages))
        return ", ".join(parts) or "flex default"


def _ws(warps: int | None, stages: int | None) -> str:
    return (f" w{warps}" if warps else "") + (f" s{stages}" if stages else "")


def fwd_smem_bytes(
    block_m: int, block_n: int, head_dim: int, elem_bytes: int = 2, num_stages: int = 1, pipelined: bool = False
) -> int:
    """Shared memory of flex's forward kernel per program (see the module doc)."""
    d = rounded_head_dim(head_dim)
    extra = max(0, num_stages - 1) * 2 * block_n * d if pipelined else 0
    return elem_bytes * (2 * (block_m + block_n) * d + extra)


def bwd_smem_bytes(
    block_m1: int,
    block_n1: int,
    block_m2: int,
    block_n2: int,
    head_dim: int,
    elem_bytes: int = 2,
    num_stages: int = 1,
    pipelined: bool = False,
) -> int:
    """Shared memory of flex's backward kernel per program: the larger of its dQ and dK/dV branches."""
    d = rounded_head_dim(head_dim)

    def branch(resident: int, streamed: int) -> int:
        extra = max(0, num_stages - 1) * 2 * streamed * d if pipelined else 0
        return elem_bytes * ((4 * resident + 2 * streamed) * d + resident * streamed + extra)

    return max(branch(block_m2, block_n2), branch(block_n1, block_m1))


def tiles_smem(tiles: FlexTiles, head_dim: int, elem_bytes: int, pipelined: bool) -> dict[str, int]:
    """{"fwd": bytes, "bwd": bytes} for the parts of ``tiles`` that are set."""
    out: dict[str, int] = {}
    m, n = tiles.block_m, tiles.block_n
    if m is not None and n is not None:  # tiles.has_fwd
        out["fwd"] = fwd_smem_bytes(m, n, head_dim, elem_bytes, tiles.fwd_num_stages or 1, pipelined)
    m1, n1, m2, n2 = tiles.block_m1, tiles.block_n1, tiles.block_m2, tiles.block_n2
    if m1 is not None and n1 is not None and m2 is not None and n2 is not None:  # tiles.has_bwd
        out["bwd"] = bwd_smem_bytes(m1, n1, m2, n2, head_dim, elem_bytes, tiles.bwd_num_stages or 1, pipelined)
    return out


def fitting_fwd(head_dim: int, budget: int, elem_bytes: int = 2) -> list[tuple[int, int]]:
    """Forward (BLOCK_M, BLOCK_N) candidates that fit ``budget`` bytes, largest first."""
    return [(m, n) for m, n in FWD_CANDIDATES if fwd_smem_bytes(m, n, head_dim, elem_bytes) <= budget]


def fitting_bwd(head_dim: int, budget: int, elem_bytes: int = 2) -> list[tuple[int, int, int, int]]:
    """Backward (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2) candidates that fit ``budget`` bytes, largest first."""
    out = []
    for s, r in BWD_CANDIDATES:
        if bwd_smem_bytes(s, r, r, s, head_dim, elem_bytes) <= budget:
            out.append((s, r, r, s))
    return out


def choose_tiles(head_dim: int, smem_per_sm: int, smem_per_block: int, elem_bytes: int = 2) -> FlexTiles:
    """Tiles for a card whose Triton defaults do not fit it (sm75): the largest candidates that leave room for
    two programs per SM (half its shared memory), so one program's loads overlap another's math; if none does,
    the largest that fits one program's limit. num_warps 4 and num_stages 1 (sm75 has no async copies).
    Raises ValueError when nothing fits (head_dim too large for this card)."""

    def first_fitting(fitting: Callable[[int, int, int], list[_Pick]]) -> _Pick:
        found = fitting(head_dim, smem_per_sm // 2, elem_bytes) or fitting(head_dim, smem_per_block, elem_bytes)
        if not found:
            raise ValueError(
                f"no flex tiling of head_dim {head_dim} fits {smem_per_block // 1024} KB of shared memory per program"
            )
        return found[0]

    m, n = first_fitting(fitting_fwd)
    m1, n1, m2, n2 = first_fitting(fitting_bwd)
    return FlexTiles(
        block_m=m,
        block_n=n,
        fwd_num_warps=4,
        fwd_num_stages=1,
        block_m1=m1,
        block_n1=n1,
        block_m2=m2,
        block_n2=n2,
        bwd_num_warps=4,
        bwd_num_stages=1,
    )


def merge(base: FlexTiles, overrides: dict[str, Any]) -> FlexTiles:
    """base with the fields in ``overrides`` (FlexTiles field names) replaced."""
    import dataclasses

    return dataclasses.replace(base, **overrides)


__all__ = [
    "FlexTiles",
    "fwd_smem_bytes",
    "bwd_smem_bytes",
    "tiles_smem",
    "fitting_fwd",
    "fitting_bwd",
    "choose_tiles",
    "rounded_head_dim",
    "merge",
    "FWD_CANDIDATES",
    "BWD_CANDIDATES",
]
