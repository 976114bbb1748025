"""F.scaled_dot_product_attention with one kernel pinned.

SDPA is a dispatcher that silently falls through to another kernel when the requested one cannot run (wrong
GPU, dtype, head dim, GQA). Here the kernel is pinned with ``torch.nn.attention.sdpa_kernel([one backend])``
around every call, so an impossible request raises ("No viable backend ...") instead of running something
else. The context manager is supported under torch.compile (dynamo records it), and the pin holds there too.

GQA: flash, cudnn and math take ``enable_gqa=True`` (cuDNN reads the grouped K/V heads itself since torch 2.8,
which saves the expanded copies and the reduction of their gradients). efficient gets K/V expanded with
repeat_interleave (it has no GQA path and would otherwise fall to math; expanding lets it run on sm75 T4s).
Document masks and sliding windows are not offered (is_causal only): use flex for those.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speedrun.errors import PlanError
from speedrun.model.attention.base import AttentionBackend, Capabilities, check_shapes, materialized_scores_bytes

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
    capabilities = Capabilities(devices=("cpu", "cuda"))
    plain_softmax = True

    @classmethod
    def plan_options(cls, request, profile, precision, model):
        """The pinned kernel: attn.kernel, or the profile's pick; auto under fp32 takes efficient (flash and
        cuDNN take 16-bit inputs only)."""
        cuda = profile.device_type == "cuda"
        kernel = profile.sdpa_kernel if request.kernel == "auto" else str(request.kernel)
        if request.kernel == "auto" and precision == "fp32" and cuda and kernel in ("flash", "cudnn"):
            kernel = "efficient"
        if not cuda and kernel in ("cudnn", "efficient"):
            raise PlanError(f"attn.kernel={kernel} needs a CUDA GPU; on CPU use attn.kernel=flash or math")
        if cuda and kernel in ("flash", "cudnn"):
            if profile.capability < (8, 0):
                raise PlanError(
                    f"attn.kernel={kernel} needs compute capability >= 8.0; {profile.name} is "
                    f"sm{profile.capability[0]}{profile.capability[1]} - use attn.kernel=efficient (K/V expanded for "
                    f"GQA) or attn=flex"
                )
            if precision == "fp32":
                raise PlanError(
                    f"attn.kernel={kernel} needs fp16 or bf16 inputs; with precision=fp32 use "
                    f"attn.kernel=efficient or math"
                )
        return {"kernel": kernel}, f"sdpa:{kernel}"

    @classmethod
    def scores_bytes(cls, options, micro_batch, model, precision):
        return materialized_scores_bytes(micro_batch, model, precision) if options["kernel"] == "math" else 0

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
        # flash, cudnn and math accept grouped K/V directly; efficient gets it expanded.
        self._native_gqa = kernel in ("flash", "cudnn", "math")

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
