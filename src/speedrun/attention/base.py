"""The one interface every attention backend implements.

A backend is chosen by name once, when the model is built (``speedrun.attention.get_backend``), and the model
calls it the same way whatever it is:

    ctx = backend.prepare(idx, bos_id)      # once per model forward (masks, block masks, ...)
    y = backend(q, k, v, ctx)               # once per layer

Shapes: q is (B, Hq, T, D); k and v are (B, Hkv, T, D) with Hq % Hkv == 0 (grouped-query attention); the
result is (B, Hq, T, D) in q's dtype. Attention is always causal. ``bos_id`` not None asks for a document
mask (documents start at a BOS token; a query sees only keys of its own document); a backend that cannot
mask documents says so with ``supports_doc_mask = False`` and refuses such a request in ``prepare`` rather
than ignoring it.

Backends hold no parameters and no per-step state, so a compiled model can inline them: nothing in
``__call__`` or ``prepare`` branches on tensor values or calls ``.item()``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class AttentionBackend(ABC):
    """Causal (optionally document-masked, windowed) attention behind one signature."""

    name: str = ""
    """Registry name, e.g. "sdpa"."""
    kernel: str = ""
    """What actually runs, e.g. "sdpa:flash", "math", "flex"; recorded as result.json's attn_kernel."""
    supports_doc_mask: bool = False
    """Whether prepare() honours bos_id (document masking)."""
    window: int | None = None
    """Sliding-window length in tokens (a query sees at most this many keys, itself included); None: full."""

    def prepare(self, idx: torch.Tensor, bos_id: int | None) -> Any:
        """Build the per-forward context from the token ids (B, T). Default: nothing needed."""
        if bos_id is not None and not self.supports_doc_mask:
            raise ValueError(
                f"attention backend {self.kernel!r} cannot mask documents (bos_id={bos_id}); "
                "use attn=flex or attn=math for document masking"
            )
        return None

    @abstractmethod
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Causal attention of q (B, Hq, T, D) over k, v (B, Hkv, T, D); returns (B, Hq, T, D)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kernel={self.kernel!r}, window={self.window})"


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Validate (B, H, T, D) shapes for GQA; returns the group size Hq // Hkv. Shape checks are static."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention expects 4-D (B, H, T, D) tensors, got {tuple(q.shape)}, {tuple(k.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    hq, hkv = q.size(1), k.size(1)
    if hq % hkv != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if q.size(0) != k.size(0) or q.size(2) != k.size(2) or q.size(3) != k.size(3):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on B, T or D")
    return hq // hkv


def document_ids(idx: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Document index of every token: a new document starts at each BOS. (B, T) int32.

    Tokens before the first BOS of a row form document 0, so no query ever has an empty key set.
    """
    return torch.cumsum((idx == bos_id).to(torch.int32), dim=1, dtype=torch.int32)


def check_window(window: int | None) -> int | None:
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    return window
