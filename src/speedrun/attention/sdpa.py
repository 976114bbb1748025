"""F.scaled_dot_product_attention with one kernel pinned.

SDPA is a dispatcher that silently falls through to another kernel when the requested one cannot run (wrong
GPU, dtype, head dim, GQA). Here the kernel is pinned with ``torch.nn.attention.sdpa_kernel([one backend])``
around every call, so an impossible request raises ("No viable backend ...") instead of running something
else. The context manager is supported under torch.compile (dynamo records it), and the pin holds there too.

GQA: flash and math take ``enable_gqa=True``. efficient and cudnn get K/V expanded with repeat_interleave
(efficient has no GQA path and would otherwise fall to math; expanding lets it run on sm75 T4s).
Document masks and sliding windows are not offered (is_causal only): use flex for those.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import AttentionBackend, check_shapes

KERNELS = ("flash", "cudnn", "efficient", "math")


def _sdp_backend(kernel: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[kernel]


class SDPAAttention(AttentionBackend):
    name = "sdpa"
    supports_doc_mask = False

    def __init__(self, kernel: str = "flash"):
        if kernel == "auto":
            raise ValueError(
                "sdpa kernel 'auto' must be resolved to one of "
                f"{', '.join(KERNELS)} before building the backend (plan.py does this)"
            )
        if kernel not in KERNELS:
            raise ValueError(f"unknown sdpa kernel {kernel!r}; choose one of: {', '.join(KERNELS)}")
        self.sdpa_kernel_name = kernel
        self.kernel = f"sdpa:{kernel}"
        self._backend = _sdp_backend(kernel)
        # flash and math accept grouped K/V directly; the others get it expanded.
        self._native_gqa = kernel in ("flash", "math")

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: object = None) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel

        group = check_shapes(q, k, v)
        gqa = False
        if group > 1:
            if self._native_gqa:
                gqa = True
            else:
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
        with sdpa_kernel([self._backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
