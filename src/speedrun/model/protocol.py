"""What the pipeline needs of a model: the contract a model named by ``model.arch`` must meet.

The built-in GPT (speedrun.model.gpt) is one implementation; a model of your own is another (docs/extending.md).
The registry (speedrun.model.registry) checks a class against this contract when the run starts, before any data
is built, and names every missing piece.

Who uses what:
- training: ``forward(idx, targets)`` -> the mean loss (a 0-d tensor) to backpropagate;
- evaluation and TTT: ``forward(idx, targets, reduction="none")`` -> per-token nats, shape (B, T);
- the optimizers: ``param_groups()`` -> {"matrix": [...], "scalar": [...], "embed": [...], "head": [...]}; Muon
  takes the 2-D block matrices ("matrix"), Adam the rest (an empty group is fine, an unknown key is refused);
- ``kernel.compile_scope=blocks``: ``blocks`` (an nn.ModuleList compiled one by one) and ``head(x, targets,
  reduction)`` (final norm, logits, loss), with ``compiled_regions(blocks, head)`` a context manager under which
  ``forward`` calls the compiled copies; TTT also passes a head of its own that runs the model's head at a
  chunk's columns only, so ``forward`` must return what the given head returns, and ``head`` must work position
  by position (its input is some columns of each row, not the whole sequence);
- optional: ``supports_pick`` True (a class attribute, or a property: the built-in GPT's depends on its attention
  backend's ``plain_softmax``) says that ``forward(idx, targets, reduction, pick=cols)`` returns what the whole
  forward returns at the (B, G) columns ``cols`` only, in their order: (B, G) losses, their mean with
  reduction="mean", (B, G, V) logits without targets. Columns may repeat, and G may exceed T (TTT clamps a
  chunk's columns to the window). TTT then asks for the chunk's columns itself, so the model may skip what no
  picked column needs (the built-in GPT runs its last layer call's queries, output projection and MLP there only);
- GPTQ, fp8 and TTT address the linears inside ``blocks`` by name (``<i>.attn.c_q``, ``<i>.attn.c_k``,
  ``<i>.attn.c_v``, ``<i>.attn.proj``, ``<i>.mlp.fc``, ``<i>.mlp.proj``; GPTQ takes any 2-D weight it finds): a model whose blocks name them otherwise
  trains and evaluates, and those features refuse it by name; TTT's bypass adapters wrap ``<i>.attn`` and
  ``<i>.mlp``, and its ``head`` target sets a ``head_adapter`` attribute that ``head`` must add to the logits
  (speedrun.model.gpt.GPT.head; a model without the attribute is refused ttt.targets=head); ttt.shared_attn_a
  sets an ``adapter`` attribute on ``<i>.attn`` (speedrun.model.gpt.CausalSelfAttention.adapter), refused without;
- the record: ``num_params()``; MFU: the FLOPs per token of the shape (speedrun.model.shape.ModelShape), unless the
  class defines ``flops_per_token(shape, seq_len)`` for a different arithmetic.

A model is constructed as ``cls(shape, attention, bos_id=..., doc_bos_id=..., fused_qkv=..., options=...)``:
``shape`` the resolved ModelShape, ``attention`` the backend the plan picked (call it as ``attention(q, k, v,
ctx)``; it never changes during a run), ``bos_id`` the document separator when the plan masks documents (else
None), ``doc_bos_id`` the separator token always, ``options`` the model's own knobs (its schema's fields beyond
speedrun.config.model.ModelConfig's) as a dict.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from speedrun.errors import PlanError

REQUIRED = ("forward", "head", "blocks", "param_groups", "compiled_regions", "num_params")
"""Attributes a model class must have (``blocks`` may be created in __init__: it is checked on the instance)."""
CLASS_REQUIRED = ("forward", "head", "param_groups", "compiled_regions", "num_params")
"""The methods checked on the class itself, before it is built."""
PARAM_GROUPS = ("matrix", "scalar", "embed", "head")


@runtime_checkable
class SpeedrunModel(Protocol):
    blocks: Any

    def forward(self, idx: Any, targets: Any = None, reduction: str = "mean") -> Any: ...

    def head(self, x: Any, targets: Any, reduction: str = "mean") -> Any: ...

    def param_groups(self) -> dict[str, list[Any]]: ...

    def compiled_regions(self, blocks: tuple, head: object) -> Iterator[None]: ...

    def num_params(self) -> int: ...


def missing_methods(cls: type) -> list[str]:
    """The contract's methods ``cls`` lacks (not callable or absent), in the contract's order."""
    return [name for name in CLASS_REQUIRED if not callable(getattr(cls, name, None))]


def check_instance(model: Any, arch: str) -> None:
    """After construction: ``blocks`` exists and param_groups() uses only the known groups."""
    if not hasattr(model, "blocks"):
        raise PlanError(f"model.arch={arch}: the built model has no `blocks` (an nn.ModuleList of its layers)")
    unknown = sorted(set(model.param_groups()) - set(PARAM_GROUPS))
    if unknown:
        raise PlanError(
            f"model.arch={arch}: param_groups() returned unknown groups {unknown}; use {', '.join(PARAM_GROUPS)}"
        )
