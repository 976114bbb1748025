"""Fused linear + softcapped cross-entropy (kernel.fused_ce): the loss of ``softcap(x @ W.T)`` in row chunks, so the
(N, vocab) fp32 logits and their gradient never exist whole.

Each chunk's logits are computed in the input dtype (bf16 under autocast, as F.linear), then the softcap
``c * tanh(z / c)`` and the loss in fp32; the asymmetric softcap (quant.logit_rescale) takes c = caps[0] where
z > 0, else caps[1]. The caps get no gradient: training holds them fixed (requires_grad=False), and GPT.head runs
its eager path whenever they do train.

The mean (the training loss) computes its gradients in the forward, chunk by chunk, for a unit upstream gradient
of the summed loss, and backward only scales them: no matmul is repeated, and nothing (N, vocab) is saved for
backward, also under torch.compile, where a backward that recomputed the logits from x and W would be merged with
the forward's matmul by AOT autograd's common-subexpression pass and the logits saved whole. Unscaled, the
gradients stay inside fp16's range (GradScaler). reduction="none" (per-token losses, e.g. global TTT's) keeps
x and W and recomputes each chunk's logits in backward (compiled, AOT autograd moves that into the forward and
saves the chunks' logits in the matmul dtype).
"""

from __future__ import annotations

import torch

Softcap = float | torch.Tensor
"""0 (no softcap), a cap c, or a (2,) tensor of caps for positive and negative logits."""


def _chunk(x: torch.Tensor, weight: torch.Tensor, cap: Softcap, targets: torch.Tensor):
    """-> (capped fp32 logits y, the cap per element or 0 for none, logsumexp, loss) of one chunk of rows."""
    z = (x @ weight.T).float()
    if isinstance(cap, torch.Tensor):
        c: torch.Tensor | float = torch.where(z > 0, cap[0], cap[1])
        y = c * torch.tanh(z / c)
    else:
        c, y = cap, (cap * torch.tanh(z / cap) if cap > 0 else z)
    lse = torch.logsumexp(y, dim=-1)
    return y, c, lse, lse - y.gather(1, targets[:, None]).squeeze(1)


def _grad_logits(y, c, lse, targets, scale, dtype) -> torch.Tensor:
    """d loss / d z of a chunk: (softmax(y) - onehot(target)) * scale, through the softcap (dy/dz = 1 - (y/c)^2)."""
    dy = torch.exp(y - lse[:, None])
    dy.scatter_add_(1, targets[:, None], torch.full_like(lse[:, None], -1.0))
    dy *= scale
    return (dy * (1 - (y / c) ** 2) if isinstance(c, torch.Tensor) or c > 0 else dy).to(dtype)


def _chunks(x, weight, targets, cap: Softcap, chunk: int, scale: float | torch.Tensor | None):
    """The loop over chunks of rows: the per-row losses (N,) and, unless ``scale`` is None, the gradients of
    sum(scale * losses) for x and weight (``scale``: a number, or one per row), the weight's accumulated in fp32."""
    losses, grad_x = [], []
    grad_w = None if scale is None else torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)
    for s in range(0, x.shape[0], chunk):
        xs, ts = x[s : s + chunk], targets[s : s + chunk]
        y, c, lse, loss = _chunk(xs, weight, cap, ts)
        losses.append(loss)
        if grad_w is not None:
            rows = scale[s : s + chunk, None] if isinstance(scale, torch.Tensor) else scale
            dz = _grad_logits(y, c, lse, ts, rows, x.dtype)
            grad_x.append(dz @ weight)
            grad_w += (dz.T @ xs).float()
    return torch.cat(losses), (torch.cat(grad_x) if grad_x else None), grad_w


class LinearSoftcapCE(torch.autograd.Function):
    """(x (N, C), W (V, C), targets (N,), cap, chunk rows, mean, grads wanted) -> the mean loss (fp32 scalar) when
    ``mean``, else the per-row losses (N,) fp32."""

    @staticmethod
    def forward(ctx, x, weight, targets, cap: Softcap, chunk: int, mean: bool, grads: bool):
        # the mean's gradients now, of the summed loss (scaled in backward); per-token losses' in backward
        loss, grad_x, grad_w = _chunks(x, weight, targets, cap, chunk, 1.0 if mean and grads else None)
        ctx.mean, ctx.chunk, ctx.weight_dtype = mean, chunk, weight.dtype
        ctx.cap = None if isinstance(cap, torch.Tensor) else cap
        if mean and grads:
            ctx.save_for_backward(grad_x, grad_w)
        elif not mean:
            ctx.save_for_backward(x, weight, targets, *([cap] if ctx.cap is None else []))
        return loss.mean() if mean else loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        if ctx.mean:
            grad_x, grad_w = ctx.saved_tensors
            scale = grad_loss / grad_x.shape[0]
        else:
            x, weight, targets, *caps = ctx.saved_tensors
            _, grad_x, grad_w = _chunks(x, weight, targets, caps[0] if caps else ctx.cap, ctx.chunk, grad_loss)
            scale = 1.0
        return grad_x * scale, (grad_w * scale).to(ctx.weight_dtype), None, None, None, None, None


def linear_softcap_ce(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: Softcap, chunk: int, reduction: str = "mean"
) -> torch.Tensor:
    """The cross-entropy of ``softcap(x @ weight.T)`` against targets: x (..., C), targets (...); the mean, or with
    reduction="none" the per-token losses shaped as targets. The matmuls run in autocast's dtype when it is on
    (as F.linear would), else in x's."""
    kind = x.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
    grads = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    with torch.autocast(kind, enabled=False):
        loss = LinearSoftcapCE.apply(
            x.reshape(-1, x.shape[-1]).to(dtype),
            weight.to(dtype),
            targets.reshape(-1),
            cap,
            chunk,
            reduction == "mean",
            grads,
        )
    return loss if reduction == "mean" else loss.view(targets.shape)
