"""TTT's LoRA adapters: batched low-rank deltas, one per document slot, on a frozen copy of the model.

Where an adapter goes (``ttt.targets``, speedrun.config.specs.TTT_TARGETS):

- q, k, v, o, up, down: the block linear (attn.c_q, c_k, c_v, proj; mlp.fc, proj) becomes linear(x) + delta(x);
- attn_bypass, mlp_bypass: the whole sublayer (block.attn, block.mlp) becomes sublayer(x, ...) + delta(x), a
  low-rank path from the sublayer's (normed) input to its output, which is what the 2026-04 records call their
  o and MLP adapters;
- head: the model's ``head_adapter`` hook (speedrun.model.gpt.GPT.head), a delta on the logits from the normed
  final hidden state, for a tied head (the embedding) as for an untied one.

Modules are swapped in a deep copy of the model (the model passed in is never touched), so the GPT needs no TTT
path of its own. A looped layer (model.loop) uses one adapter for all its calls, where the records give each call
its own.

delta(x) = (alpha / rank) (x A_i^T) B_i^T for row i of the batch, A of shape (slots, rank, in), B (slots, out, rank):
every document of a batch has its own adapter, so with an elementwise optimizer (Adam, SGD) and a loss that sums
per-document terms a document's adapter sees only its own gradients. alpha None scales by 1. A starts at a seeded
draw, U(-1/sqrt(in), 1/sqrt(in)), shared by every slot; B at 0, so a fresh adapter adds exactly nothing.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn

TARGETS = {
    "q": ("attn", "c_q"),
    "k": ("attn", "c_k"),
    "v": ("attn", "c_v"),
    "o": ("attn", "proj"),
    "up": ("mlp", "fc"),
    "down": ("mlp", "proj"),
}
"""Adapter target -> (submodule of a block, attribute): blocks.N.attn.c_q etc."""
BYPASS = {"attn_bypass": "attn", "mlp_bypass": "mlp"}
"""Adapter target -> the block's sublayer it runs beside."""
SHARED_INPUT = ("q", "k", "v", "attn_bypass")
"""The targets that read the attention's input, in the order of the attention's adapter hook's deltas."""


class LoRADelta(nn.Module):
    """The per-slot low-rank delta: x (b, T, in) -> scale (x A^T) B^T, row i of a batch of b <= slots using slot i."""

    def __init__(self, d_in: int, d_out: int, slots: int, rank: int, scale: float, device: Any):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(slots, rank, d_in, device=device))
        self.B = nn.Parameter(torch.zeros(slots, d_out, rank, device=device))
        self.scale = scale
        self.rows: tuple[torch.Tensor, torch.Tensor] | None = None
        """A and B at the slots of a step's rows, bound by LoRAModel.bind_rows: the forward uses these very tensors
        (None: it slices its batch's rows itself)."""

    def bound(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A and B at a batch's slots: the views bind_rows bound, or the first ``batch`` slots."""
        return self.rows if self.rows is not None else (self.A[:batch], self.B[:batch])

    def up(self, h: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """scale h B^T: the delta from the low-rank h = x A^T."""
        delta = torch.bmm(h, B.transpose(1, 2).to(h.dtype))
        return delta if self.scale == 1.0 else delta * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        A, B = self.bound(x.size(0))
        return self.up(torch.bmm(x, A.transpose(1, 2).to(x.dtype)), B)


class InputAdapters(nn.Module):
    """The adapters that read an attention's input (q, k, v and the attention bypass: ``SHARED_INPUT``), hooked
    into the attention (speedrun.model.gpt.CausalSelfAttention.adapter) instead of wrapped around its linears and
    itself: their A products with the input are one, x [A_q; A_k; A_v; A_bypass]^T, split into each adapter's h.
    The same arithmetic; x (rows x width x d_model) is read once instead of four times, and the backward's input
    gradient is one product instead of four and their sum. ``ttt.shared_attn_a``."""

    def __init__(self, deltas: dict[str, LoRADelta]):
        super().__init__()
        self.names = tuple(t for t in SHARED_INPUT if t in deltas)
        self.deltas = nn.ModuleDict({t: deltas[t] for t in self.names})

    def forward(self, x: torch.Tensor, at: Any = None) -> tuple[torch.Tensor | None, ...]:
        deltas = [cast(LoRADelta, self.deltas[t]) for t in self.names]
        bound = [d.bound(x.size(0)) for d in deltas]
        A = torch.cat([a.to(x.dtype) for a, _ in bound], dim=1)  # cast each first: each A's gradient its own tensor
        hs = torch.bmm(x, A.transpose(1, 2)).split([a.size(1) for a, _ in bound], dim=-1)
        out: dict[str, torch.Tensor] = {}
        for t, d, (_, B), h in zip(self.names, deltas, bound, hs):
            if at is not None and t in ("q", "attn_bypass"):  # q and the output at the picked columns only
                h = at.gather(h)
            out[t] = d.up(h, B)
        return tuple(out.get(t) for t in SHARED_INPUT)


class Adapted(nn.Module):
    """A frozen module (a linear, or a whole attention or MLP) plus a delta from its first input:
    module(x, *rest) + delta(x). ``active`` False gives the module alone, bit for bit (global TTT trains that).
    ``at`` (an attention asked for some columns only, speedrun.model.gpt.Columns) passes on to the module, and
    the delta reads x at those columns."""

    def __init__(self, module: nn.Module, delta: LoRADelta):
        super().__init__()
        self.module, self.delta = module, delta
        self.active = True

    def forward(self, x: torch.Tensor, *rest: Any, at: Any = None) -> torch.Tensor:
        y = self.module(x, *rest) if at is None else self.module(x, *rest, at=at)
        if not self.active:
            return y
        return y + self.delta(x if at is None else at.gather(x)).to(y.dtype)


def _features(module: nn.Module) -> tuple[int, int]:
    """(in, out) of a linear, or of a sublayer that maps d_model -> d_model (its first linear's input width)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    first = next(m for m in module.modules() if isinstance(m, nn.Linear))
    return first.in_features, first.in_features


def cast_linear_weights(model: nn.Module, dtype: torch.dtype) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """Store every plain nn.Linear's weight and bias in ``dtype``: the dtype autocast casts them to at every call.
    For a frozen model that cast then happens once instead of at every forward (autocast caches casts only of
    tensors that require grad; in eager TTT on a GPU those casts were a quarter of the kernel time), and what the
    matmuls compute is unchanged, bit for bit. Only for a model run under autocast to ``dtype``: outside it, an
    fp32 input would meet a ``dtype`` weight. Subclasses (fp8 linears) keep their own handling. Returns each
    parameter cast, with its float master."""
    masters: list[tuple[nn.Parameter, torch.Tensor]] = []
    for module in model.modules():
        if type(module) is nn.Linear:
            for p in (module.weight, cast(Any, module.bias)):
                if isinstance(p, nn.Parameter) and p.dtype != dtype:
                    masters.append((p, p.data))
                    p.data = p.data.to(dtype)
    return masters


class LoRAModel:
    """A deep copy of the model, frozen, with adapters on ``targets`` (see the module doc); ``slots`` documents side
    by side. ``scale`` = alpha / rank (1 without alpha). ``cast_dtype``: the autocast dtype TTT runs under; the
    copy's linears are kept in it (cast_linear_weights), their float masters only for the global phases (bare)."""

    def __init__(
        self,
        model: nn.Module,
        targets: tuple[str, ...],
        rank: int,
        slots: int,
        seed: int,
        scale: float = 1.0,
        cast_dtype: torch.dtype | None = None,
        shared_attn_a: bool = False,
    ):
        # a model of the registry's contract (model/protocol.py): its blocks and their linears are looked up by name
        self.model: Any = cast(Any, copy.deepcopy(model))
        self.model.eval()  # our GPT has no dropout; eval() also keeps fp8 linears on their bf16 path
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.cast_dtype = cast_dtype
        self._masters = cast_linear_weights(self.model, cast_dtype) if cast_dtype is not None else []
        if "head" in targets and not hasattr(self.model, "head_adapter"):
            raise ValueError(
                f"ttt.targets has head, but {type(model).__name__} has no head_adapter hook (speedrun.model.gpt.GPT."
                f"head applies it); drop head from ttt.targets"
            )
        device = next(self.model.parameters()).device
        self.slots = slots
        self.wrapped: list[Adapted] = []
        self.deltas: list[LoRADelta] = []
        self.hooked: list[tuple[Any, InputAdapters]] = []
        """(attention, its InputAdapters) per block, with shared_attn_a."""

        def adapt(parent: nn.Module, attr: str, shared: dict[str, LoRADelta] | None, target: str) -> None:
            inner = getattr(parent, attr)
            d_in, d_out = _features(inner)
            delta = LoRADelta(d_in, d_out, slots, rank, scale, device)
            self.deltas.append(delta)  # the same order either way: the A draws below follow it
            if shared is not None and target in SHARED_INPUT:
                shared[target] = delta
                return
            wrapper = Adapted(inner, delta)
            setattr(parent, attr, wrapper)
            self.wrapped.append(wrapper)

        for block in self.model.blocks:
            attn = block.attn
            if shared_attn_a and not hasattr(attn, "adapter"):
                raise ValueError(
                    f"ttt.shared_attn_a is on, but {type(attn).__name__} has no adapter hook (speedrun.model.gpt."
                    "CausalSelfAttention.adapter); set ttt.shared_attn_a=false"
                )
            shared: dict[str, LoRADelta] | None = {} if shared_attn_a else None
            for t in targets:  # the linears first: a bypass wraps the sublayer that holds them
                if t in TARGETS:
                    parent_name, attr = TARGETS[t]
                    adapt(getattr(block, parent_name), attr, shared, t)
            for t in targets:
                if t in BYPASS:
                    adapt(block, BYPASS[t], shared, t)
            if shared:
                hook = InputAdapters(shared)
                attn.adapter = hook
                self.hooked.append((attn, hook))
        self.head: LoRADelta | None = None
        if "head" in targets:
            lm_head = getattr(self.model, "lm_head", None)  # the GPT's: None when tied to the embedding
            vocab, d_model = (self.model.tok_emb if lm_head is None else lm_head).weight.shape
            self.head = LoRADelta(d_model, vocab, slots, rank, scale, device)
            self.model.head_adapter = self.head
            self.deltas.append(self.head)
        # One A init (kaiming-uniform, seeded) shared by every document, so a document's result does not depend on
        # which batch or slot it lands in (unless warm_start_a keeps A from one batch to the next).
        gen = torch.Generator().manual_seed(seed)
        self.a_init = [
            torch.empty(d.A.shape[1:]).uniform_(-1, 1, generator=gen) / math.sqrt(d.A.shape[2]) for d in self.deltas
        ]
        self.reset(keep_a=False)

    def parameters(self) -> list[nn.Parameter]:
        return [p for d in self.deltas for p in (d.A, d.B)]

    def bind_rows(self, rows: int | None) -> list[torch.Tensor]:
        """Bind every adapter's slots [0, rows) as the A and B its forwards use until the next call, and return them
        in parameters()' order; None unbinds. Why: a step can then ask autograd for the gradients of these views
        alone (speedrun.ttt.graphs.chunk_step), rows-sized. A backward into the parameters themselves
        makes each gradient a whole (slots, ...) tensor, zeros past the rows included, and adds it into .grad: at
        the records' 64 slots that is gigabytes of memory traffic a step, on a step whose rows average under half
        the slots."""
        views: list[torch.Tensor] = []
        for d in self.deltas:
            d.rows = None if rows is None else (d.A[:rows], d.B[:rows])
            views.extend(d.rows or ())
        return views

    def base_parameters(self) -> list[nn.Parameter]:
        """The copied model's own weights (what global TTT trains), in the model's order."""
        adapters = {id(p) for p in self.parameters()}
        return [p for p in self.model.parameters() if id(p) not in adapters]

    @torch.no_grad()
    def reset(self, keep_a: bool) -> None:
        """B = 0 in every slot (the model is the unadapted model again); A = the shared init unless ``keep_a``."""
        for delta, a in zip(self.deltas, self.a_init):
            if not keep_a:
                delta.A.copy_(a.to(delta.A.device).expand_as(delta.A))
            delta.B.zero_()

    def a_state(self) -> list[torch.Tensor]:
        """A copy of every adapter's A (speedrun.ttt.score_first carries one per chain of batches)."""
        return [d.A.detach().clone() for d in self.deltas]

    @torch.no_grad()
    def load_a(self, state: list[torch.Tensor]) -> None:
        for delta, a in zip(self.deltas, state, strict=True):
            delta.A.copy_(a)

    @contextlib.contextmanager
    def bare(self) -> Iterator[Any]:
        """The copied model without its adapters (bit for bit the model alone) and with its own weights trainable:
        what global TTT fine-tunes. Adapters and freezing come back after."""
        for w in self.wrapped:
            w.active = False
        for attn, _ in self.hooked:
            attn.adapter = None
        if self.head is not None:
            self.model.head_adapter = None
        params = self.base_parameters()
        for p in self.parameters():  # not the adapters: an optimizer over the model's trainables must not see them
            p.requires_grad_(False)
        casts = [p.data for p, _ in self._masters]
        for p, master in self._masters:  # global TTT trains the float weights, as on a model never cast
            p.data = master
        for p in params:
            p.requires_grad_(True)
        try:
            yield self.model
        finally:
            for p in params:
                p.requires_grad_(False)
                p.grad = None
            # the fine-tuned float weights become the masters, cast back into the same storage: a CUDA graph of
            # TTT's step (speedrun.ttt.graphs) reads the weights where it found them at capture
            self._masters = [(p, p.data) for p, _ in self._masters]
            for (p, master), low in zip(self._masters, casts):
                low.copy_(master)
                p.data = low
            for p in self.parameters():
                p.requires_grad_(True)
            for w in self.wrapped:
                w.active = True
            for attn, hook in self.hooked:
                attn.adapter = hook
            if self.head is not None:
                self.model.head_adapter = self.head
