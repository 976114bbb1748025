"""One run on several processes: this process's rank and the few collectives a run needs.

A run of N ranks is N copies of the same pipeline, each on its own GPU (``cuda:LOCAL_RANK``), that stay in lock step
through these calls:

- ``sync_grads``: after a step's micro-batches, every gradient is averaged over the ranks (bucketed all-reduce).
- ``split_newton_schulz``: Muon's orthogonalisation of a stack of matrices is split over the ranks (each does
  its share, then an all-gather), instead of every rank repeating all of it.
- ``mean``: the step's loss over all ranks (what is logged, and what "diverged" is decided on).
- ``agree``: rank 0's clock, broadcast, so every time-based decision (stop, LR, context stage, logging) is the
  same on every rank and all ranks stop at the same step.
- ``agree_with_flags``: the same, with flags every rank may raise (a stop signal on one rank) folded into the
  same collective, so all ranks stop at the same step.
- ``sum_``, ``max``, ``min``, ``from_rank0``, ``gather``: eval sums, peak memory, the batch size every rank fits,
  rank 0's artifact and checkpoint path, GPU names and every rank's RNG state.

On one process (``SINGLE``) each call is the identity or a no-op, so the training code has a single path. Which
processes exist, the failure guard and the record of the ranks are the shell's (speedrun.distributed.world).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from speedrun.core.optim import Muon

BUCKET_BYTES = 64 << 20
"""Gradient all-reduce bucket: one collective per 64 MB of fp32 gradients (pgolf_baseline: one bucket)."""


class World:
    """This process's rank and the collectives of the run (identities on one process)."""

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.ctrl: Any = None
        """Process group for CPU-side agreement (gloo): rank 0's clock, objects. The default group on CPU."""
        self.guard: Any = None
        """The shell's failure guard (speedrun.distributed.guard), once it has started one."""

    @property
    def single(self) -> bool:
        return self.world_size == 1

    def join(self, backend: str, timeout_s: float) -> None:
        """Join the run's process group (nccl on GPUs, gloo on CPU), with a gloo group beside NCCL's for the CPU-side
        agreement."""
        timeout = timedelta(seconds=timeout_s)
        device_id = torch.device("cuda", self.local_rank) if backend == "nccl" else None
        dist.init_process_group(backend, timeout=timeout, device_id=device_id)
        # Scalars that steer the loop (rank 0's clock) and pickled objects go over gloo on the CPU: no GPU sync.
        self.ctrl = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None

    # -- collectives (no-ops on one process) ------------------------------------------------------------
    def agree(self, value: float) -> float:
        """Rank 0's value on every rank (a float64 broadcast over gloo, no GPU sync)."""
        if self.single:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.broadcast(t, src=0, group=self.ctrl)
        return float(t.item())

    def max(self, value: float | None) -> float | None:
        """The largest value over the ranks (None counts as missing)."""
        if self.single:
            return value
        t = torch.tensor([float("-inf") if value is None else float(value)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl)
        return None if t.item() == float("-inf") else float(t.item())

    def min(self, value: float) -> float:
        """The smallest value over the ranks (what every rank can do, e.g. the batch that fits on all of them)."""
        if self.single:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.ctrl)
        return float(t.item())

    def agree_with_flags(self, value: float, flags: list[float]) -> tuple[float, list[float]]:
        """(rank 0's ``value``, the largest of each flag over the ranks), in one all-reduce: what the loop does
        after every step, so a stop signal that reached any one rank (a flag) costs no collective of its own
        beside rank 0's clock. Every rank gets the same numbers, so every rank takes the same decision."""
        if self.single:
            return value, list(flags)
        # MAX over [rank 0's value, -inf elsewhere] is rank 0's value: a broadcast folded into the flags' reduce
        mine = value if self.rank == 0 else float("-inf")
        t = torch.tensor([mine, *flags], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl)
        out = t.tolist()
        return out[0], out[1:]

    @contextlib.contextmanager
    def stops_deferred(self) -> Iterator[None]:
        """While training defers stop signals to a step boundary (speedrun.run.preempt), the guard lets the
        first one through to the loop instead of ending the run (a second still ends it at once)."""
        if self.guard is None:
            yield
            return
        self.guard.set_deferring(True)
        try:
            yield
        finally:
            self.guard.set_deferring(False)

    def stops_handled(self) -> None:
        """The loop acted on the deferred stop signals and trains on (SIGTERM under submitit): the next one is the
        loop's again, not the guard's."""
        if self.guard is not None:
            self.guard.set_deferring(True)

    def sum_(self, tensor: Any) -> Any:
        """All-reduce (sum) in place, on the tensor's device; returns it."""
        if not self.single:
            dist.all_reduce(tensor)
        return tensor

    def mean(self, tensor: Any) -> Any:
        """The mean of a tensor over the ranks (a new tensor; no host sync on GPUs)."""
        if self.single:
            return tensor
        return self.sum_(tensor.detach().clone()) / self.world_size

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        if self.single:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.ctrl)
        return out

    def from_rank0(self, make: Callable[[], Any]) -> Any:
        """``make()`` run on rank 0 alone, its result sent to every rank (the others wait)."""
        if self.single:
            return make()
        box = [make() if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.ctrl)
        return box[0]

    def barrier(self) -> None:
        if not self.single:
            dist.barrier(group=self.ctrl)

    # -- training ---------------------------------------------------------------------------------------
    def prepare(self, model: Any, optimizers: list) -> None:
        """Rank 0's initial weights on every rank, and Muon's Newton-Schulz split over the ranks."""
        if self.single:
            return
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor, src=0)
        for opt in optimizers:
            if isinstance(opt, Muon):
                opt.distribute = self.split_newton_schulz

    def sync_grads(self, params: list) -> None:
        """Average every gradient over the ranks: fixed buckets of the parameters in model order (a missing grad
        counts as zeros, so every rank sends the same layout), all-reduced asynchronously, then copied back.

        An explicit all-reduce after the step's micro-batches rather than DDP: a compiled model's backward is one
        graph whose gradients all appear at its end, so DDP could overlap only the last micro-batch's backward
        (and only by splitting the graph per bucket); the one all-reduce per step costs well under 1% of a step
        (checks dist_2gpu and dist_4gpu measure the scaling), and the compiled model and the Stepper stay as they
        are."""
        if self.single:
            return
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        buckets: list[list] = [[]]
        size = 0
        for g in grads:
            if buckets[-1] and (size + g.numel() * g.element_size() > BUCKET_BYTES or g.dtype != buckets[-1][0].dtype):
                buckets.append([])
                size = 0
            buckets[-1].append(g)
            size += g.numel() * g.element_size()
        flats = [torch.cat([g.reshape(-1) for g in bucket]) for bucket in buckets]
        works = [dist.all_reduce(flat, async_op=True) for flat in flats]  # bucket k+1 flattens while k reduces
        for bucket, flat, work in zip(buckets, flats, works):
            work.wait()
            flat.div_(self.world_size)
            pieces = torch.split(flat, [g.numel() for g in bucket])
            torch._foreach_copy_(bucket, [piece.view_as(g) for g, piece in zip(bucket, pieces)])

    def split_newton_schulz(self, orthogonalize: Callable) -> Callable:
        """Wrap a Newton-Schulz function (stack (n, rows, cols) -> stack) so that rank r orthogonalises matrices
        [r * k, (r + 1) * k) of the stack (k = ceil(n / world_size), zero-padded at the end; a zero matrix stays
        zero) and the ranks all-gather the results. Every rank then applies the same update to every matrix;
        the momentum buffers stay whole on every rank (elementwise work), so Muon's state is the same everywhere
        and a checkpoint of rank 0's optimizer is complete."""
        if self.single:
            return orthogonalize
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def split(G: Any, steps: int = 5, dtype: Any = torch.float32) -> Any:
            n = G.size(0)
            k = -(-n // self.world_size)
            mine = G[self.rank * k : (self.rank + 1) * k]
            if mine.size(0) < k:
                mine = torch.cat([mine, mine.new_zeros((k - mine.size(0), *G.shape[1:]))])
            local = orthogonalize(mine, steps=steps, dtype=dtype).contiguous()
            out = local.new_empty((k * self.world_size, *local.shape[1:]))
            gather(out, local)
            return out[:n]

        return split


SINGLE = World()
"""The world of a one-process run (and of tools and tests that call the pipeline's parts directly)."""
