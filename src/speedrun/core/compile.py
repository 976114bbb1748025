"""torch.compile of the model as the kernel group says: mode, static or dynamic shapes, and a separate evaluation
graph where the training mode records CUDA graphs (evaluation batches vary and are read after the next call, which
inductor's CUDA graph trees would overwrite); and CUDA graphs of the training step (GraphedMicroStep).

kernel.cuda_graphs: each micro-batch's forward + backward replayed from a CUDA graph, one graph per input shape
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from speedrun.core.model import GPT


class CompileSettings(Protocol):
    """The kernel settings compiling reads (speedrun.plan.types.KernelPlan's)."""

    @property
    def compile_mode(self) -> str: ...
    @property
    def compile_scope(self) -> str: ...
    @property
    def dynamic_shapes(self) -> bool: ...
    @property
    def coordinate_descent_tuning(self) -> bool: ...
    @property
    def cuda_graphs(self) -> bool: ...


@dataclass(frozen=True)
class CompileOptions:
    """CompileSettings as plain values: an exported run's (a ``python -m run`` passes its Plan's KernelPlan)."""

    compile_mode: str = "default"
    compile_scope: str = "model"
    dynamic_shapes: bool = False
    coordinate_descent_tuning: bool = False
    cuda_graphs: bool = False


class CompilePlan(Protocol):
    """The part of a Plan (speedrun.plan.types.Plan) or of TrainSettings that compiling reads: the core names the
    fields it needs instead of importing the Plan."""

    @property
    def compile(self) -> bool: ...
    @property
    def kernel(self) -> CompileSettings: ...


EVAL_MODE = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
"""Evaluation's compile mode for each training mode that records CUDA graphs (speedrun.config.kernel's
GRAPHING_MODES are its keys)."""

GRAPH_EAGER_CALLS = 2
"""Micro-batches run eagerly at a new shape before its CUDA graph is captured: the compiled code and its autotuning
must have run before capture. The resolver sizes the warm-up from the same number (speedrun.kernels')."""


def compile_model(model: GPT, plan: CompilePlan) -> tuple[Any, Any, bool]:
    """-> (training callable, evaluation callable, whether training needs cudagraph_mark_step_begin per call).
    kernel=default compiles exactly as before: torch.compile(model, dynamic=False), one object for both;
    kernel.compile_scope=blocks returns CompiledRegions over the model."""
    if not plan.compile:
        return model, model, False
    mode = plan.kernel.compile_mode
    dynamic = bool(plan.kernel.dynamic_shapes)
    if plan.kernel.coordinate_descent_tuning:  # process-wide inductor setting, read when the graphs compile
        import torch._inductor.config as inductor_config

        inductor_config.coordinate_descent_tuning = True
    kwargs: dict[str, Any] = {} if mode == "default" else {"mode": mode}
    if plan.kernel.compile_scope == "blocks":
        # Regional compilation: the blocks run the same code on parameters dynamo lifts as inputs, so it traces
        # their graph once and reuses it for every block; the head (norm, logits, softcap, loss) is a second
        # region; the embedding and the U-Net skips stay eager. The resolver refuses graphing modes here.
        blocks = tuple(torch.compile(block, dynamic=dynamic, **kwargs) for block in model.blocks)
        regions = CompiledRegions(model, blocks, torch.compile(model.head, dynamic=dynamic, **kwargs))
        return regions, regions, False
    compiled = torch.compile(model, dynamic=dynamic, **kwargs)
    if mode not in EVAL_MODE:
        return compiled, compiled, False
    eval_mode = EVAL_MODE[mode]
    eval_kwargs: dict[str, Any] = {} if eval_mode == "default" else {"mode": eval_mode}
    compiled_eval = torch.compile(model, dynamic=dynamic, **eval_kwargs)
    return compiled, compiled_eval, True


def graphs_compiled() -> int:
    """Graphs torch.compile has built in this process: the difference over a phase is its recompiles."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def keeps_grads(compile: bool, compile_mode: str, cuda_graphs: bool) -> bool:
    """Whether gradients must stay allocated between steps (zeroed in place, not set to None): a CUDA graph,
    ours or inductor's, accumulates into the .grad tensors it saw when it was recorded."""
    return bool(cuda_graphs) or (compile and compile_mode in EVAL_MODE)


class CompiledRegions:
    """The model's forward with compiled blocks and head (kernel.compile_scope=blocks). The model itself stays
    uncompiled, as under torch.compile(model): GPTQ's calibration hooks call it directly (TTT passes regions of
    its own: speedrun.core.ttt_scorers.Scorer)."""

    def __init__(self, model: GPT, blocks: tuple, head: Any):
        self.model, self.blocks, self.head = model, blocks, head

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.model.compiled_regions(self.blocks, self.head):
            return self.model(*args, **kwargs)


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
