"""The attention part of the plan: what each backend can run (its capabilities) and the options a request resolves to
on a profile, asked before any backend is built (speedrun.core.attention holds the backends themselves)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speedrun.config import Config
from speedrun.core.attention import BACKENDS, REPOS, AttentionBackend
from speedrun.core.model import ModelShape
from speedrun.errors import PlanError
from speedrun.hardware.profiles import HardwareProfile

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


CAPABILITIES: dict[str, Capabilities] = {
    "math": Capabilities(devices=("cpu", "cuda"), document_mask=True, window=True),
    "sdpa": Capabilities(devices=("cpu", "cuda")),
    # Triton's tl.dot needs K >= 16, so a head_dim below 16 cannot compile ("embedding dimension ... must be at
    # least 16"); training needs CUDA (flex's backward is a Triton kernel; CPU has the forward only).
    "flex": Capabilities(
        devices=("cuda",), document_mask=True, window=True, min_head_dim=16, why="flex compiles Triton kernels for CUDA"
    ),
    "fa3": Capabilities(
        devices=("cuda",),
        min_capability=(8, 0),
        max_capability=(9, 0),
        precisions=("bf16", "fp8"),
        max_head_dim=256,
        why="FA3 builds exist for sm80 and sm90, bf16 only",
    ),
}
"""What each built-in backend can run (a backend registered from elsewhere states its own as ``capabilities``)."""


def _math_options(request: Any, profile: Any, precision: str) -> tuple[dict[str, Any], str]:
    return {"window": request.window}, "math"


def _sdpa_options(request: Any, profile: Any, precision: str) -> tuple[dict[str, Any], str]:
    """The pinned kernel: attn.kernel, or the profile's pick; auto under fp32 takes efficient (flash and
    cuDNN take 16-bit inputs only)."""
    cuda = profile.device_type == "cuda"
    kernel = profile.sdpa_kernel if request.kernel == "auto" else str(request.kernel)
    if request.kernel == "auto" and precision == "fp32" and cuda and kernel in ("flash", "cudnn"):
        kernel = "efficient"
    if not cuda and kernel in ("cudnn", "efficient"):
        raise PlanError(f"attn.kernel={kernel} needs a CUDA GPU; on CPU use attn.kernel=flash or math")
    if cuda and kernel in ("flash", "cudnn"):
        if profile.capability < (8, 0):
            raise PlanError(
                f"attn.kernel={kernel} needs compute capability >= 8.0; {profile.name} is "
                f"sm{profile.capability[0]}{profile.capability[1]} - use attn.kernel=efficient (K/V expanded for "
                f"GQA) or attn=flex"
            )
        if precision == "fp32":
            raise PlanError(
                f"attn.kernel={kernel} needs fp16 or bf16 inputs; with precision=fp32 use attn.kernel=efficient or math"
            )
    return {"kernel": kernel}, f"sdpa:{kernel}"


def _flex_options(request: Any, profile: Any, precision: str) -> tuple[dict[str, Any], str]:
    # The profile's forward blocks; speedrun.plan.kernel_choice replaces them with the kernel group's tiles (forward
    # and backward) where they are chosen per head_dim or set.
    block_m, block_n = profile.flex_blocks
    kernel_options = {"BLOCK_M": block_m, "BLOCK_N": block_n}
    return {"window": request.window, "kernel_options": kernel_options}, "flex"


def _fa3_options(request: Any, profile: Any, precision: str) -> tuple[dict[str, Any], str]:
    """The kernel repo follows the capability unless given; the pin is a version or a revision."""
    repo = request.fa3_repo or REPOS["sm90" if profile.capability >= (9, 0) else "sm80"]
    version, revision = (None, request.fa3_revision) if request.fa3_revision else (request.fa3_version, None)
    if version is None and revision is None:
        raise PlanError("attn=fa3 needs a pin: set attn.fa3_version=<int> or attn.fa3_revision=<rev>")
    pin = revision if revision is not None else version
    # the builds named in REPOS are vetted here; another repo is trusted only when the user says so
    trust = request.fa3_trust_remote_code
    trust = repo in REPOS.values() if trust is None else bool(trust)
    return {"repo": repo, "version": version, "revision": revision, "trust_remote_code": trust}, f"fa3:{repo}@{pin}"


OPTIONS: dict[str, Callable[[Any, HardwareProfile, str], tuple[dict[str, Any], str]]] = {
    "math": _math_options,
    "sdpa": _sdpa_options,
    "flex": _flex_options,
    "fa3": _fa3_options,
}
"""Each built-in backend's constructor options for a request on a profile, and the kernel label that will run
(one registered from elsewhere may define ``plan_options(request, profile, precision, model)``; else none)."""


def capabilities(name: str) -> Capabilities:
    """What backend ``name`` can run: the table's, or a registered class's own ``capabilities``."""
    found = CAPABILITIES.get(name) or getattr(backend_class(name), "capabilities", None)
    return found if isinstance(found, Capabilities) else Capabilities()


def plan_options(name: str, request: Any, profile: HardwareProfile, precision: str, model: ModelShape):
    """(constructor options, kernel label) of backend ``name`` for this request; PlanError for what its
    capabilities cannot express."""
    if name in OPTIONS:
        return OPTIONS[name](request, profile, precision)
    own = getattr(backend_class(name), "plan_options", None)
    return own(request, profile, precision, model) if own else ({}, name)


def materialized_scores_bytes(micro_batch: int, model: ModelShape, precision: str) -> int:
    """Scores plus softmax probabilities (fp32) kept for backward in every layer by a kernel that materialises
    B x H x T x T: the estimate the resolver compares with the card's memory before any allocation."""
    bytes_per = 4 if precision == "fp32" else 2
    return micro_batch * model.n_head * model.seq_len**2 * (bytes_per + 4) * model.n_layer


def scores_bytes(name: str, options: dict[str, Any], micro_batch: int, model: ModelShape, precision: str) -> int:
    """Bytes of B x H x T x T scores backend ``name`` keeps for backward across all layers (0: its kernel never
    holds them): math's, and sdpa's math kernel."""
    if name == "math" or (name == "sdpa" and options.get("kernel") == "math"):
        return materialized_scores_bytes(micro_batch, model, precision)
    own = getattr(backend_class(name), "scores_bytes", None)
    return own(options, micro_batch, model, precision) if own and name not in OPTIONS else 0


def backend_class(name: str) -> type[AttentionBackend]:
    """The class ``attn=name`` builds; PlanError listing the registered names for another."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise PlanError(f"attn={name}: no such backend; registered: {', '.join(sorted(BACKENDS))}") from None


def register_backend(name: str, backend: type[AttentionBackend]) -> None:
    """Add an attention backend class under ``name`` (from a package of one's own); refuses to overwrite."""
    if name in BACKENDS:
        raise ValueError(f"attention backend {name!r} is already registered")
    BACKENDS[name] = backend


def resolve_attention(
    cfg: Config, profile: HardwareProfile, precision: str, model: ModelShape
) -> tuple[str, dict[str, Any], str]:
    """Ask the requested backend whether it can run here (its capabilities), then for its options."""

    request = cfg.attn
    name = profile.attn if request.name == "auto" else request.name
    if name not in BACKENDS:
        raise PlanError(f"attn={name}: no such backend; registered: {', '.join(sorted(BACKENDS))}")
    wants = dict(document_mask=request.document_mask, window=request.window is not None)
    problems = capabilities(name).problems(profile, precision, model, **wants)
    if problems:
        fits = [
            other
            for other in sorted(BACKENDS)
            if other != name and not capabilities(other).problems(profile, precision, model, **wants)
        ]
        why = capabilities(name).why
        # each reason whole, in order, so two of them read as two: "it needs X (t4 is sm75), and it runs Y only"
        reasons = problems[0] if len(problems) == 1 else ", and it ".join(problems)
        raise PlanError(
            f"attn={name} {reasons}{f' ({why})' if why else ''} - "
            + (f"use attn={' or attn='.join(fits)}" if fits else "no backend fits; change the request")
        )
    options, kernel = plan_options(name, request, profile, precision, model)
    return name, options, kernel


def check_scores_memory(
    attn: str, options: dict[str, Any], micro_batch: int, model: ModelShape, profile: HardwareProfile, precision: str
) -> None:
    """A kernel that materialises B x H x T x T scores is refused before an OOM, not after."""

    if profile.device_type != "cuda":
        return
    need_gb = scores_bytes(attn, options, micro_batch, model, precision) / 1e9
    if need_gb > 0.6 * profile.memory_gb:
        raise PlanError(
            f"the math attention kernel would hold ~{need_gb:.0f} GB of B x H x T x T scores "
            f"({micro_batch} x {model.n_head} x {model.seq_len}^2 x {model.n_layer} layers) on a "
            f"{profile.memory_gb:g} GB {profile.name}; use attn=flex or attn=sdpa, or lower hardware.micro_batch"
        )
