"""Fused linear + softcapped cross-entropy (kernel.fused_ce): the loss of ``softcap(x @ W.T)`` in row chunks, so the
(N, vocab) fp32 logits and their gradient never exist whole.

Each chunk's logits are computed in the input dtype (bf16 under autocast, as F.linear), then the softcap
``c * tanh(z / c)`` and the loss in fp32; the asymmetric softcap (quant.logit_rescale) takes c = caps[0] where
z > 0, else caps[1]. The caps get no gradient: training holds them fixed (requires_grad=False), and GPT.head runs
its eager path whenever they do train.

The chunk loop runs eagerly inside custom operators (torch.ops.speedrun.*), which torch.compile keeps as one opaque
node each: traced, the loop would be unrolled into the graph, and inductor would be free to run several chunks'
matmuls early and keep their buffers alive at once (on an H200, 222 MB above the inputs for 16 chunks of 16 MB bf16
logits). Inside, each chunk's pointwise work is in place, so a chunk peaks at about three fp32 (chunk, vocab)
tensors.

The mean (the training loss) computes its gradients in the forward, chunk by chunk, for a unit upstream gradient
of the summed loss, and backward only scales them: no matmul is repeated and nothing (N, vocab) is saved for
backward. Unscaled, the gradients stay inside fp16's range (GradScaler). reduction="none" (per-token losses, e.g.
global TTT's) keeps x and W, and its backward is a second operator that recomputes the chunks' logits.
"""

from __future__ import annotations

import torch

Softcap = float | torch.Tensor
"""0 (no softcap), a cap c, or a (2,) tensor of caps for positive and negative logits."""


def _chunks(x, weight, targets, caps, cap, chunk, scale):
    """The loop over chunks of rows: the per-row losses (N,) fp32 and, unless ``scale`` is None, the gradients of
    sum(scale * losses) for x (x's dtype) and weight (accumulated in fp32); ``scale``: 1, or one per row. ``caps``:
    the (2,) asymmetric caps, else None and ``cap`` (0: none)."""
    n = x.shape[0]
    losses = x.new_empty(n, dtype=torch.float32)
    grad_x = grad_w = None
    if scale is not None:
        grad_x, grad_w = x.new_empty(x.shape), x.new_zeros(weight.shape, dtype=torch.float32)  # contiguous, as faked
    for s in range(0, n, chunk):
        xs, ts = x[s : s + chunk], targets[s : s + chunk, None]
        y = (xs @ weight.T).float()  # z dies here: from now on one fp32 chunk, softcapped in place
        if caps is not None:
            c = torch.where(y > 0, caps[0], caps[1])
            y.div_(c).tanh_().mul_(c)
            del c
        elif cap > 0:
            y.div_(cap).tanh_().mul_(cap)
        lse = torch.logsumexp(y, dim=-1)
        torch.sub(lse, y.gather(1, ts).squeeze(1), out=losses[s : s + chunk])
        if grad_w is None:
            del y  # before the next chunk's logits exist
            continue
        # d loss / d z = (softmax(y) - onehot(target)) * scale * dy/dz: dy/dz = 1 - (y / c)^2 first, then y turns
        # into the gradient in place
        d = None
        if caps is not None:  # y's sign is z's: the caps picked again are the forward's
            d = torch.where(y > 0, caps[0], caps[1])
            torch.div(y, d, out=d)
        elif cap > 0:
            d = y / cap
        if d is not None:
            d.pow_(2).neg_().add_(1)
        y.sub_(lse[:, None]).exp_().scatter_add_(1, ts, torch.full_like(lse[:, None], -1.0))
        if isinstance(scale, torch.Tensor):
            y.mul_(scale[s : s + chunk, None])
        if d is not None:
            y.mul_(d)
        dz = y.to(x.dtype)
        del y, d
        torch.mm(dz, weight, out=grad_x[s : s + chunk])
        grad_w += (dz.T @ xs).float()
        del dz  # before the next chunk's logits exist
    return losses, grad_x, grad_w


def _mean(*args):
    """speedrun::fused_ce_mean(x, weight, targets, caps, cap, chunk, grads): the mean loss, and the summed loss's
    gradients for x and weight (fp32) when ``grads``, else two empty tensors."""
    losses, grad_x, grad_w = _chunks(*args[:-1], 1.0 if args[-1] else None)
    return losses.mean(), *((grad_x, grad_w) if args[-1] else _mean_fake(*args)[1:])


def _mean_fake(x, weight, *args):
    """What _mean returns, shaped (torch.compile traces with this)."""
    shapes = (x.shape, weight.shape) if args[-1] else (0, 0)
    return x.new_empty((), dtype=torch.float32), x.new_empty(shapes[0]), x.new_empty(shapes[1], dtype=torch.float32)


def _mean_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # no zeros for the (unused) gradients of the gradients it returns
    ctx.save_for_backward(*output[1:])
    ctx.dtype, ctx.grads = inputs[1].dtype, inputs[-1]  # grads=False: none were computed (none were wanted)


def _mean_backward(ctx, grad, *_):
    grad_x, grad_w = ctx.saved_tensors
    scale = grad / grad_x.shape[0]
    grads = (grad_x * scale, (grad_w * scale).to(ctx.dtype)) if ctx.grads else (None, None)
    return *grads, None, None, None, None, None


def _rows(*args):
    """speedrun::fused_ce_rows(x, weight, targets, caps, cap, chunk): the per-row losses (N,) fp32."""
    return _chunks(*args, None)[0]


def _rows_grads(*args):
    """speedrun::fused_ce_rows_grads(x, weight, targets, caps, cap, chunk, grad): the gradients of
    sum(grad * per-row losses) for x and weight, the chunks' logits recomputed."""
    _, grad_x, grad_w = _chunks(*args)
    return grad_x, grad_w.to(args[1].dtype)


def _rows_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])
    ctx.args = inputs[4:]


def _rows_backward(ctx, grad):
    return *CE_ROWS_GRADS(*ctx.saved_tensors, *ctx.args, grad), None, None, None, None


def _op(name: str, schema: str, fn, fake, setup=None, backward=None):
    """torch.ops.speedrun.<name>.default, defined once a process: a second definition (an exported train_gpt.py run in
    the process that imported speedrun) reuses the first. The schema is written out: the counted file's minifier
    drops the annotations custom_op would infer it from."""
    if not hasattr(torch.ops.speedrun, name):
        args = "Tensor x, Tensor weight, Tensor targets, Tensor? caps, float cap, int chunk"
        op = torch.library.custom_op(f"speedrun::{name}", fn, mutates_args=(), schema=schema % args)
        op.register_fake(fake)
        if backward:
            op.register_autograd(backward, setup_context=setup)
    return getattr(torch.ops.speedrun, name).default


CE_MEAN = _op(
    "fused_ce_mean", "(%s, bool grads) -> (Tensor, Tensor, Tensor)", _mean, _mean_fake, _mean_setup, _mean_backward
)
CE_ROWS_GRADS = _op(
    "fused_ce_rows_grads",
    "(%s, Tensor grad) -> (Tensor, Tensor)",
    _rows_grads,
    lambda x, weight, *_: (x.new_empty(x.shape), weight.new_empty(weight.shape)),
)
CE_ROWS = _op(
    "fused_ce_rows",
    "(%s) -> Tensor",
    _rows,
    lambda x, *_: x.new_empty(x.shape[0], dtype=torch.float32),
    _rows_setup,
    _rows_backward,
)


def linear_softcap_ce(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: Softcap, chunk: int, reduction: str = "mean"
) -> torch.Tensor:
    """The cross-entropy of ``softcap(x @ weight.T)`` against targets: x (..., C), targets (...); the mean, or with
    reduction="none" the per-token losses shaped as targets. The matmuls run in autocast's dtype when it is on
    (as F.linear would), else in x's."""
    kind = x.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
    caps, cap = (cap, 0.0) if isinstance(cap, torch.Tensor) else (None, float(cap))
    with torch.autocast(kind, enabled=False):
        args = (x.reshape(-1, x.shape[-1]).to(dtype), weight.to(dtype), targets.reshape(-1), caps, cap, chunk)
        if reduction == "mean":
            grads = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
            return CE_MEAN(*args, grads)[0]
        return CE_ROWS(*args).view(targets.shape)
