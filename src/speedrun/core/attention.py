"""Attention backends behind one interface, picked by name (``BACKENDS``, the ``attn`` choice) when the model is built.

    attn = get_backend("sdpa", kernel="flash")     # or "math", "flex" (window=..., kernel_options=...), "fa3"
    model = GPT(shape, attn, bos_id=...)

A backend is chosen by name once, when the model is built (``get_backend``), and the model
calls it the same way whatever it is:

    ctx = backend.prepare(idx, bos_id)      # once per model forward (masks, block masks, ...)
    y = backend(q, k, v, ctx)               # once per layer

Shapes: q is (B, Hq, T, D); k and v are (B, Hkv, T, D) with Hq % Hkv == 0 (grouped-query attention); the
result is (B, Hq, T, D) in q's dtype. Attention is always causal. ``bos_id`` not None asks for a document
mask (documents start at a BOS token; a query sees only keys of its own document); a backend that cannot
mask documents says so in its ``capabilities`` and refuses such a request in ``prepare`` rather than ignoring it.

Each backend describes itself to the resolver (speedrun.plan), which never names a backend: ``capabilities``
(devices, compute capability, precisions, GQA, document masks, windows, head_dim limits) for the checks every
backend shares, ``plan_options`` for its own choices (which SDPA kernel, which Triton tiles, which FA3 build)
and ``scores_bytes`` for backends that materialise the T x T scores. Adding a backend is one module and one
conf/attn YAML (README "Extending").

Backends hold no parameters and no per-step state, so a compiled model can inline them: nothing in
``__call__`` or ``prepare`` branches on tensor values or calls ``.item()``.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from speedrun.core import choice
from speedrun.errors import ConfigError


class AttentionBackend(ABC):
    """Causal (optionally document-masked, windowed) attention behind one signature."""

    name: str = ""
    """Registry name, e.g. "sdpa"."""
    kernel: str = ""
    """What actually runs, e.g. "sdpa:flash", "math", "flex"; recorded as result.json's attn_kernel."""
    supports_doc_mask: ClassVar[bool] = False
    """Whether prepare() honours bos_id (document masking); the Plan asks only such a backend for it."""
    window: int | None = None
    """Sliding-window length in tokens (a query sees at most this many keys, itself included); None: full."""
    plain_softmax: ClassVar[bool] = False
    """True when what ``__call__`` computes is softmax(q k^T / sqrt(D)) v over exactly the keys ``allowed_keys``
    lets a query see (causal, the window, the document when prepare() was given bos_id), and nothing else: no
    sinks, ALiBi, softcap or other scale. A forward at some columns only (speedrun.core.model.GPT.forward's pick)
    rebuilds that attention with an explicit mask, so the built-in GPT offers pick only over such a backend. The
    built-in backends set it; one registered from elsewhere is left out until it says so."""

    def prepare(self, idx: torch.Tensor, bos_id: int | None) -> Any:
        """Build the per-forward context from the token ids (B, T). Default: nothing needed."""
        return None

    @abstractmethod
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Causal attention of q (B, Hq, T, D) over k, v (B, Hkv, T, D); returns (B, Hq, T, D)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kernel={self.kernel!r}, window={self.window})"


def allowed_keys(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: int | None,
    q_docs: torch.Tensor | None = None,
    k_docs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Whether a query at q_pos may attend a key at k_pos (broadcast against each other): causal (k <= q), within
    ``window`` tokens (q - k < window; the query itself included), and in the same document when the documents'
    ids are given. The one rule every mask here is built from (math's, flex's mask_mod, GPT.forward's pick)."""
    allowed = k_pos <= q_pos
    if window is not None:
        allowed = allowed & (q_pos - k_pos < window)
    if q_docs is not None and k_docs is not None:
        allowed = allowed & (q_docs == k_docs)
    return allowed


def document_ids(idx: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Document index of every token: a new document starts at each BOS. (B, T) int32.

    Tokens before the first BOS of a row form document 0, so no query ever has an empty key set.
    """
    return torch.cumsum((idx == bos_id).to(torch.int32), dim=1, dtype=torch.int32)


# ---- math -------------------------------------------------------------------------------------------------------
# The explicit reference: softmax(Q K^T / sqrt(d) + mask) V, accumulated in fp32.
#
# Ground truth for the tests of every other backend. It materialises B x Hq x T x T fp32 scores, so it is for
# small models and tests only (plan.py estimates that memory and refuses before an OOM). prepare() builds the
# boolean mask once per forward: causal, plus the document mask when bos_id is given, plus the sliding window
# when one is set, which makes it the reference for flex's masking as well.


class MathAttention(AttentionBackend):
    name = "math"
    kernel = "math"
    supports_doc_mask = True
    plain_softmax = True

    def __init__(self, window: int | None = None):
        self.window = window

    def prepare(self, idx: torch.Tensor, bos_id: int | None) -> torch.Tensor:
        """Boolean mask (B or 1, 1, T, T); True where a query may attend a key."""
        pos = torch.arange(idx.size(1), device=idx.device)
        if bos_id is None:
            return allowed_keys(pos[:, None], pos[None, :], self.window)[None, None]
        doc = document_ids(idx, bos_id)
        return allowed_keys(pos[:, None], pos[None, :], self.window, doc[:, None, :, None], doc[:, None, None, :])

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: torch.Tensor | None) -> torch.Tensor:
        group = q.size(1) // k.size(1)
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if ctx is None:  # called without prepare(): plain causal
            T = q.size(2)
            pos = torch.arange(T, device=q.device)
            ctx = (pos[:, None] >= pos[None, :])[None, None]
        scale = q.size(-1) ** -0.5
        scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
        scores = scores.masked_fill(~ctx, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, v.float()).to(q.dtype)


# ---- sdpa -------------------------------------------------------------------------------------------------------
# F.scaled_dot_product_attention with one kernel pinned.
#
# SDPA is a dispatcher that silently falls through to another kernel when the requested one cannot run (wrong
# GPU, dtype, head dim, GQA). Here the kernel is pinned with ``torch.nn.attention.sdpa_kernel([one backend])``
# around every call, so an impossible request raises ("No viable backend ...") instead of running something
# else. The context manager is supported under torch.compile (dynamo records it), and the pin holds there too.
#
# GQA: flash, cudnn and math take ``enable_gqa=True`` (cuDNN reads the grouped K/V heads itself since torch 2.8,
# which saves the expanded copies and the reduction of their gradients). efficient gets K/V expanded with
# repeat_interleave (it has no GQA path and would otherwise fall to math; expanding lets it run on sm75 T4s).
# Document masks and sliding windows are not offered (is_causal only): use flex for those.


class SDPAAttention(AttentionBackend):
    name = "sdpa"
    plain_softmax = True

    def __init__(self, kernel: str = "flash"):
        """kernel: flash, cudnn, efficient or math (the Plan's attn_options)."""
        self.kernel = f"sdpa:{kernel}"
        self._backend = {
            "flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH,
        }[kernel]
        # flash, cudnn and math accept grouped K/V directly; efficient gets it expanded.
        self._native_gqa = kernel in ("flash", "cudnn", "math")

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: object = None) -> torch.Tensor:
        group = q.size(1) // k.size(1)
        gqa = False
        if group > 1:
            if self._native_gqa:
                gqa = True
            else:
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
        with sdpa_kernel([self._backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


# ---- flex -------------------------------------------------------------------------------------------------------
# FlexAttention: causal + optional document mask + optional sliding window, one compiled kernel.
#
# prepare() builds the BlockMask once per model forward with create_block_mask; every layer reuses it. The
# mask_mod says a query q may attend key k when k <= q, and (document mask, bos_id given) both lie in the same
# document, where documents start at BOS (doc id = cumsum(idx == bos_id)), and (window set) q - k < window.
#
# flex_attention itself is wrapped in torch.compile once per process (a lazy module-level cache), since the
# uncompiled function is a slow reference. Inside a torch.compile'd model the wrapper is inlined into the
# model's graph.
#
# Hardware: training needs CUDA. On CPU the forward works (inductor's C++ template; the first call compiles
# for ~20 s), the backward does not (flex's backward is a Triton kernel). Triton tiling comes from
# ``kernel_options``, passed through unchanged: unprefixed BLOCK_M / BLOCK_N reach only the forward kernel (the
# backward's tiles are BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2); fwd_* and bwd_* keys reach one kernel each
# (torch/_inductor/kernel/flex/flex_attention.py strips the prefix for its own kernel and drops the other's). The
# kernel group chooses them (speedrun.kernels.tiles: per head_dim from the shared-memory budget on sm75).
# ``block_size`` is the mask's sparsity block (default 128); every tile must divide it.


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
    supports_doc_mask = True
    plain_softmax = True

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
        self.window = window
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
        group = q.size(1) // k.size(1)
        if ctx is None:
            raise ValueError("flex attention needs the BlockMask from prepare(); got ctx=None")
        if self.compile:
            fn = compiled_flex_attention()
        else:
            from torch.nn.attention.flex_attention import flex_attention as fn
        return fn(q, k, v, block_mask=ctx, enable_gqa=group > 1, kernel_options=self.kernel_options)


# ---- fa3 --------------------------------------------------------------------------------------------------------
# FlashAttention-3 through Hugging Face `kernels`, pinned to a version and loadable offline.
#
# Which build: sm90 (Hopper) gets varunneal/flash-attention-3, sm80-89 kernels-community/flash-attn3 (the
# resolver picks; FA3 has no sm75 or sm100 build). bf16 only. Since kernels 0.15, ``get_kernel`` wants an
# explicit ``version=`` or ``revision=``, so the pin is part of the config and of attn_kernel
# ("fa3:<repo>@<pin>").
#
# Trust: since kernels 0.14, ``get_kernel`` refuses repos whose publisher is not on the Hub's trusted list unless
# called with ``trust_remote_code=True`` (kernels-community is trusted; varunneal, a personal account, is not), and
# the check needs the Hub's repo info. speedrun passes it for the builds it names in REPOS (their code is what this
# backend was written against); a repo of the user's choosing needs attn.fa3_trust_remote_code=true.
#
# Offline (our GPU machine has no network): `kernels` reads the Hugging Face cache when HF_HUB_OFFLINE=1, and
# LOCAL_KERNELS maps repo ids to local build directories. Loading happens once, when the backend is built (before
# any training), and every way it can fail becomes one KernelUnavailable error that says how to pre-fetch.


REPOS = {"sm90": "varunneal/flash-attention-3", "sm80": "kernels-community/flash-attn3"}
"""The FA3 build per compute capability (Hugging Face `kernels` repos)."""

PREFETCH_HELP = (
    "pre-fetch it on a machine with network: `pip install 'speedrun[kernels]' && python -c \"from kernels import "
    "get_kernel; get_kernel('{repo}', {pin})\"`, copy ~/.cache/huggingface/hub to this machine and set "
    "HF_HUB_OFFLINE=1 (or point LOCAL_KERNELS='{repo}=/path/to/build' at a local build); otherwise use "
    "attn=sdpa or attn=flex"
)


class KernelUnavailable(ConfigError):
    """The FA3 kernel could not be loaded here; the message says how to make it available."""


def _pin_kwargs(version: Any, revision: Any) -> dict[str, Any]:
    if (version is None) == (revision is None):
        raise ValueError("attn=fa3 needs exactly one of attn.fa3_version or attn.fa3_revision (kernels >= 0.15)")
    return {"version": version} if version is not None else {"revision": revision}


def load_fa3(repo: str, version: Any = None, revision: Any = None, trust_remote_code: bool = False) -> Any:
    """The kernel module, or KernelUnavailable naming the cause and the fix."""
    pin = _pin_kwargs(version, revision)
    pin_text = ", ".join(f"{k}={v!r}" for k, v in pin.items())
    fix = PREFETCH_HELP.format(repo=repo, pin=pin_text)
    try:
        from kernels import get_kernel
    except ImportError as e:
        raise KernelUnavailable(f"attn=fa3 needs the `kernels` package ({e}); {fix}") from e
    try:
        module = get_kernel(repo, **pin, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - network, cache miss, ABI mismatch: all mean "not loadable here"
        if "trusted" in str(e) and not trust_remote_code:
            raise KernelUnavailable(
                f"attn=fa3: `kernels` refuses {repo}: its publisher is not on the Hub's trusted "
                f"list ({e}); if you trust its code, set attn.fa3_trust_remote_code=true, "
                f"otherwise use attn=sdpa or attn=flex"
            ) from e
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")
        raise KernelUnavailable(
            f"attn=fa3: could not load {repo} ({pin_text}){' offline' if offline else ''}: "
            f"{type(e).__name__}: {e}; {fix}"
        ) from e
    if not hasattr(module, "flash_attn_func"):
        raise KernelUnavailable(f"attn=fa3: {repo} ({pin_text}) has no flash_attn_func; {fix}")
    return module


class FA3Attention(AttentionBackend):
    name = "fa3"
    plain_softmax = True

    def __init__(
        self, repo: str, version: Any = None, revision: Any = None, module: Any = None, trust_remote_code: bool = False
    ):
        """module: an already-loaded kernel module (tests inject a reference implementation here).
        trust_remote_code: passed to kernels.get_kernel (see the module doc)."""
        self._fa3 = module if module is not None else load_fa3(repo, version, revision, trust_remote_code)
        pin = version if version is not None else revision
        self.kernel = f"fa3:{repo}@{pin}"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        # FA3 takes (B, T, H, D) and handles grouped K/V heads natively.
        out = self._fa3.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        if isinstance(out, tuple):  # some builds return (out, softmax_lse)
            out = out[0]
        return out.transpose(1, 2)


BACKENDS: dict[str, type[AttentionBackend]] = choice(
    "attn", {"sdpa": SDPAAttention, "math": MathAttention, "flex": FlexAttention, "fa3": FA3Attention}
)
"""attn=<name> -> its backend class (speedrun.plan.attention checks the name and what each can run)."""


def get_backend(name: str, **options: Any) -> AttentionBackend:
    """The backend ``name`` built with its options (the Plan's attn_options, e.g. kernel="flash" for sdpa)."""
    return BACKENDS[name](**options)
