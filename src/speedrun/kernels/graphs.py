"""kernel.cuda_graphs: each micro-batch's forward + backward replayed from a CUDA graph, one graph per input shape
(per context length of a progressive schedule), the optimizer step outside it.

Why this shape: the step's many small kernels (norms, RoPE, casts, the loss) are launched by the CPU one at a time;
a graph launches them all at once. The optimizer stays eager because its learning rate and momentum are Python
floats that change every step (a graph would freeze them).

How (torch.cuda.graphs, "whole network capture"): at a new shape the first GRAPH_EAGER_CALLS micro-batches run
as usual (the compiled code compiles and autotunes; the last one on a side stream, as capture requires), then the
next one is captured into static input buffers and replayed; every later micro-batch of that shape copies its
tokens into the buffers and replays. Gradients accumulate inside the graph into ``.grad`` tensors that exist
before capture and are zeroed in place between steps (``zero_grad(set_to_none=False)``): set to None, the captured
accumulation would write into memory the graph no longer owns. The resolver guarantees that warm-up runs enough
micro-batches to capture every length before the clock starts, and refuses combinations that cannot be captured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from speedrun.kernels import GRAPH_EAGER_CALLS  # the resolver checks warm-up runs this many before capturing

MicroStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""micro_step(x, y) -> the loss it backpropagated (detached), x and y on the device."""


class _Captured:
    def __init__(self, graph: Any, x: torch.Tensor, y: torch.Tensor, loss: torch.Tensor):
        self.graph, self.x, self.y, self.loss = graph, x, y, loss


class GraphedMicroStep:
    """Wraps micro_step (forward, scaled backward) with per-shape capture and replay."""

    def __init__(
        self,
        micro_step: MicroStep,
        device: str = "cuda",
        eager_calls: int = GRAPH_EAGER_CALLS,
        log: Callable[[str], None] | None = None,
    ):
        self.micro_step, self.device, self.eager_calls, self.log = micro_step, device, eager_calls, log
        self.graphs: dict[tuple, _Captured] = {}
        self.seen: dict[tuple, int] = {}

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x, y on the host (pinned) or the device; returns the micro-batch loss (a device tensor, read it before
        the next call of the same shape replays over it: the Stepper adds it to its total at once)."""
        key = (tuple(x.shape), tuple(y.shape), x.dtype)
        captured = self.graphs.get(key)
        if captured is not None:
            captured.x.copy_(x, non_blocking=True)
            captured.y.copy_(y, non_blocking=True)
            captured.graph.replay()
            return captured.loss
        calls = self.seen.get(key, 0)
        self.seen[key] = calls + 1
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        if calls < self.eager_calls - 1:
            return self.micro_step(x, y)
        if calls == self.eager_calls - 1:
            return self.on_side_stream(lambda: self.micro_step(x, y))
        return self._capture(key, x, y)

    def _capture(self, key: tuple, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        static_x, static_y = x.clone(), y.clone()
        graph, loss = self.record(lambda: self.micro_step(static_x, static_y))
        self.graphs[key] = _Captured(graph, static_x, static_y, loss)
        if self.log:
            self.log(f"cuda graph captured for micro-batch {tuple(x.shape)} ({len(self.graphs)} graph(s))")
        return loss

    # -- the two CUDA calls, apart so that tests can stand in for them on a machine without a GPU -----------------
    def on_side_stream(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """fn() on a side stream: lazy initialisations (cuBLAS workspaces, autograd's stream bookkeeping) then
        happen off the default stream, as torch.cuda.graph's docs require of the last call before capture."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = fn()
        torch.cuda.current_stream().wait_stream(side)
        return out

    def record(self, fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """Capture fn() in a CUDA graph and run it once for the current micro-batch (capture records the work
        without doing it) -> (the graph, its static output, rewritten by every replay)."""
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        graph.replay()
        return graph, out

    def reset(self) -> None:
        """Drop the graphs (their memory pools go with them)."""
        self.graphs.clear()
        self.seen.clear()
