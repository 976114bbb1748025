"""The adapters' optimizer in score-first TTT: the one ``ttt.optimizer`` names, stepping every adapter slot, or, for
Adam with beta1 = 0 (the records' setting), stepping only the slots of the step's rows.

Why: the adapters are (slots, ...) fp32 tensors, 1.3 GB at the records' 64 slots and rank 96 on pgolf_record, and a
fused AdamW step over every slot moves about 9 GB of memory, at every step of a batch, even when one long document
of its 64 is still going.

Why the rows' slots are enough: a step's rows are the slots [0, rows) (speedrun.ttt.score_first sorts a batch's
documents longest first, so the documents still going are a prefix, and the rows never grow within a batch); every
other slot's gradient is exactly zero. With beta1 = 0, Adam's update from a zero gradient is zero, which leaves the
decoupled weight decay, p *= 1 - lr * weight_decay (and v *= beta2, never read again: a slot that leaves the rows
does not come back within the batch, and each batch begins the optimizer anew, ``begin``). So each left-out slot's
decay is applied once, when the batch ends (``finish``), as (1 - lr * weight_decay) ** (the steps it missed): the
same A for warm_start_a as a step over every slot, up to float rounding. The rows' steps run the kernel of torch's
AdamW(fused=True) on views of the same tensors. With beta1 > 0 the first moment keeps moving a slot after its
document is done, so every other setting steps every slot.

Where the step runs: a CUDA graph of TTT's chunk step holds the rows' slots update itself (``apply``, on the step's
own rows-sized gradients, never written to .grad); the host only counts it (``stepped``). Otherwise ``step`` reads
.grad after the chunk step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import torch
from torch import nn

from speedrun.ttt.settings import LoRASettings


class AdapterOptimizer(Protocol):
    def begin(self) -> None:
        """A batch starts: the optimizer's state as new (one optimizer serves every batch of a run)."""

    def zero_grad(self) -> None: ...

    def step(self, rows: int) -> None:
        """One step after a chunk step that ran the slots [0, rows)."""

    def stepped(self, rows: int, live: tuple[int, ...]) -> None:
        """The chunk step itself took this step (RowSlotsAdam.apply inside a CUDA graph of the step, on the
        parameters ``live``): only the host's account of it is left."""

    def finish(self) -> None:
        """The batch is over: settle what the steps left pending."""


def adapter_optimizer(params: list[nn.Parameter], s: LoRASettings) -> AdapterOptimizer:
    """The adapters' optimizer, from LoRASettings ``s`` (optimizer, lr, beta1, beta2, eps, momentum, weight_decay):
    one for the run, begun anew at every batch. Its learning rate is s.lr x s.local_lr_mult (ttt.local_lr_mult)."""
    lr = s.lr * s.local_lr_mult
    if s.optimizer == "adam" and s.beta1 == 0 and params:
        return RowSlotsAdam(params, lr=lr, beta2=s.beta2, eps=s.eps, weight_decay=s.weight_decay)
    # On CUDA the fused kernels: the adapters are about a hundred (slots, rank, in) tensors of fp32, gigabytes at
    # the records' 64-128 slots and rank 96, and the fused step reads and writes each of them once (as the records'
    # AdamW(fused=True)); elsewhere the default (foreach) implementation.
    fused = bool(params) and params[0].is_cuda
    if s.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(
            params, lr=lr, momentum=s.momentum or 0.0, weight_decay=s.weight_decay, fused=fused or None
        )
    else:
        opt = torch.optim.AdamW(
            params, lr=lr, betas=(s.beta1, s.beta2), eps=s.eps, weight_decay=s.weight_decay, fused=fused or None
        )
    return EverySlot(opt)


class EverySlot:
    """A torch optimizer over the whole adapter tensors: every slot at every step."""

    def __init__(self, opt: torch.optim.Optimizer):
        self.opt = opt

    def begin(self) -> None:
        self.opt.state.clear()  # moments and step counts are made afresh at the first step, as by a new optimizer

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def step(self, rows: int) -> None:
        self.opt.step()

    def stepped(self, rows: int, live: tuple[int, ...]) -> None:
        raise RuntimeError("EverySlot steps outside the chunk steps: a step that took it itself is a bug")

    def finish(self) -> None:
        pass


class RowSlotsAdam:
    """AdamW with beta1 = 0 over the slots [0, rows) of each step, the other slots' weight decay settled by
    ``finish`` (see the module doc)."""

    def __init__(self, params: list[nn.Parameter], *, lr: float, beta2: float, eps: float, weight_decay: float):
        self.params, self.lr, self.beta2, self.eps, self.weight_decay = params, lr, beta2, eps, weight_decay
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.counts = [torch.zeros((), dtype=torch.float32, device=p.device) for p in params]
        """Per parameter, the steps taken (on its device, as torch's fused Adam keeps them)."""
        self.taken: list[tuple[int, tuple[int, ...]]] = []
        """Per step: its rows and the parameters it stepped (those with a gradient)."""
        self.views: dict[tuple[int, tuple[int, ...]], tuple[list[torch.Tensor], ...]] = {}
        """(rows, parameters) -> the views a step of that shape updates, made once: about a hundred adapters make
        each step's slicing a host cost of its own."""

    @torch.no_grad()
    def begin(self) -> None:
        """In place (a CUDA graph holding apply() reads and writes these very tensors)."""
        torch._foreach_zero_(self.exp_avg + self.exp_avg_sq + self.counts)
        self.taken.clear()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_tensors(self) -> list[torch.Tensor]:
        """What apply() changes: the parameters, both moments and the step counts."""
        return [*self.params, *self.exp_avg, *self.exp_avg_sq, *self.counts]

    @torch.no_grad()
    def step(self, rows: int) -> None:
        self._check(rows)
        self.taken.append((rows, self.apply(rows, [None if p.grad is None else p.grad[:rows] for p in self.params])))

    def stepped(self, rows: int, live: tuple[int, ...]) -> None:
        self._check(rows)
        self.taken.append((rows, live))

    def _check(self, rows: int) -> None:
        if self.taken and rows > self.taken[-1][0]:
            raise RuntimeError(
                f"a TTT step ran {rows} rows after one of {self.taken[-1][0]}: the rows' slots optimizer needs a "
                "batch's rows never to grow (its documents longest first)"
            )

    @torch.no_grad()
    def apply(self, rows: int, grads: Sequence[torch.Tensor | None]) -> tuple[int, ...]:
        """The update of one step at the slots [0, rows) from the gradients of those slots (rows-sized; None: no
        gradient, no step, as torch), as device work only: a CUDA graph of the chunk step can hold it
        (speedrun.ttt.graphs), which then never writes the gradients to .grad. Returns the parameters
        stepped, for stepped()."""
        live = tuple(i for i, g in enumerate(grads) if g is not None)
        key = (rows, live)
        if key not in self.views:
            self.views[key] = tuple(
                [t[i][:rows] for i in live] for t in (self.params, self.exp_avg, self.exp_avg_sq)
            ) + ([self.counts[i] for i in live],)
        params, exp_avg, exp_avg_sq, counts = self.views[key]
        torch._foreach_add_(counts, 1)
        # torch.optim.AdamW(fused=True)'s kernel, on views of the rows' slots (contiguous: the slot is dimension 0)
        torch._fused_adamw_(
            params,
            # in the parameters' layout, as .grad would be (a gradient through a transpose comes out strided)
            [cast(torch.Tensor, grads[i]).contiguous() for i in live],
            exp_avg,
            exp_avg_sq,
            [],
            counts,
            lr=self.lr,
            beta1=0.0,
            beta2=self.beta2,
            weight_decay=self.weight_decay,
            eps=self.eps,
            amsgrad=False,
            maximize=False,
        )
        return live

    def missed(self, i: int) -> torch.Tensor:
        """Per slot of parameter i, the steps that stepped parameter i but left the slot out (host-side int64)."""
        rows = torch.tensor([r for r, live in self.taken if i in live], dtype=torch.int64)
        return (rows[None, :] <= torch.arange(self.params[i].size(0))[:, None]).sum(dim=1)

    @torch.no_grad()
    def finish(self) -> None:
        keep = 1.0 - self.lr * self.weight_decay
        for i, p in enumerate(self.params):
            missed = self.missed(i)
            if keep != 1.0 and bool(missed.any()):
                factor = torch.pow(torch.tensor(keep, dtype=torch.float64), missed.double()).to(p.dtype)
                p.mul_(factor.to(p.device).view(-1, *([1] * (p.dim() - 1))))
        self.taken.clear()


__all__ = ["AdapterOptimizer", "EverySlot", "RowSlotsAdam", "adapter_optimizer"]
