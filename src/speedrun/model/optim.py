"""Muon for the block matrices, Adam for everything else (parameter-golf's split).

Muon: SGD momentum with Nesterov, whose update is orthogonalised by a quintic Newton-Schulz iteration
(Keller Jordan's Muon, as used by modded-nanogpt and parameter-golf) and scaled by sqrt(max(1, rows/cols)).
The whole per-matrix update lives in ``muon_update`` so a distributed version can shard matrices across
ranks and all-gather the results without duplicating the math.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(G: Tensor, steps: int = 5, dtype: torch.dtype = torch.float32, eps: float = 1e-7) -> Tensor:
    """Approximately orthogonalise a matrix, or each matrix of a stack (..., rows, cols): G = U S V^T -> ~U V^T.

    The quintic's coefficients trade exactness for speed: after 5 steps singular values land roughly in
    [0.7, 1.2] rather than at 1 (those below ~2e-3 of the Frobenius norm stay small). Computed in ``dtype``
    (bf16 on GPUs that have it, fp32 on CPU and T4). Returns a tensor of ``dtype`` shaped like G.
    """
    if G.ndim < 2:
        raise ValueError(f"newton_schulz expects a matrix or a stack of matrices, got shape {tuple(G.shape)}")
    a, b, c = NS_COEFFS
    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)  # spectral norm <= Frobenius norm <= 1
    transposed = G.size(-2) > G.size(-1)
    if transposed:  # iterate on the wide orientation: X X^T is the smaller Gram matrix
        X = X.mT
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.mT if transposed else X


def muon_update(
    grads: list[Tensor],
    momentum_buffers: list[Tensor],
    momentum: float,
    nesterov: bool = True,
    steps: int = 5,
    ns_dtype: torch.dtype = torch.float32,
    orthogonalize: Callable[..., Tensor] = newton_schulz,
) -> Tensor:
    """Muon updates (to be subtracted, times lr) of same-shape matrices, as one stack (n, rows, cols).

    Per matrix: buf = momentum * buf + grad (in place); g = grad + momentum * buf (Nesterov) or buf;
    u = NS(g) * sqrt(max(1, rows / cols)). The matrices go through Newton-Schulz as one batched stack, which
    turns ~50 small launches per iteration into a few. A distributed step gives each rank a share of the
    matrices, calls this, and all-gathers the stacks.
    """
    torch._foreach_mul_(momentum_buffers, momentum)
    torch._foreach_add_(momentum_buffers, grads)
    g = torch._foreach_add(grads, momentum_buffers, alpha=momentum) if nesterov else momentum_buffers
    update = orthogonalize(torch.stack(g), steps=steps, dtype=ns_dtype)
    rows, cols = grads[0].shape
    return update * max(1.0, rows / cols) ** 0.5


_compiled_ns: Callable[..., Tensor] | None = None


def _compiled_newton_schulz() -> Callable[..., Tensor]:
    global _compiled_ns
    if _compiled_ns is None:
        _compiled_ns = torch.compile(newton_schulz, dynamic=False)
    return _compiled_ns


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters. lr is the step size of an orthogonalised update (no grad-scale dependence).

    weight_decay is decoupled (p *= 1 - lr * wd before the update). compile_ns: wrap the Newton-Schulz
    iteration in torch.compile (None: when the parameters are on CUDA).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 0.04,
        momentum: float = 0.95,
        backend_steps: int = 5,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        ns_dtype: torch.dtype = torch.float32,
        compile_ns: bool | None = None,
    ):
        if lr < 0 or not 0 <= momentum < 1 or backend_steps < 1 or weight_decay < 0:
            raise ValueError(
                f"Muon: need lr >= 0, 0 <= momentum < 1, backend_steps >= 1, weight_decay >= 0; got "
                f"lr={lr}, momentum={momentum}, backend_steps={backend_steps}, weight_decay={weight_decay}"
            )
        defaults = dict(
            lr=lr, momentum=momentum, backend_steps=backend_steps, nesterov=nesterov, weight_decay=weight_decay
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon takes 2-D parameters only, got shape {tuple(p.shape)}")
        self.ns_dtype = ns_dtype
        self.compile_ns = compile_ns
        self.distribute: Callable[[Callable[..., Tensor]], Callable[..., Tensor]] | None = None
        """Set on a multi-rank run (speedrun.distributed.world.World.prepare): wraps the Newton-Schulz function so that each
        rank orthogonalises its share of every stack and the ranks all-gather the rest."""

    # GradScaler (fp16) hands an optimizer that says so its found_inf (and grad_scale, None once unscaled) as
    # attributes instead of reading found_inf on the host before step(): no host sync per step. A step with
    # found_inf set leaves parameters and momentum buffers as they were, as the scaler's skipped step would.
    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf: Tensor | None = getattr(self, "found_inf", None)
        grad_scale: Tensor | None = getattr(self, "grad_scale", None)
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            # One batched Newton-Schulz call per matrix shape up to transposition: a tall matrix is orientated
            # wide (NS iterates on the wide orientation anyway), so the MLP's (4d, d) and (d, 4d) weights share one
            # stack: fewer launches per step, the same math (tests/test_optim.py checks against one at a time).
            buckets: dict[tuple, list[Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    buckets.setdefault((tuple(sorted(p.shape)), p.dtype, p.device), []).append(p)
            for params in buckets.values():
                bufs = []
                for p in params:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p.grad)
                    bufs.append(state["momentum_buffer"])
                if grad_scale is not None:  # the scaler did not unscale these grads: do it here
                    torch._foreach_mul_([p.grad for p in params], grad_scale.reciprocal())
                tall = [p.size(0) > p.size(1) for p in params]
                mixed = any(tall) and not all(tall)
                grads = [p.grad.mT if t and mixed else p.grad for p, t in zip(params, tall)]
                bufs = [b.mT if t and mixed else b for b, t in zip(bufs, tall)]  # views: updated in place
                kept = [b.clone() for b in bufs] if found_inf is not None else None
                use_compiled = self.compile_ns if self.compile_ns is not None else params[0].is_cuda
                orthogonalize = _compiled_newton_schulz() if use_compiled else newton_schulz
                update = muon_update(
                    grads,
                    bufs,
                    group["momentum"],
                    group["nesterov"],
                    group["backend_steps"],
                    self.ns_dtype,
                    self.distribute(orthogonalize) if self.distribute else orthogonalize,
                )
                updates = list(update.to(params[0].dtype).unbind(0))
                if mixed:  # back to each matrix's own orientation, with its own sqrt(rows / cols) scale
                    updates = [
                        u.mT * (p.size(0) / p.size(1)) ** 0.5 if t else u for u, p, t in zip(updates, params, tall)
                    ]
                if found_inf is not None:  # skip on device: zero update, buffers restored, no decay
                    skip = found_inf.to(torch.bool)
                    updates = [u.masked_fill(skip, 0.0) for u in updates]
                    for b, old in zip(bufs, kept):  # type: ignore[arg-type]
                        b.copy_(torch.where(skip, old, b))
                if wd > 0:
                    decay = 1.0 - lr * wd if found_inf is None else 1.0 - lr * wd * (1.0 - found_inf.float())
                    torch._foreach_mul_(params, decay)
                torch._foreach_add_(params, updates, alpha=-lr)
        return loss


def build_optimizers(
    model,
    *,
    matrix_lr: float,
    scalar_lr: float,
    embed_lr: float,
    tied_embed_lr: float,
    head_lr: float,
    muon_momentum: float,
    muon_backend_steps: int,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float = 0.0,
    ns_dtype: torch.dtype = torch.float32,
    fused: bool | None = None,
) -> list[torch.optim.Optimizer]:
    """Optimizers for a GPT, split by ``model.param_groups()``:

    - token embedding: Adam, lr tied_embed_lr if the embedding is tied, else embed_lr
    - untied lm_head: Adam, head_lr (absent when tied)
    - block matrices: Muon, matrix_lr, momentum muon_momentum, muon_backend_steps NS iterations
    - scalars/vectors (scales, mixes, q gains, skip weights): Adam, scalar_lr

    parameter-golf baseline (train_gpt.py) defaults: matrix_lr 0.04, scalar_lr 0.04, tied_embed_lr 0.05,
    embed_lr 0.6, head_lr 0.008, muon_momentum 0.95 (warmed up from 0.85 over 500 steps by the trainer, see
    set_muon_momentum), muon_backend_steps 5, beta1 0.9, beta2 0.95, eps 1e-8, no weight decay, fused Adam.

    weight_decay applies to the Muon matrices only (decoupled); embeddings, head and scalars get none.
    ns_dtype: Newton-Schulz dtype (bf16 where the GPU has it, fp32 on CPU/T4). fused: fused Adam
    (None: when the parameters are on CUDA). Every param group records its "base_lr" for set_lr_multiplier.
    Returns [embed Adam, (head Adam), Muon, scalar Adam], the order parameter-golf steps them in.
    """
    groups = model.param_groups()
    if fused is None:
        fused = next(model.parameters()).is_cuda
    betas = (beta1, beta2)

    def adam(params: list[Tensor], lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(
            [{"params": params, "lr": lr, "base_lr": lr}], betas=betas, eps=eps, weight_decay=0.0, fused=fused
        )

    token_lr = tied_embed_lr if not groups["head"] else embed_lr
    optimizers: list[torch.optim.Optimizer] = [adam(groups["embed"], token_lr)]
    if groups["head"]:
        optimizers.append(adam(groups["head"], head_lr))
    muon = Muon(
        [{"params": groups["matrix"], "base_lr": matrix_lr}],
        lr=matrix_lr,
        momentum=muon_momentum,
        backend_steps=muon_backend_steps,
        weight_decay=weight_decay,
        ns_dtype=ns_dtype,
    )
    optimizers.append(muon)
    optimizers.append(adam(groups["scalar"], scalar_lr))
    return optimizers


def set_lr_multiplier(optimizers: Iterable[torch.optim.Optimizer], mult: float) -> None:
    """lr = base_lr * mult for every param group (the schedule's warm-up / warm-down factor)."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * mult


def set_muon_momentum(optimizers: Iterable[torch.optim.Optimizer], momentum: float) -> None:
    """Set the momentum of every Muon param group (parameter-golf warms it from 0.85 to 0.95)."""
    for opt in optimizers:
        if isinstance(opt, Muon):
            for group in opt.param_groups:
                group["momentum"] = momentum


__all__ = [
    "Muon",
    "newton_schulz",
    "muon_update",
    "build_optimizers",
    "set_lr_multiplier",
    "set_muon_momentum",
    "NS_COEFFS",
]
