"""The explicit reference: softmax(Q K^T / sqrt(d) + mask) V, accumulated in fp32.

Ground truth for the tests of every other backend. It materialises B x Hq x T x T fp32 scores, so it is for
small models and tests only (plan.py estimates that memory and refuses before an OOM). prepare() builds the
boolean mask once per forward: causal, plus the document mask when bos_id is given, plus the sliding window
when one is set, which makes it the reference for flex's masking as well.
"""

from __future__ import annotations

import torch

from speedrun.model.attention.base import (
    AttentionBackend,
    Capabilities,
    allowed_keys,
    check_shapes,
    check_window,
    document_ids,
    materialized_scores_bytes,
)


class MathAttention(AttentionBackend):
    name = "math"
    kernel = "math"
    capabilities = Capabilities(devices=("cpu", "cuda"), document_mask=True, window=True)
    plain_softmax = True

    @classmethod
    def plan_options(cls, request, profile, precision, model):
        return {"window": request.window}, "math"

    @classmethod
    def scores_bytes(cls, options, micro_batch, model, precision):
        return materialized_scores_bytes(micro_batch, model, precision)

    def __init__(self, window: int | None = None):
        self.window = check_window(window)

    def prepare(self, idx: torch.Tensor, bos_id: int | None) -> torch.Tensor:
        """Boolean mask (B or 1, 1, T, T); True where a query may attend a key."""
        pos = torch.arange(idx.size(1), device=idx.device)
        if bos_id is None:
            return allowed_keys(pos[:, None], pos[None, :], self.window)[None, None]
        doc = document_ids(idx, bos_id)
        return allowed_keys(pos[:, None], pos[None, :], self.window, doc[:, None, :, None], doc[:, None, None, :])

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: torch.Tensor | None) -> torch.Tensor:
        group = check_shapes(q, k, v)
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
