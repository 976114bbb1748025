"""TTT's settings, its LoRA adapters and their optimizer: batched low-rank deltas, one per document slot, on a frozen
copy of the model.

Where an adapter goes (``ttt.targets``: a preset of TTT_PRESETS or a comma list):

- q, k, v, o, up, down: the block linear (attn.c_q, c_k, c_v, proj; mlp.fc, proj) becomes linear(x) + delta(x);
- attn_bypass, mlp_bypass: the whole sublayer (block.attn, block.mlp) becomes sublayer(x, ...) + delta(x), a
  low-rank path from the sublayer's (normed) input to its output, which is what the 2026-04 records call their
  o and MLP adapters;
- head: the model's ``head_adapter`` hook (speedrun.core.model.GPT.head), a delta on the logits from the normed
  final hidden state, for a tied head (the embedding) as for an untied one.

Modules are swapped in a deep copy of the model (the model passed in is never touched), so the GPT needs no TTT
path of its own. A looped layer (model.loop) uses one adapter for all its calls, where the records give each call
its own.

delta(x) = (alpha / rank) (x A_i^T) B_i^T for row i of the batch, A of shape (slots, rank, in), B (slots, out, rank):
every document of a batch has its own adapter, so with an elementwise optimizer (Adam, SGD) and a loss that sums
per-document terms a document's adapter sees only its own gradients. alpha None scales by 1. A starts at a seeded
draw, U(-1/sqrt(in), 1/sqrt(in)), shared by every slot; B at 0, so a fresh adapter adds exactly nothing.

The adapters' optimizer: the one ``ttt.optimizer`` names, stepping every adapter slot, or, for
Adam with beta1 = 0 (the records' setting), stepping only the slots of the step's rows.

Why: the adapters are (slots, ...) fp32 tensors, 1.3 GB at the records' 64 slots and rank 96 on pgolf_record, and a
fused AdamW step over every slot moves about 9 GB of memory, at every step of a batch, even when one long document
of its 64 is still going.

Why the rows' slots are enough: a step's rows are the slots [0, rows) (speedrun.core.ttt_score sorts a batch's
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

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import nn

from speedrun.core import choice


@dataclass(frozen=True)
class GlobalSettings:
    """What ``ttt.phased.*`` resolves to (speedrun.config.finishing.PhasedTTTConfig has each knob's meaning)."""

    phases: int = 0
    """Global fine-tunes; 0: off."""
    prefix_docs: int = 2000
    lr: float = 1e-3
    momentum: float = 0.9
    chunk_tokens: int = 32768
    batch_seqs: int = 32
    grad_clip: float = 1.0
    epochs: int = 1
    micro_rows: int | None = None
    """A forward's budget within a step, in rows of seq_len: a forward holds as many of the step's rows as fit in
    micro_rows x seq_len padded tokens (their gradients add up); None: a rank's whole share of a step at once. The
    run passes its training micro-batch, so a step never holds more activations than a training micro-step."""


@dataclass(frozen=True)
class TTTSettings:
    """How the adapters learn: what ``ttt.*`` resolves to (speedrun.config.finishing.TTTConfig has each knob's
    meaning)."""

    rank: int
    lr: float
    chunk_size: int
    local_lr_mult: float = 1.0
    """The adapters' optimizer steps at lr x local_lr_mult (ttt.local_lr_mult); global TTT keeps phased.lr."""
    short_chunks: str = ""
    """Short documents' chunk schedule, "LEN:CHUNK,..." (speedrun.core.ttt_docs.short_chunks_of); "" = off."""
    targets: str = "all"
    batch_size: int = 1
    """Documents adapted side by side, each with its own adapters."""
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.0
    max_seconds: float | None = None
    """Stop after the chunk that passes this many seconds (the rest unscored, recorded as the fraction scored)."""
    seed: int = 0
    score_base: bool = True
    """Also score each chunk with the unadapted model (base_val_loss, base_val_bpb)."""
    alpha: float | None = None
    """LoRA scaling alpha / rank; None: 1."""
    optimizer: str = "adam"
    """adam (AdamW with beta1, beta2, eps, weight_decay) or sgd (momentum, weight_decay)."""
    eps: float = 1e-8
    momentum: float | None = None
    warm_start_a: bool = False
    """Keep A from one batch to the next of its chain (B still starts at 0); A goes back to its draw after a
    global phase."""
    warm_start_chains: int = 8
    """With warm_start_a: the batches between two global phases are dealt into this many chains, whatever the rank
    count, each on one rank (documents.deal_batches); a batch continues the A of its chain's previous batch. At least
    the rank count."""
    phased: GlobalSettings = GlobalSettings()
    """Phased global TTT (speedrun.core.ttt_global); off by default."""
    cast_weights: bool = True
    """Under a bf16/fp16 autocast, keep the frozen linears of the adapted copy (and of the unadapted one that scores
    val_bpb_ttt_base) in that dtype, cast once (speedrun.core.ttt_lora.cast_linear_weights): the same numbers,
    without a cast of every weight at every forward. False: the casts at every call (tests compare the two)."""
    compile: str | None = None
    """torch.compile backend of the adapted and unadapted forwards (inductor; tests use aot_eager), dynamic
    shapes, warmed up before the clock starts; None: eager."""
    compile_scope: str = "blocks"
    """blocks: each block and the head compiled on their own (one small graph that every block reuses, through
    the model's compiled_regions); model: the whole forward as one graph."""
    cuda_graphs: bool = False
    """Replay each step from a CUDA graph, one per step shape, all captured before the clock starts
    (speedrun.core.ttt_graphs); CUDA only."""
    max_batch_share: float | None = None  # None here: unit tests batch exactly as asked; the config's default is 1/8
    """Halve a batch (by documents) while its cost is more than this share of all batches' (documents.
    split_heavy_batches): a batch of long documents that one rank would work on while the others wait. None: never."""
    row_widths: str = "pow2"
    """The widths a step's rows are padded to (ttt_docs.row_width): pow2 (64, 128, 256, ...), half_octave
    (64, 96, 128, 192, ...: less padding, twice the shapes to compile and capture) or a number N (multiples of N)."""
    graph_rows: str = "pow2"
    """The row counts a graphed step is padded to (graphs.pad_rows): pow2 or half_octave (3, 6, 12, 24, ...)."""
    shared_attn_a: bool = False
    """One A product for the adapters that read the attention's input (q, k, v, attn_bypass), through the
    attention's adapter hook (speedrun.core.ttt_lora.InputAdapters): the same arithmetic, x read once."""


TTT_PRESETS = {
    "all": ("q", "k", "v", "o", "up", "down"),
    "no_qv": ("k", "o", "up", "down"),
    "qkvo": ("q", "k", "v", "o"),
    "qv": ("q", "v"),
    "record": ("q", "k", "v", "attn_bypass", "mlp_bypass", "head"),
}
"""ttt.targets' named sets (speedrun.config.specs checks a command line's against the same table)."""


def targets_of(spec: str) -> tuple[str, ...]:
    """A preset name or a comma list of targets (``mlp`` = up,down) -> ordered target names."""
    spec = spec.strip()
    if spec in TTT_PRESETS:
        return TTT_PRESETS[spec]
    names: list[str] = []
    for item in spec.split(","):
        for name in ("up", "down") if item.strip() == "mlp" else (item.strip(),):
            if name not in names:
                names.append(name)
    return tuple(names)


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
    into the attention (speedrun.core.model.CausalSelfAttention.adapter) instead of wrapped around its linears and
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


SHARED_A = choice("ttt.shared_attn_a", {"on": InputAdapters})
"""ttt.shared_attn_a: the attention's input adapters as one hook."""


class Adapted(nn.Module):
    """A frozen module (a linear, or a whole attention or MLP) plus a delta from its first input:
    module(x, *rest) + delta(x). ``active`` False gives the module alone, bit for bit (global TTT trains that).
    ``at`` (an attention asked for some columns only, speedrun.core.model.Columns) passes on to the module, and
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
        device = next(self.model.parameters()).device
        self.slots = slots
        self.wrapped: list[Adapted] = []
        self.deltas: list[LoRADelta] = []
        self.hooked: list[tuple[Any, nn.Module]] = []
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
            shared: dict[str, LoRADelta] | None = {} if shared_attn_a else None
            for t in targets:  # the linears first: a bypass wraps the sublayer that holds them
                if t in TARGETS:
                    parent_name, attr = TARGETS[t]
                    adapt(getattr(block, parent_name), attr, shared, t)
            for t in targets:
                if t in BYPASS:
                    adapt(block, BYPASS[t], shared, t)
            if shared:
                hook = SHARED_A["on"](shared)
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
        alone (speedrun.core.ttt_graphs.chunk_step), rows-sized. A backward into the parameters themselves
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
        """A copy of every adapter's A (speedrun.core.ttt_score carries one per chain of batches)."""
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
            # TTT's step (speedrun.core.ttt_graphs) reads the weights where it found them at capture
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


# ---------------------------------------------------------------------------------------------------------
# the adapters' optimizer


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


ADAPTER_OPTIMIZERS = choice(
    "ttt.optimizer",
    {
        "adam": lambda params, lr, s, fused: torch.optim.AdamW(
            params, lr=lr, betas=(s.beta1, s.beta2), eps=s.eps, weight_decay=s.weight_decay, fused=fused
        ),
        "sgd": lambda params, lr, s, fused: torch.optim.SGD(
            params, lr=lr, momentum=s.momentum or 0.0, weight_decay=s.weight_decay, fused=fused
        ),
    },
)
"""ttt.optimizer -> (params, lr, settings, fused) -> a torch optimizer over every slot: AdamW (beta1, beta2, eps,
decoupled weight_decay) or SGD (momentum, weight_decay added to the gradient)."""


def adapter_optimizer(params: list[nn.Parameter], s: TTTSettings) -> AdapterOptimizer:
    """The adapters' optimizer, from TTTSettings ``s`` (optimizer, lr, beta1, beta2, eps, momentum, weight_decay):
    one for the run, begun anew at every batch. Its learning rate is s.lr x s.local_lr_mult (ttt.local_lr_mult)."""
    lr = s.lr * s.local_lr_mult
    if s.optimizer == "adam" and s.beta1 == 0 and params:
        return RowSlotsAdam(params, lr=lr, beta2=s.beta2, eps=s.eps, weight_decay=s.weight_decay)
    # On CUDA the fused kernels: the adapters are about a hundred (slots, rank, in) tensors of fp32, gigabytes at
    # the records' 64-128 slots and rank 96, and the fused step reads and writes each of them once (as the records'
    # AdamW(fused=True)); elsewhere the default (foreach) implementation.
    fused = (bool(params) and params[0].is_cuda) or None
    return EverySlot(ADAPTER_OPTIMIZERS[s.optimizer](params, lr, s, fused))


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
        pass  # never called: only RowSlotsAdam steps inside a graphed chunk step

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
        self.taken.append((rows, self.apply(rows, [None if p.grad is None else p.grad[:rows] for p in self.params])))

    def stepped(self, rows: int, live: tuple[int, ...]) -> None:
        self.taken.append((rows, live))

    @torch.no_grad()
    def apply(self, rows: int, grads: Sequence[torch.Tensor | None]) -> tuple[int, ...]:
        """The update of one step at the slots [0, rows) from the gradients of those slots (rows-sized; None: no
        gradient, no step, as torch), as device work only: a CUDA graph of the chunk step can hold it
        (speedrun.core.ttt_graphs), which then never writes the gradients to .grad. Returns the parameters
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
