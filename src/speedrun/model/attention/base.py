"""The one interface every attention backend implements.

A backend is chosen by name once, when the model is built (``speedrun.model.attention.get_backend``), and the model
calls it the same way whatever it is:

    ctx = backend.prepare(idx, bos_id)      # once per model forward (masks, block masks, ...)
    y = backend(q, k, v, ctx)               # once per layer

Shapes: q is (B, Hq, T, D); k and v are (B, Hkv, T, D) with Hq % Hkv == 0 (grouped-query attention); the
result is (B, Hq, T, D) in q's dtype. Attention is always causal. ``bos_id`` not None asks for a document
mask (documents start at a BOS token; a query sees only keys of its own document); a backend that cannot
mask documents says so in its ``capabilities`` and refuses such a request in ``prepare`` rather than ignoring it.

Each backend describes itself to the resolver (speedrun.plan), which never names a backend: ``capabilities``
(devices, compute capability, precisions, GQA, document masks, windows, head_dim limits) for the checks every
backend shares, ``plan_options`` for its own choices (which SDPA kernel, which Triton tiles, which FA3 build)
and ``scores_bytes`` for backends that materialise the T x T scores. Adding a backend is one module and one
conf/attn YAML (README "Extending").

Backends hold no parameters and no per-step state, so a compiled model can inline them: nothing in
``__call__`` or ``prepare`` branches on tensor values or calls ``.item()``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:  # the resolver's types; imported for annotations only (no import cycle at runtime)
    from speedrun.config import AttnConfig
    from speedrun.hardware.profiles import HardwareProfile
    from speedrun.model.shape import ModelShape

PRECISIONS = ("fp32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run; the resolver refuses a request outside it and names the backends that fit."""

    devices: tuple[str, ...] = ("cuda",)
    """torch device types it trains on."""
    min_capability: tuple[int, int] | None = None
    """Lowest CUDA compute capability (None: any)."""
    max_capability: tuple[int, int] | None = None
    """Highest CUDA compute capability it has builds for (None: any)."""
    precisions: tuple[str, ...] = PRECISIONS
    """Run precisions it accepts (fp8 runs attention in bf16)."""
    gqa: bool = True
    """Fewer key/value heads than query heads."""
    document_mask: bool = False
    window: bool = False
    min_head_dim: int = 1
    max_head_dim: int | None = None
    why: str = ""
    """One clause on where the limits come from, appended to refusals."""

    def problems(
        self, profile: HardwareProfile, precision: str, model: ModelShape, *, document_mask: bool, window: bool
    ) -> list[str]:
        """Why this backend cannot run the request ([] when it can)."""
        out = []
        cap = profile.capability
        if profile.device_type not in self.devices:
            out.append(f"does not run on {profile.device_type} (runs on {', '.join(self.devices)})")
        elif cap is not None and self.min_capability and cap < self.min_capability:
            out.append(f"needs compute capability >= {_sm(self.min_capability)} ({profile.name} is {_sm(cap)})")
        elif cap is not None and self.max_capability and cap > self.max_capability:
            out.append(f"has no build beyond {_sm(self.max_capability)} ({profile.name} is {_sm(cap)})")
        if precision not in self.precisions:
            out.append(f"runs {', '.join(self.precisions)} only, not precision={precision}")
        if model.n_kv_head != model.n_head and not self.gqa:
            out.append("has no grouped-query attention (model.n_kv_head < model.n_head)")
        if document_mask and not self.document_mask:
            out.append("cannot mask documents")
        if window and not self.window:
            out.append("has no sliding window")
        if model.head_dim < self.min_head_dim or (self.max_head_dim and model.head_dim > self.max_head_dim):
            limit = f"{self.min_head_dim}..{self.max_head_dim}" if self.max_head_dim else f">= {self.min_head_dim}"
            out.append(f"needs head_dim {limit}; model.d_model / model.n_head = {model.head_dim}")
        return out


def _sm(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


class AttentionBackend(ABC):
    """Causal (optionally document-masked, windowed) attention behind one signature."""

    name: str = ""
    """Registry name, e.g. "sdpa"."""
    kernel: str = ""
    """What actually runs, e.g. "sdpa:flash", "math", "flex"; recorded as result.json's attn_kernel."""
    capabilities: ClassVar[Capabilities] = Capabilities()
    window: int | None = None
    """Sliding-window length in tokens (a query sees at most this many keys, itself included); None: full."""
    plain_softmax: ClassVar[bool] = False
    """True when what ``__call__`` computes is softmax(q k^T / sqrt(D)) v over exactly the keys ``allowed_keys``
    lets a query see (causal, the window, the document when prepare() was given bos_id), and nothing else: no
    sinks, ALiBi, softcap or other scale. A forward at some columns only (speedrun.model.gpt.GPT.forward's pick)
    rebuilds that attention with an explicit mask, so the built-in GPT offers pick only over such a backend. The
    built-in backends set it; one registered from elsewhere is left out until it says so."""

    @property
    def supports_doc_mask(self) -> bool:
        """Whether prepare() honours bos_id (document masking)."""
        return self.capabilities.document_mask

    # -- what the resolver asks (class methods: no backend is built before the plan is settled) ------------
    @classmethod
    def plan_options(
        cls, request: AttnConfig, profile: HardwareProfile, precision: str, model: ModelShape
    ) -> tuple[dict[str, Any], str]:
        """The constructor options this request resolves to on this profile, and the kernel label that will
        run. Raise speedrun.errors.PlanError (naming what works) for what ``capabilities`` cannot express."""
        return {}, cls.name

    @classmethod
    def scores_bytes(cls, options: dict[str, Any], micro_batch: int, model: ModelShape, precision: str) -> int:
        """Bytes of B x H x T x T scores kept for backward across all layers (0: the kernel never holds them)."""
        return 0

    def prepare(self, idx: torch.Tensor, bos_id: int | None) -> Any:
        """Build the per-forward context from the token ids (B, T). Default: nothing needed."""
        if bos_id is not None and not self.supports_doc_mask:
            raise ValueError(
                f"attention backend {self.kernel!r} cannot mask documents (bos_id={bos_id}); "
                "use attn=flex or attn=math for document masking"
            )
        return None

    @abstractmethod
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Causal attention of q (B, Hq, T, D) over k, v (B, Hkv, T, D); returns (B, Hq, T, D)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kernel={self.kernel!r}, window={self.window})"


def materialized_scores_bytes(micro_batch: int, model: ModelShape, precision: str) -> int:
    """Scores plus softmax probabilities (fp32) kept for backward in every layer by a kernel that materialises
    B x H x T x T: the estimate the resolver compares with the card's memory before any allocation."""
    bytes_per = 4 if precision == "fp32" else 2
    return micro_batch * model.n_head * model.seq_len**2 * (bytes_per + 4) * model.n_layer


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Validate (B, H, T, D) shapes for GQA; returns the group size Hq // Hkv. Shape checks are static."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention expects 4-D (B, H, T, D) tensors, got {tuple(q.shape)}, {tuple(k.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    hq, hkv = q.size(1), k.size(1)
    if hq % hkv != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if q.size(0) != k.size(0) or q.size(2) != k.size(2) or q.size(3) != k.size(3):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on B, T or D")
    return hq // hkv


def allowed_keys(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: int | None,
    q_docs: torch.Tensor | None = None,
    k_docs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Whether a query at q_pos may attend a key at k_pos (broadcast against each other): causal (k <= q), within
    ``window`` tokens (q - k < window; the query itself included), and in the same document when the documents'
    ids are given. The one rule every mask here is built from (math's, flex's mask_mod, GPT.forward's pick)."""
    allowed = k_pos <= q_pos
    if window is not None:
        allowed = allowed & (q_pos - k_pos < window)
    if q_docs is not None and k_docs is not None:
        allowed = allowed & (q_docs == k_docs)
    return allowed


def document_ids(idx: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Document index of every token: a new document starts at each BOS. (B, T) int32.

    Tokens before the first BOS of a row form document 0, so no query ever has an empty key set.
    """
    return torch.cumsum((idx == bos_id).to(torch.int32), dim=1, dtype=torch.int32)


def check_window(window: int | None) -> int | None:
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    return window
