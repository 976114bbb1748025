"""GPTQ (quant=int6): Hessians from training batches, per-row scales, the column-by-column rounding, AWQ-lite's
promoted columns and LQER's low-rank corrections: the math on one matrix (speedrun.core.quant applies it to a state
dict).

The Hessian H = X^T X / n of each layer's inputs comes from forward hooks over a few *training* micro-batches
(never validation data). Columns are taken in order of decreasing H diagonal, each is rounded and its error spread
over the columns not yet rounded through the upper Cholesky factor of H^-1, so the layer's output error on those
activations is what is minimised, not the weights' own error.

Scales are per row (fp16) and fixed before GPTQ, by one of two rules (quant.clip):

- absmax_search: for each row, the candidate clip (a fraction of the row's absmax, ``quant.clip_ratios``) with the
  least H-diagonal-weighted rounding error;
- sigma: clip = k x the row's standard deviation, k by tensor class (quant.sigmas). Far beyond the absmax (the
  record's k of 12-15 against a trained row's absmax of a few sigma) the grid is coarse, the codes cluster near
  zero and the entropy coder stores them in about 3 bits instead of the container's 6.

The output head (quant.embed_gptq). Its weight is applied with F.linear (tied: the token embedding; untied:
lm_head), never as a module call, so no forward hook sees its input; a TorchFunctionMode watches F.linear during
the calibration forwards and accumulates X^T X of whatever multiplies that weight: the final norm's output, the
record's Hessian for its tied embedding. An embedding that is only looked up (untied) has inputs that are one-hot
rows: its Hessian is diagonal over the vocabulary and couples no two entries of a row, so GPTQ has nothing to
propagate and it stays round-to-nearest. For a tied embedding the lookup role adds the same kind of per-row
identity term, which we leave out as the record does (GPTQ already damps H by quant.damp x its mean diagonal).

LQER (quant.lqer): a low-rank correction of a quantized matrix, stored in the artifact and added back when it is
dequantized.

The quantization error E = W - dequant(Q) of a matrix is not noise-like after GPTQ and clipping: a few directions
carry much of it. Its best rank-r approximation (Eckart-Young: the top r singular triplets, E_r = U_r S_r V_r^T)
costs r x (rows + cols) values, a fraction of a percent of the matrix, and removes the most error any rank-r term
can. The two factors are balanced (A = S^1/2 U^T, r x rows; B = S^1/2 V^T, r x cols), so both have the same
range, and each is stored at quant.lqer.factor_bits: every factor row is cut into ceil(n / asym_group) equal
groups, each with an fp16 minimum and an fp16 step, and codes 0..2^bits - 1 (asymmetric: a group's codes span
exactly its [min, max], whatever its sign balance). The record also corrects its top 3 matrices at rank 4 with
4-bit groups of 64; its first factor it keeps at 2 bits with one scale per matrix, where ours is quantized the
same way as the second.

Packed entry fields, beside a matrix's ``q`` and ``scale``: ``lqer_a``/``lqer_b`` (uint8 codes, r x rows and
r x cols), ``lqer_a_min``/``lqer_a_step`` and ``lqer_b_min``/``lqer_b_step`` (fp16, r x groups).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from speedrun.core.pergroup import EMBED_NAMES
from speedrun.progress import Progress


def gptq_layers(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The linear layers GPTQ quantizes, by state-dict weight name: every nn.Linear inside the blocks, and the
    untied lm_head (whose hook never fires: the head applies its weight with F.linear, see head_weights)."""
    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and (name.startswith("blocks.") or name == "lm_head"):
            layers[f"{name}.weight"] = module
    return layers


def head_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The embedding tables that may multiply the final hidden state, by state-dict name (quant.embed_gptq)."""
    params = dict(model.named_parameters())
    return {name: params[name] for name in EMBED_NAMES if name in params}


class _LinearInputs(TorchFunctionMode):
    """Calls ``add(name, input)`` for every F.linear whose weight is one of ``weights`` (by identity)."""

    def __init__(self, weights: dict[str, torch.Tensor], add: Callable[[str, torch.Tensor], None]):
        super().__init__()
        self.names = {id(w): name for name, w in weights.items()}
        self.add = add

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            name = self.names.get(id(weight))
            if name is not None:
                self.add(name, args[0] if args else kwargs["input"])
        return func(*args, **kwargs)


@torch.no_grad()
def collect_hessians(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    n_batches: int,
    *,
    device: str,
    autocast_dtype: torch.dtype | None = None,
    progress: Progress | None = None,
    head: bool = False,
) -> dict[str, torch.Tensor]:
    """H = X^T X / n (fp32, on ``device``) of the inputs of every GPTQ layer over ``n_batches`` (x, y) batches
    (``progress`` ticked after each); with ``head``, also of the output head's weight (head_weights), keyed by its
    name (``tok_emb.weight`` when tied).

    Pass a fresh *training* stream: GPTQ fits the weights to these activations, so validation data here would
    leak into the score. Forward hooks on the eager model; the model is left unchanged.
    """
    layers = gptq_layers(model)
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def add(name: str, inputs: torch.Tensor) -> None:
        x = inputs.detach().reshape(-1, inputs.size(-1)).float()
        if name not in sums:
            sums[name] = torch.zeros(x.size(1), x.size(1), dtype=torch.float32, device=x.device)
            counts[name] = 0
        sums[name].addmm_(x.T, x)
        counts[name] += x.size(0)

    def hook(name: str) -> Callable[..., None]:
        return lambda module, inputs: add(name, inputs[0])

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in layers.items()]
    watch = _LinearInputs(head_weights(model), add) if head else None
    was_training = model.training
    model.eval()
    try:
        iterator: Iterator = iter(batches)
        for done in range(1, n_batches + 1):
            x, y = next(iterator)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with watch or contextlib.nullcontext(), _autocast(device, autocast_dtype):
                model(x, y)
            if progress is not None:
                progress.tick(done, n_batches)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {name: sums[name] / counts[name] for name in sums}


def _autocast(device: str, dtype: torch.dtype | None) -> Any:
    return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def qmax_of(bits: int) -> int:
    return 2 ** (bits - 1) - 1


@dataclass(frozen=True)
class FineColumns:
    """AWQ-lite's promoted input columns of one matrix: groups of ``size`` columns starting at ``starts``, rounded at
    ``bits`` with a per-row step of their own (fine_step) instead of the matrix's."""

    starts: tuple[int, ...]
    size: int
    bits: int

    def columns(self, cols: int) -> list[int]:
        return [c for start in self.starts for c in range(start, min(cols, start + self.size))]


def awq_groups(
    weights: dict[str, torch.Tensor], hessians: dict[str, torch.Tensor], group_size: int, top_k: int
) -> dict[str, list[int]]:
    """AWQ-lite's choice: the ``top_k`` groups of ``group_size`` consecutive input columns, over all the matrices in
    ``weights`` together, with the largest saliency sum_c rms(x_c) x mean_r |w_rc|, where rms(x_c) = sqrt(H_cc)
    (H = X^T X / n). -> {matrix name: [group starts, ascending]}; a trailing partial group is never a candidate.
    Ties keep the earlier matrix and column (a stable sort)."""
    scored: list[tuple[float, int, str, int]] = []
    for order, (name, w) in enumerate(weights.items()):
        cols = w.shape[1]
        n_groups = cols // group_size
        if n_groups < 1:
            continue
        rms = torch.diagonal(hessians[name]).float().clamp_min(0).sqrt().cpu()
        saliency = rms * w.detach().float().abs().mean(dim=0).cpu()
        sums = saliency[: n_groups * group_size].reshape(n_groups, group_size).sum(dim=1)
        scored += [(float(v), order, name, g * group_size) for g, v in enumerate(sums.tolist())]
    scored.sort(key=lambda t: -t[0])
    chosen: dict[str, list[int]] = {}
    for _, _, name, start in scored[:top_k]:
        chosen.setdefault(name, []).append(start)
    return {name: sorted(starts) for name, starts in chosen.items()}


def fine_step(scale: torch.Tensor, qmax: int, fine_qmax: int, sigma_scale: torch.Tensor | None) -> torch.Tensor:
    """The per-row fp16 step of AWQ-lite's promoted columns: the matrix's own clip over the finer grid of
    ``fine_qmax`` codes. quant.clip=sigma: k x row std / fine_qmax, computed as the records do (``sigma_scale`` is
    sigma_scales at fine_qmax); otherwise the searched clip (scale x qmax) / fine_qmax."""
    if sigma_scale is not None:
        return sigma_scale
    return (scale.float() * qmax / fine_qmax).clamp_min(1e-8).half()


def search_scales(w: torch.Tensor, importance: torch.Tensor, qmax: int, clip_ratios: Sequence[float]) -> torch.Tensor:
    """Per-row fp16 scales: for each row the clip (ratio x row absmax) whose round-to-nearest error, weighted
    per column by ``importance`` (the Hessian diagonal; ones for embeddings), is least. Returns (rows,) fp16."""
    w = w.float()
    absmax = w.abs().amax(dim=1).clamp_min(1e-8)
    best_err = torch.full_like(absmax, float("inf"))
    best = torch.zeros_like(absmax)
    for ratio in clip_ratios:
        scale = (ratio * absmax / qmax).half().float().clamp_min(1e-8)  # as stored: fp16
        q = torch.clamp(torch.round(w / scale[:, None]), -qmax, qmax)
        err = ((w - q * scale[:, None]).square() * importance[None, :]).sum(dim=1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, scale, best)
    return best.half()


def sigma_scales(w: torch.Tensor, sigma: float, qmax: int) -> torch.Tensor:
    """Per-row fp16 scales of quant.clip=sigma: clip = sigma x the row's standard deviation (unbiased, as
    torch.std), scale = clip / qmax. Returns (rows,) fp16."""
    std = w.float().std(dim=1) if w.size(1) > 1 else w.float().abs()[:, 0]
    return (sigma * std / qmax).clamp_min(1e-8).half()


def row_scales(
    w: torch.Tensor, importance: torch.Tensor, qmax: int, clip_ratios: Sequence[float], sigma: float | None
) -> torch.Tensor:
    """The scales of quant.clip: sigma_scales when ``sigma`` is given, else search_scales."""
    return sigma_scales(w, sigma, qmax) if sigma is not None else search_scales(w, importance, qmax, clip_ratios)


def quantize_rtn(
    w: torch.Tensor, bits: int, clip_ratios: Sequence[float] = (1.0,), sigma: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest per row with the clip rule (uniform importance) -> (int8 values, fp16 scales)."""
    qmax = qmax_of(bits)
    w = w.float()
    scale = row_scales(w, torch.ones(w.size(1), device=w.device), qmax, clip_ratios, sigma)
    q = torch.clamp(torch.round(w / scale.float()[:, None]), -qmax, qmax).to(torch.int8)
    return q, scale


def quantize_gptq_fine(
    w: torch.Tensor,
    hessian: torch.Tensor,
    *,
    bits: int,
    damp: float = 0.01,
    block_size: int = 128,
    clip_ratios: Sequence[float] = (1.0,),
    sigma: float | None = None,
    fine: FineColumns | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """GPTQ of one (out, in) weight given H = X^T X / n of its inputs -> (int8 values, fp16 per-row scales, fp16
    per-row step of the ``fine`` columns or None).

    Minimises ||X (W - Q)^T|| column by column: round a column, divide its error by the pivot of the upper
    Cholesky factor U of H^-1 and subtract error x U[row] from the columns to its right (within a block at
    once, then for the rest of the matrix in one matmul per block). Columns go in decreasing H diagonal
    ("act order"), so the most-used inputs are rounded first, while every later column can still compensate.
    ``sigma``: the scales are quant.clip=sigma's, of the row as given; None: the clip search's. ``fine``
    (AWQ-lite): those input columns are rounded at fine.bits with fine.scale, in the same solve, so the columns
    after them compensate their (smaller) error as any other's.
    """
    qmax = qmax_of(bits)
    W = w.detach().float().clone()
    H = hessian.detach().to(device=W.device, dtype=torch.float64).clone()
    rows, cols = W.shape
    sigma_scale = sigma_scales(W, sigma, qmax) if sigma is not None else None  # the row as trained
    fine_sigma = sigma_scales(W, sigma, qmax_of(fine.bits)) if fine is not None and sigma is not None else None
    dead = torch.diagonal(H) == 0  # inputs that never fired: their weights cannot matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    scale = sigma_scale if sigma_scale is not None else search_scales(W, torch.diagonal(H).float(), qmax, clip_ratios)
    s = scale.float()[:, None]
    H.diagonal().add_(damp * torch.diagonal(H).mean())
    perm = torch.argsort(torch.diagonal(H), descending=True)
    W = W[:, perm]
    H = H[perm][:, perm]
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True).float()
    Q = torch.zeros(rows, cols, dtype=torch.int8, device=W.device)
    # per permuted column: its step and code range (a Python list: no device sync inside the loop)
    fine_at, step = [False] * cols, None
    if fine is not None:
        qmax_fine = qmax_of(fine.bits)
        step = fine_step(scale, qmax, qmax_fine, fine_sigma)
        s_fine = step.float()[:, None]
        mask = torch.zeros(cols, dtype=torch.bool)
        mask[fine.columns(cols)] = True
        fine_at = mask[perm.cpu()].tolist()
    for i1 in range(0, cols, block_size):
        i2 = min(cols, i1 + block_size)
        Wb = W[:, i1:i2].clone()
        Ub = U[i1:i2, i1:i2]
        Err = torch.zeros(rows, i2 - i1, device=W.device)
        for j in range(i2 - i1):
            col = Wb[:, j : j + 1]
            if fine_at[i1 + j]:
                q = torch.clamp(torch.round(col / s_fine), -qmax_fine, qmax_fine)
                Q[:, i1 + j] = q[:, 0].to(torch.int8)
                err = (col - q * s_fine) / Ub[j, j]
                Wb[:, j:] -= err * Ub[j : j + 1, j:]
                Err[:, j : j + 1] = err
                continue
            q = torch.clamp(torch.round(col / s), -qmax, qmax)
            Q[:, i1 + j] = q[:, 0].to(torch.int8)
            err = (col - q * s) / Ub[j, j]
            Wb[:, j:] -= err * Ub[j : j + 1, j:]
            Err[:, j : j + 1] = err
        if i2 < cols:
            W[:, i2:] -= Err @ U[i1:i2, i2:]
    return Q[:, torch.argsort(perm)].contiguous(), scale, step


# ---------------------------------------------------------------------------------------------------------
# LQER: low-rank corrections of the quantization error

LQER_FIELDS = ("lqer_a", "lqer_a_min", "lqer_a_step", "lqer_b", "lqer_b_min", "lqer_b_step")


def low_rank(error: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best rank-``rank`` approximation of ``error`` as balanced factors (A, B), A^T B = U_r S_r V_r^T:
    A (r, rows) and B (r, cols), float32. r is capped by the matrix's smaller side."""
    U, S, Vh = torch.linalg.svd(error.float(), full_matrices=False)
    r = min(rank, S.numel())
    root = S[:r].sqrt()
    return (U[:, :r] * root).T.contiguous(), (root[:, None] * Vh[:r]).contiguous()


def _groups(n: int, group: int) -> tuple[int, int]:
    """(number of groups, values per group) of a row of n values: ceil(n / group) groups of equal size."""
    count = max(1, math.ceil(n / group))
    return count, math.ceil(n / count)


def quantize_groups(m: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric per-group quantization of each row of ``m`` (r, n) -> (uint8 codes (r, n), fp16 min (r, g),
    fp16 step (r, g)): value ~ min + code x step, codes in 0..2^bits - 1, min and step as stored (fp16)."""
    rows, n = m.shape
    count, size = _groups(n, group)
    pad = count * size - n
    # the last group is padded with its own last value, which moves neither its minimum nor its maximum
    full = torch.cat([m.float(), m[:, -1:].float().expand(rows, pad)], dim=1).view(rows, count, size)
    levels = 2**bits - 1
    lo = full.amin(dim=2).half()
    step = ((full.amax(dim=2) - lo.float()) / levels).half()
    safe = torch.where(step.float() > 0, step.float(), torch.ones_like(step.float()))  # a constant group: code 0
    codes = torch.clamp(torch.round((full - lo.float()[..., None]) / safe[..., None]), 0, levels)
    return codes.view(rows, count * size)[:, :n].to(torch.uint8).contiguous(), lo, step


def dequantize_groups(codes: torch.Tensor, lo: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The values quantize_groups stored: min + code x step, per group, as float32 (r, n)."""
    n = codes.size(1)
    index = torch.arange(n, device=codes.device) // math.ceil(n / lo.size(1))  # each value's group, as stored
    return lo.float()[:, index] + codes.float() * step.float()[:, index]


def correction(error: torch.Tensor, rank: int, bits: int, group: int) -> dict[str, torch.Tensor]:
    """The packed fields (LQER_FIELDS) of the rank-``rank`` correction of ``error`` = W - dequant(Q)."""
    a, b = low_rank(error, rank)
    qa, a_min, a_step = quantize_groups(a, bits, group)
    qb, b_min, b_step = quantize_groups(b, bits, group)
    return dict(zip(LQER_FIELDS, (qa, a_min, a_step, qb, b_min, b_step)))


def dequantize_correction(entry: dict[str, torch.Tensor]) -> torch.Tensor:
    """A^T B of a packed entry's correction fields: the (rows, cols) term added to dequant(Q)."""
    a = dequantize_groups(entry["lqer_a"], entry["lqer_a_min"], entry["lqer_a_step"])
    b = dequantize_groups(entry["lqer_b"], entry["lqer_b_min"], entry["lqer_b_step"])
    return a.T @ b


@dataclass
class Calibration:
    """GPTQ's Hessians collected after training, and the seconds they took (on the training clock: they read
    training data, so parameter-golf counts them as training)."""

    hessians: dict[str, torch.Tensor]
    seconds: float


def calibrate(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    n_batches: int,
    *,
    device: str,
    autocast_dtype: torch.dtype | None,
    head: bool,
    log: Callable[[str], None] | None,
) -> Calibration:
    """collect_hessians over ``n_batches`` of a fresh training stream, timed up to the device's last kernel."""
    t0 = time.perf_counter()
    progress = Progress("gptq: Hessians", log, unit="batches") if log is not None else None
    hessians = collect_hessians(
        model, batches, n_batches, device=device, autocast_dtype=autocast_dtype, progress=progress, head=head
    )
    if device == "cuda":
        torch.cuda.synchronize()
    return Calibration(hessians, time.perf_counter() - t0)
