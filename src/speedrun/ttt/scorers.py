"""The forwards that score TTT's windows: the model's per-token nats, its head run at a chunk's columns only,
eager or through torch.compile (warmed up on random tokens before TTT's clock starts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.fx.experimental import _config as fx_config

from speedrun.ttt.global_phases import row_width
from speedrun.ttt.lora import LoRAModel
from speedrun.ttt.settings import LoRASettings, padding


class PickedHead:
    """A model's head run at some columns of each row only: the final hidden states and the targets at ``pick``
    ((rows, G) column indices) are gathered first, so a step whose window is 2,048 tokens wide but scores a chunk
    of 48 pays the final norm, the logits, the softcap and the loss (forward and backward) for 48 columns, not
    2,048. Every other column's loss is never read, and its gradient is zero anyway."""

    def __init__(self, head: Callable, pick: torch.Tensor):
        self.head, self.pick = head, pick

    def __call__(self, x: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        x = x.gather(1, self.pick[..., None].expand(-1, -1, x.size(-1)))
        return self.head(x, targets.gather(1, self.pick), reduction)


class Scorer:
    """A model's per-token nats for TTT: ``scorer(x, y)`` -> (rows, width), or with ``pick`` (rows, G) column
    indices the (rows, G) nats of those columns. Through the model's regions (the protocol's blocks, head and
    compiled_regions: speedrun.model.protocol) the head runs at the picked columns only (PickedHead), or, for a
    model whose forward takes ``pick`` (supports_pick), the model is asked for those columns (the built-in GPT
    then runs its last layer call there only too); without regions or pick the whole forward runs and the columns
    are taken after. This one runs the module's own blocks and head (eager); CompiledScorer runs compiled copies."""

    def __init__(self, module: nn.Module):
        self.module = module
        model: Any = module
        self.regions: tuple[tuple, Callable] | None = (
            (tuple(model.blocks), model.head) if hasattr(module, "compiled_regions") else None
        )
        self.whole: Callable = module
        """The forward that runs when there are no regions."""
        self.picks = bool(getattr(module, "supports_pick", False))
        """The model's forward takes ``pick`` (the built-in GPT then runs its last layer at those columns only)."""
        self.warm_up_seconds = 0.0

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, reduction: str = "none", pick: torch.Tensor | None = None
    ) -> torch.Tensor:
        model: Any = self.module
        if pick is not None and self.picks:  # the model skips what the picked columns do not need
            if self.regions is None:
                return self.whole(x, y, reduction=reduction, pick=pick)
            with model.compiled_regions(*self.regions):
                return model(x, y, reduction=reduction, pick=pick)
        if self.regions is None:
            nats = self.whole(x, y, reduction=reduction)
            return nats if pick is None else nats.gather(1, pick)
        blocks, head = self.regions
        with model.compiled_regions(blocks, head if pick is None else PickedHead(head, pick)):
            return model(x, y, reduction=reduction)


class CompiledScorer(Scorer):
    """A module's forward through torch.compile (dynamic shapes), and how long its warm-up took. ``scope`` blocks
    compiles each block and the head apart (as kernel.compile_scope=blocks does for training): the blocks share
    their code, so one small graph serves them all, where the whole model with its repeated layers, adapters and
    both loop passes is one very large graph to trace and lower. ``scope`` model (or a registry model without
    regions) compiles the whole forward, whose head then runs at every column unless the model takes ``pick``."""

    def __init__(self, module: nn.Module, backend: str, scope: str = "blocks"):
        super().__init__(module)
        if scope == "blocks" and self.regions is not None:
            model: Any = module
            blocks = tuple(torch.compile(block, dynamic=True, backend=backend) for block in model.blocks)
            self.regions = (blocks, torch.compile(model.head, dynamic=True, backend=backend))
        else:
            self.regions = None
            self.whole = torch.compile(module, dynamic=True, backend=backend)

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, reduction: str = "none", pick: torch.Tensor | None = None
    ) -> torch.Tensor:
        # One block code serves several variants (adapted or not, with and without grad, with or without a parallel
        # lane): more than dynamo's default 8 graphs per code object, past which it would run the rest eagerly.
        # No duck shaping: a window as wide as another dimension of the step (64 tokens = pgolf_record's head size)
        # would share that dimension's symbol, be specialized with it, and make every other width compile every
        # variant again (24 graphs of the smoke pgolf_record's block instead of 12; a test counts them).
        with (
            torch._dynamo.config.patch(recompile_limit=BLOCK_GRAPHS_LIMIT),
            fx_config.patch(use_duck_shape=False),  # type: ignore[attr-defined]  # installed by torch at import
        ):
            return super().__call__(x, y, reduction, pick)


BLOCK_GRAPHS_LIMIT = 64
"""Graphs dynamo may build for one code object (the block's forward) while TTT runs compiled."""


def make_scorers(
    lora: LoRAModel,
    model: nn.Module,
    s: LoRASettings,
    seq_len: int,
    steps: list[tuple[int, int]],
    device: str,
    autocast_dtype: torch.dtype | None,
    vocab: int,
) -> tuple[Scorer, Scorer]:
    """The adapted and the unadapted scorers: the modules themselves, or (settings.compile) compiled and warmed up
    on random tokens (never validation data) at every chunk size and the full window, with and without gradients,
    as the steps and the base passes call them (the head at a chunk's columns, or at every column), so the graphs
    exist before TTT's clock starts. The warm-up takes no optimizer step: the adapters stay as they were (their
    gradients are dropped)."""
    if s.compile is None:
        return Scorer(lora.model), Scorer(model)
    t0 = time.perf_counter()
    forward, base = (
        CompiledScorer(lora.model, s.compile, s.compile_scope),
        CompiledScorer(model, s.compile, s.compile_scope),
    )
    rows = lora.slots  # a full batch; a last, smaller one is another size of the same dynamic graph
    gen = torch.Generator().manual_seed(0)
    chunks = [s.chunk_size, *(c for _, c in steps)]
    for width in sorted({row_width(c, seq_len, padding(s)[0]) for c in chunks} | {seq_len}):
        x, y = (torch.randint(0, vocab, (rows, width), generator=gen).to(device) for _ in range(2))
        # contiguous, as a step's picks are: an expanded one (stride 0) would be another graph to dynamo
        pick = torch.arange(min(max(chunks), width), device=device).repeat(rows, 1)
        # the adapters' slots bound as the steps bind them (chunk_step): another way would be another graph
        lora.bind_rows(rows)
        autocast_nats(forward, x, y, device, autocast_dtype, pick).float().mean().backward()
        with torch.no_grad():
            lora.bind_rows(rows)
            autocast_nats(forward, x, y, device, autocast_dtype, pick)
            lora.bind_rows(None)
            if s.score_base:  # windows over documents' starts score every column; a later window one chunk
                autocast_nats(base, x, y, device, autocast_dtype)
                autocast_nats(base, x, y, device, autocast_dtype, pick)
                if min(chunks) == 1:  # a chunk of one column: a size-1 dimension is a graph of its own
                    autocast_nats(base, x, y, device, autocast_dtype, pick[:, :1].contiguous())
    for p in lora.parameters():
        p.grad = None
    forward.warm_up_seconds = time.perf_counter() - t0
    return forward, base


def autocast_nats(
    model: Callable,
    x: torch.Tensor,
    y: torch.Tensor,
    device: str,
    autocast_dtype: torch.dtype | None,
    pick: torch.Tensor | None = None,
) -> torch.Tensor:
    """A scorer's (Scorer) nats under the autocast: (rows, width), or at ``pick``'s columns (rows, G)."""
    if autocast_dtype is None:
        return model(x, y, reduction="none", pick=pick)
    with torch.autocast(device, dtype=autocast_dtype):
        return model(x, y, reduction="none", pick=pick)
