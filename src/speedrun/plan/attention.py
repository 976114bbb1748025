"""The attention part of the plan: the resolver asks the backend (its capabilities, then its own options)."""

from __future__ import annotations

from typing import Any

from speedrun.config import Config
from speedrun.core.attention import BACKENDS, AttentionBackend
from speedrun.core.model import ModelShape
from speedrun.errors import PlanError
from speedrun.hardware.profiles import HardwareProfile


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
    problems = backend_class(name).capabilities.problems(profile, precision, model, **wants)
    if problems:
        fits = [
            other
            for other in sorted(BACKENDS)
            if other != name and not backend_class(other).capabilities.problems(profile, precision, model, **wants)
        ]
        why = backend_class(name).capabilities.why
        # each reason whole, in order, so two of them read as two: "it needs X (t4 is sm75), and it runs Y only"
        reasons = problems[0] if len(problems) == 1 else ", and it ".join(problems)
        raise PlanError(
            f"attn={name} {reasons}{f' ({why})' if why else ''} - "
            + (f"use attn={' or attn='.join(fits)}" if fits else "no backend fits; change the request")
        )
    options, kernel = backend_class(name).plan_options(request, profile, precision, model)
    return name, options, kernel


def check_scores_memory(
    attn: str, options: dict[str, Any], micro_batch: int, model: ModelShape, profile: HardwareProfile, precision: str
) -> None:
    """A kernel that materialises B x H x T x T scores is refused before an OOM, not after."""

    if profile.device_type != "cuda":
        return
    need_gb = backend_class(attn).scores_bytes(options, micro_batch, model, precision) / 1e9
    if need_gb > 0.6 * profile.memory_gb:
        raise PlanError(
            f"the math attention kernel would hold ~{need_gb:.0f} GB of B x H x T x T scores "
            f"({micro_batch} x {model.n_head} x {model.seq_len}^2 x {model.n_layer} layers) on a "
            f"{profile.memory_gb:g} GB {profile.name}; use attn=flex or attn=sdpa, or lower hardware.micro_batch"
        )
