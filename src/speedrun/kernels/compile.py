"""torch.compile of the model as the kernel group says: mode, static or dynamic shapes, and a separate evaluation
graph where the training mode records CUDA graphs (evaluation batches vary and are read after the next call, which
inductor's CUDA graph trees would overwrite)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from speedrun.config.kernel import GRAPHING_MODES

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


class CompilePlan(Protocol):
    """The part of a Plan (speedrun.plan.types.Plan) compiling reads: kernels/ sits below plan/, so it names the
    fields it needs instead of importing the Plan."""

    @property
    def compile(self) -> bool: ...
    @property
    def kernel(self) -> CompileSettings: ...


EVAL_MODE = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
"""Evaluation's compile mode for a training mode that records CUDA graphs."""


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
    if mode not in GRAPHING_MODES:
        return compiled, compiled, False
    eval_mode = EVAL_MODE[mode]
    eval_kwargs: dict[str, Any] = {} if eval_mode == "default" else {"mode": eval_mode}
    compiled_eval = torch.compile(model, dynamic=dynamic, **eval_kwargs)
    return compiled, compiled_eval, True


def graphs_compiled() -> int:
    """Graphs torch.compile has built in this process: the difference over a phase is its recompiles."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def keeps_grads(plan: CompilePlan) -> bool:
    """Whether gradients must stay allocated between steps (zeroed in place, not set to None): a CUDA graph,
    ours or inductor's, accumulates into the .grad tensors it saw when it was recorded."""
    return bool(plan.kernel.cuda_graphs) or (plan.compile and plan.kernel.compile_mode in GRAPHING_MODES)


class CompiledRegions:
    """The model's forward with compiled blocks and head (kernel.compile_scope=blocks). The model itself stays
    uncompiled, as under torch.compile(model): GPTQ's calibration hooks call it directly (TTT passes regions of
    its own: speedrun.ttt.scorers.Scorer)."""

    def __init__(self, model: GPT, blocks: tuple, head: Any):
        self.model, self.blocks, self.head = model, blocks, head

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.model.compiled_regions(self.blocks, self.head):
            return self.model(*args, **kwargs)
