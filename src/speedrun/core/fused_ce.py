"""Fused linear + softcapped cross-entropy (kernel.fused_ce): the loss of ``softcap(x @ W.T)`` in row chunks, so the
(N, vocab) fp32 logits and their gradient never exist whole.

Forward keeps per row only the logsumexp (fp32) and the loss; backward recomputes each chunk's logits from x and W
and writes that chunk's rows of grad_x and its share of grad_W. Peak extra memory is a few (chunk, vocab) fp32
tensors instead of several (N, vocab) ones. The math is GPT.head's: logits in the input dtype (bf16 under autocast),
then fp32 for the softcap ``c * tanh(z / c)`` and the loss; the asymmetric softcap (quant.logit_rescale) takes
c = caps[0] where z > 0, else caps[1]. The caps get no gradient: training holds them fixed (requires_grad=False),
and GPT.head runs its eager path whenever they do train.
"""

from __future__ import annotations

import torch

Softcap = float | torch.Tensor
"""0 (no softcap), a cap c, or a (2,) tensor of caps for positive and negative logits."""


def _softcap(z: torch.Tensor, cap: Softcap) -> tuple[torch.Tensor, torch.Tensor | float]:
    """-> (capped fp32 logits, the cap per element, or 0 for none). dy/dz = 1 - (y / c)^2."""
    if isinstance(cap, torch.Tensor):
        c = torch.where(z > 0, cap[0], cap[1])
        return c * torch.tanh(z / c), c
    if cap > 0:
        return cap * torch.tanh(z / cap), cap
    return z, 0.0


class LinearSoftcapCE(torch.autograd.Function):
    """(x (N, C), W (V, C), targets (N,), cap, chunk rows) -> per-row losses (N,) fp32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: Softcap, chunk: int):
        lses, losses = [], []
        for s in range(0, x.shape[0], chunk):
            y, _ = _softcap((x[s : s + chunk] @ weight.T).float(), cap)
            lses.append(torch.logsumexp(y, dim=-1))
            losses.append(lses[-1] - y.gather(1, targets[s : s + chunk, None]).squeeze(1))
        lse, loss = torch.cat(lses), torch.cat(losses)
        ctx.save_for_backward(x, weight, targets, lse, *([cap] if isinstance(cap, torch.Tensor) else []))
        ctx.cap, ctx.chunk = (None if isinstance(cap, torch.Tensor) else cap), chunk
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        x, weight, targets, lse, *caps = ctx.saved_tensors
        cap = caps[0] if caps else ctx.cap
        grad_x = []
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)
        for s in range(0, x.shape[0], ctx.chunk):
            xs, rows = x[s : s + ctx.chunk], slice(s, s + ctx.chunk)
            y, c = _softcap((xs @ weight.T).float(), cap)
            # d loss / d y = softmax(y) - onehot(target), times the row's incoming gradient
            dy = torch.exp(y - lse[rows, None])
            dy.scatter_add_(1, targets[rows, None], torch.full_like(lse[rows, None], -1.0))
            dy *= grad_loss[rows, None]
            dz = (dy * (1 - (y / c) ** 2) if isinstance(c, torch.Tensor) or c > 0 else dy).to(x.dtype)
            grad_x.append(dz @ weight)
            grad_w += (dz.T @ xs).float()
        return torch.cat(grad_x), grad_w.to(weight.dtype), None, None, None


def linear_softcap_ce(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: Softcap, chunk: int, reduction: str = "mean"
) -> torch.Tensor:
    """The cross-entropy of ``softcap(x @ weight.T)`` against targets: x (..., C), targets (...); the mean, or with
    reduction="none" the per-token losses shaped as targets. The matmuls run in autocast's dtype when it is on
    (as F.linear would), else in x's."""
    kind = x.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
    with torch.autocast(kind, enabled=False):
        loss = LinearSoftcapCE.apply(
            x.reshape(-1, x.shape[-1]).to(dtype), weight.to(dtype), targets.reshape(-1), cap, chunk
        )
    return loss.mean() if reduction == "mean" else loss.view(targets.shape)
