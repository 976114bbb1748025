"""Muon for the block matrices, Adam for everything else (parameter-golf's split).

Muon: SGD momentum with Nesterov, whose update is orthogonalised by a quintic Newton-Schulz iteration
(Keller Jordan's Muon, as used by modded-nanogpt and parameter-golf) and scaled by sqrt(max(1, rows/cols)).
The whole per-matrix update lives in ``muon_update`` so a distributed version can shard matrices across
ranks and all-gather the results without duplicating the math.

parameter-golf's April 2026 record stack (records/track_10min_16mb/2026-04-29_SmearGateBOSFix_3Seed_1.06141/
train_gpt.py, "the record" below) adds levers, each off by default (off, a step is today's bit for bit):
MuonEq-R row normalisation (``row_normalize``), the Polar Express coefficient schedule (``ns_coefficients``),
decoupled weight decay on every group (Muon's ``weight_decay``, AdamW's on embeddings and the rest), and an
exponential moving average of the weights (``WeightEMA``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

NS_COEFFS = (3.4445, -4.7750, 2.0315)
"""Muon's quintic (a, b, c), the same at every iteration: X <- a X + b (X X^T) X + c (X X^T)^2 X."""

POLAR_EXPRESS_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
"""Polar Express (Amsel, Persson, Musco, Gower 2025, arXiv:2505.16932): a minimax-optimal quintic per iteration,
for 5 iterations; the numbers are the record's ``_PE_COEFFS`` (train_gpt.py, "Polar Express per-iteration minimax
Newton-Schulz coefficients (PR #1344)"), used there with the same Frobenius normalisation as ``newton_schulz``.
Early iterations lift small singular values fast (8.16 x), the later ones settle them near 1."""

NS_SCHEDULES = {"quintic": None, "polar_express": POLAR_EXPRESS_COEFFS}


def ns_schedule(name: str, steps: int) -> tuple[tuple[float, float, float], ...]:
    """The (a, b, c) of each of ``steps`` Newton-Schulz iterations: quintic repeats NS_COEFFS; polar_express is
    the first ``steps`` of POLAR_EXPRESS_COEFFS (at most 5)."""
    if name not in NS_SCHEDULES:
        raise ValueError(f"ns_coefficients={name!r}: use one of {', '.join(NS_SCHEDULES)}")
    schedule = NS_SCHEDULES[name]
    if schedule is None:
        return (NS_COEFFS,) * steps
    if steps > len(schedule):
        raise ValueError(f"ns_coefficients={name} has {len(schedule)} iterations, asked for {steps}")
    return schedule[:steps]


def newton_schulz(
    G: Tensor,
    steps: int = 5,
    dtype: torch.dtype = torch.float32,
    eps: float = 1e-7,
    coefficients: Sequence[tuple[float, float, float]] | None = None,
) -> Tensor:
    """Approximately orthogonalise a matrix, or each matrix of a stack (..., rows, cols): G = U S V^T -> ~U V^T.

    The quintic's coefficients trade exactness for speed: after 5 steps singular values land roughly in
    [0.7, 1.2] rather than at 1 (those below ~2e-3 of the Frobenius norm stay small). Computed in ``dtype``
    (bf16 on GPUs that have it, fp32 on CPU and T4). Returns a tensor of ``dtype`` shaped like G.
    ``coefficients``: one (a, b, c) per iteration (``ns_schedule``), ``steps`` of them; None: NS_COEFFS at
    every iteration.
    """
    if G.ndim < 2:
        raise ValueError(f"newton_schulz expects a matrix or a stack of matrices, got shape {tuple(G.shape)}")
    schedule = (NS_COEFFS,) * steps if coefficients is None else tuple(coefficients)
    if len(schedule) != steps:
        raise ValueError(f"newton_schulz: {len(schedule)} coefficient triples for {steps} steps")
    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)  # spectral norm <= Frobenius norm <= 1
    transposed = G.size(-2) > G.size(-1)
    if transposed:  # iterate on the wide orientation: X X^T is the smaller Gram matrix
        X = X.mT
    for a, b, c in schedule:
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.mT if transposed else X


def row_normalize(x: Tensor, dim: int = -1, eps: float = 1e-7) -> Tensor:
    """MuonEq-R: x divided by the L2 norm (in fp32, floored at eps) of each of its rows along ``dim``, so every
    row has norm 1 (a zero row stays zero). The record's form: ``update / update.float().norm(dim=-1,
    keepdim=True).clamp_min(1e-07)``, on the Nesterov update, before Newton-Schulz."""
    return x / x.float().norm(dim=dim, keepdim=True).clamp_min(eps).to(x.dtype)


def muon_update(
    grads: list[Tensor],
    momentum_buffers: list[Tensor],
    momentum: float,
    nesterov: bool = True,
    steps: int = 5,
    ns_dtype: torch.dtype = torch.float32,
    orthogonalize: Callable[..., Tensor] = newton_schulz,
    row_dims: Sequence[int] | None = None,
) -> Tensor:
    """Muon updates (to be subtracted, times lr) of same-shape matrices, as one stack (n, rows, cols).

    Per matrix: buf = momentum * buf + grad (in place); g = grad + momentum * buf (Nesterov) or buf;
    u = NS(g) * sqrt(max(1, rows / cols)). The matrices go through Newton-Schulz as one batched stack, which
    turns ~50 small launches per iteration into a few. A distributed step gives each rank a share of the
    matrices, calls this, and all-gathers the stacks.

    ``row_dims`` (MuonEq-R, None: off): for each matrix, the dim its weight's rows lie along (-1; -2 for a matrix
    handed in transposed); g is row-normalised along it before Newton-Schulz (``row_normalize``).
    """
    torch._foreach_mul_(momentum_buffers, momentum)
    torch._foreach_add_(momentum_buffers, grads)
    g = torch._foreach_add(grads, momentum_buffers, alpha=momentum) if nesterov else momentum_buffers
    if row_dims is None:
        stack = torch.stack(g)
    elif all(d == row_dims[0] for d in row_dims):
        stack = row_normalize(torch.stack(g), row_dims[0])
    else:
        stack = torch.stack([row_normalize(x, d) for x, d in zip(g, row_dims)])
    update = orthogonalize(stack, steps=steps, dtype=ns_dtype)
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

    weight_decay is decoupled (p *= 1 - lr * wd before the update, lr the scheduled one: the record's
    ``p.data.mul_(1.0 - lr * wd)``). compile_ns: wrap the Newton-Schulz iteration in torch.compile (None: when the
    parameters are on CUDA). row_normalize: MuonEq-R (``row_normalize``, each weight's own rows). ns_coefficients:
    quintic or polar_express (``ns_schedule``). Both are attributes, not param-group entries, so the optimizer's
    state_dict is the same whatever they are (a plan that changes them is refused at resume).
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
        row_normalize: bool = False,
        ns_coefficients: str = "quintic",
    ):
        ns_schedule(str(ns_coefficients), backend_steps)  # an unknown name, or too many steps, raises here
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
        self.row_normalize = row_normalize
        self.ns_coefficients = str(ns_coefficients)
        self.distribute: Callable[[Callable[..., Tensor]], Callable[..., Tensor]] | None = None
        """Set on a multi-rank run (speedrun.core.dist.World.prepare): wraps the Newton-Schulz function so that each
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
            # stack: fewer launches per step, the same math (tests/model/test_optim.py checks against one at a time).
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
                if self.ns_coefficients != "quintic":  # quintic: newton_schulz's own default, untouched
                    schedule = ns_schedule(self.ns_coefficients, group["backend_steps"])
                    orthogonalize = functools.partial(orthogonalize, coefficients=schedule)
                update = muon_update(
                    grads,
                    bufs,
                    group["momentum"],
                    group["nesterov"],
                    group["backend_steps"],
                    self.ns_dtype,
                    self.distribute(orthogonalize) if self.distribute else orthogonalize,
                    # MuonEq-R normalises each weight's own rows: those of a matrix handed in transposed lie along -2
                    row_dims=[-2 if t and mixed else -1 for t in tall] if self.row_normalize else None,
                )
                updates = list(update.to(params[0].dtype).unbind(0))
                if mixed:  # back to each matrix's own orientation, with its own sqrt(rows / cols) scale
                    updates = [
                        u.mT * (p.size(0) / p.size(1)) ** 0.5 if t else u for u, p, t in zip(updates, params, tall)
                    ]
                if found_inf is not None:  # skip on device: zero update, buffers restored, no decay
                    skip = found_inf.to(torch.bool)
                    updates = [u.masked_fill(skip, 0.0) for u in updates]
                    for b, old in zip(bufs, kept):
                        b.copy_(torch.where(skip, old, b))
                if wd > 0:
                    decay = 1.0 - lr * wd if found_inf is None else 1.0 - lr * wd * (1.0 - found_inf.float())
                    torch._foreach_mul_(params, decay)
                torch._foreach_add_(params, updates, alpha=-lr)
        return loss


@dataclass(frozen=True)
class OptimSettings:
    """What the optimizers read of the optim group (config.training.OptimConfig documents and checks each field):
    parameter-golf's baseline by default."""

    matrix_lr: float = 0.04
    scalar_lr: float = 0.04
    embed_lr: float = 0.6
    tied_embed_lr: float = 0.05
    head_lr: float = 0.008
    muon_momentum: float = 0.95
    muon_momentum_warmup_start: float = 0.85
    muon_momentum_warmup_steps: int | None = None
    muon_backend_steps: int = 5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 0.0
    muon_wd: float = 0.0
    muon_row_normalize: bool = False
    ns_coefficients: str = "quintic"
    adam_wd: float = 0.0
    embed_wd: float = 0.0


@dataclass(frozen=True)
class Schedule:
    """The learning-rate schedule's shape (config.training.ScheduleConfig): warm-up and warm-down as fractions of the
    budget, the floor the warm-down holds at, and the steps of the re-warm-up after a context stage switch."""

    warmup_frac: float = 0.0
    warmdown_frac: float = 0.2
    min_lr: float = 0.0
    rewarmup_steps: int = 10


@dataclass(frozen=True)
class EMASettings:
    """ema.decay as the run uses it (ema.horizon resolved into it once the run's steps are known); None or 0: off."""

    decay: float | None = None


def build_optimizers(
    model, s: OptimSettings, ns_dtype: torch.dtype = torch.float32, fused: bool | None = None
) -> list[torch.optim.Optimizer]:
    """Optimizers for a GPT, split by ``model.param_groups()``:

    - token embedding: Adam, lr tied_embed_lr if the embedding is tied, else embed_lr
    - untied lm_head: Adam, head_lr (absent when tied)
    - block matrices: Muon, matrix_lr, momentum muon_momentum, muon_backend_steps NS iterations
    - scalars/vectors (scales, mixes, q gains, skip weights): Adam, scalar_lr

    muon_wd is the Muon matrices' decoupled decay; muon_row_normalize (MuonEq-R) and ns_coefficients are Muon's
    too. embed_wd decays the token embedding, adam_wd the other Adam parameters (an untied head and the scalars),
    both decoupled as AdamW does (p *= 1 - lr * wd, the record's ``torch.optim.AdamW(..., weight_decay=h.embed_wd)``
    and ``h.adam_wd``); a group whose decay is 0 gets plain Adam, as before those levers existed.
    ns_dtype: Newton-Schulz dtype (bf16 where the GPU has it, fp32 on CPU/T4). fused: fused Adam
    (None: when the parameters are on CUDA). Every param group records its "base_lr" for set_lr_multiplier.
    Returns [embed Adam, (head Adam), Muon, scalar Adam], the order parameter-golf steps them in.
    """
    groups = model.param_groups()
    if fused is None:
        fused = next(model.parameters()).is_cuda
    betas = (s.beta1, s.beta2)

    def adam(params: list[Tensor], lr: float, wd: float = 0.0) -> torch.optim.Optimizer:
        group = [{"params": params, "lr": lr, "base_lr": lr}]
        if wd > 0:  # decoupled, scaled by the scheduled lr: param *= 1 - lr * wd, then the Adam step
            return torch.optim.AdamW(group, betas=betas, eps=s.eps, weight_decay=wd, fused=fused)
        return torch.optim.Adam(group, betas=betas, eps=s.eps, weight_decay=0.0, fused=fused)

    token_lr = s.tied_embed_lr if not groups["head"] else s.embed_lr
    optimizers: list[torch.optim.Optimizer] = [adam(groups["embed"], token_lr, s.embed_wd)]
    if groups["head"]:
        optimizers.append(adam(groups["head"], s.head_lr, s.adam_wd))
    muon = Muon(
        [{"params": groups["matrix"], "base_lr": s.matrix_lr}],
        lr=s.matrix_lr,
        momentum=s.muon_momentum,
        backend_steps=s.muon_backend_steps,
        weight_decay=s.muon_wd,
        ns_dtype=ns_dtype,
        row_normalize=s.muon_row_normalize,
        ns_coefficients=s.ns_coefficients,
    )
    optimizers.append(muon)
    optimizers.append(adam(groups["scalar"], s.scalar_lr, s.adam_wd))
    return optimizers


def lr_multiplier(progress: float, schedule: Schedule) -> float:
    """Linear warm-up over the first warmup_frac of the budget, linear warm-down to 0 over the last warmdown_frac,
    held at schedule.min_lr once it gets there (the record's ``max((1 - frac) / warmdown_frac, min_lr)``)."""
    if schedule.warmup_frac > 0 and progress < schedule.warmup_frac:
        return max(progress / schedule.warmup_frac, 1e-3)
    if schedule.warmdown_frac > 0 and progress > 1 - schedule.warmdown_frac:
        return max((1 - progress) / schedule.warmdown_frac, schedule.min_lr)
    return 1.0


def muon_momentum(step: int, s: OptimSettings) -> float:
    """Muon's momentum at ``step``: ramped linearly from muon_momentum_warmup_start over muon_momentum_warmup_steps
    (parameter-golf: 0.85 -> 0.95 over 500 steps), then muon_momentum."""
    # None: a fraction of the run not resolved into steps (speedrun.run.run_steps), which training never sees
    warm = s.muon_momentum_warmup_steps or 0
    if warm <= 0:
        return s.muon_momentum
    frac = min(step / warm, 1.0)
    return s.muon_momentum_warmup_start + frac * (s.muon_momentum - s.muon_momentum_warmup_start)


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


class WeightEMA:
    """An exponential moving average of a model's parameters: after each optimizer step ``update()`` moves each
    fp32 shadow towards its parameter, ema = decay * ema + (1 - decay) * w (the record's ``ema_state[name].mul_(
    ema_decay).add_(t.float(), alpha=1 - ema_decay)``, here one ``torch._foreach_lerp_`` on the device: no host
    sync, nothing read back). The shadows start as copies of the parameters when it is made.

    Parameters only: the model's buffers (RoPE tables) are not learned. On several ranks every rank holds the same
    weights after each step, so each keeps its own identical average. ``copy_to()`` puts the average into the
    model (for evaluation and export); ``state_dict``/``load_state_dict`` carry it through checkpoints.
    """

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0 < decay < 1:
            raise ValueError(f"WeightEMA: decay must be in (0, 1), got {decay}")
        self.decay = float(decay)
        named = list(model.named_parameters())
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        with torch.no_grad():
            self.shadow = [p.detach().to(torch.float32, copy=True) for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        src = [p if p.dtype == torch.float32 else p.float() for p in self.params]
        torch._foreach_lerp_(self.shadow, src, 1.0 - self.decay)

    @torch.no_grad()
    def copy_to(self) -> None:
        """Overwrite the model's parameters with the average (cast to each parameter's dtype), in place."""
        for p, s in zip(self.params, self.shadow):
            p.copy_(s)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": dict(zip(self.names, self.shadow))}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        saved = state["shadow"]
        if list(saved) != self.names:
            raise ValueError(f"EMA state has parameters {list(saved)[:3]}..., the model {self.names[:3]}...")
        for s, name in zip(self.shadow, self.names):
            s.copy_(saved[name])
