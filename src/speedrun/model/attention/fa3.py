"""FlashAttention-3 through Hugging Face `kernels`, pinned to a version and loadable offline.

Which build: sm90 (Hopper) gets varunneal/flash-attention-3, sm80-89 kernels-community/flash-attn3 (the
resolver picks; FA3 has no sm75 or sm100 build). bf16 only. Since kernels 0.15, ``get_kernel`` wants an
explicit ``version=`` or ``revision=``, so the pin is part of the config and of attn_kernel
("fa3:<repo>@<pin>").

Trust: since kernels 0.14, ``get_kernel`` refuses repos whose publisher is not on the Hub's trusted list unless
called with ``trust_remote_code=True`` (kernels-community is trusted; varunneal, a personal account, is not), and
the check needs the Hub's repo info. speedrun passes it for the builds it names in REPOS (their code is what this
backend was written against); a repo of the user's choosing needs attn.fa3_trust_remote_code=true.

Offline (our GPU machine has no network): `kernels` reads the Hugging Face cache when HF_HUB_OFFLINE=1, and
LOCAL_KERNELS maps repo ids to local build directories. Loading happens once, when the backend is built (before
any training), and every way it can fail becomes one KernelUnavailable error that says how to pre-fetch.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from speedrun.errors import ConfigError, PlanError
from speedrun.model.attention.base import AttentionBackend, Capabilities, check_shapes

REPOS = {"sm90": "varunneal/flash-attention-3", "sm80": "kernels-community/flash-attn3"}
"""The FA3 build per compute capability (Hugging Face `kernels` repos)."""

PREFETCH_HELP = (
    "pre-fetch it on a machine with network: `pip install 'speedrun[kernels]' && python -c \"from kernels import "
    "get_kernel; get_kernel('{repo}', {pin})\"`, copy ~/.cache/huggingface/hub to this machine and set "
    "HF_HUB_OFFLINE=1 (or point LOCAL_KERNELS='{repo}=/path/to/build' at a local build); otherwise use "
    "attn=sdpa or attn=flex"
)


class KernelUnavailable(ConfigError):
    """The FA3 kernel could not be loaded here; the message says how to make it available."""


def _pin_kwargs(version: Any, revision: Any) -> dict[str, Any]:
    if (version is None) == (revision is None):
        raise ValueError("attn=fa3 needs exactly one of attn.fa3_version or attn.fa3_revision (kernels >= 0.15)")
    return {"version": version} if version is not None else {"revision": revision}


def load_fa3(repo: str, version: Any = None, revision: Any = None, trust_remote_code: bool = False) -> Any:
    """The kernel module, or KernelUnavailable naming the cause and the fix."""
    pin = _pin_kwargs(version, revision)
    pin_text = ", ".join(f"{k}={v!r}" for k, v in pin.items())
    fix = PREFETCH_HELP.format(repo=repo, pin=pin_text)
    try:
        from kernels import get_kernel
    except ImportError as e:
        raise KernelUnavailable(f"attn=fa3 needs the `kernels` package ({e}); {fix}") from e
    try:
        module = get_kernel(repo, **pin, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - network, cache miss, ABI mismatch: all mean "not loadable here"
        if "trusted" in str(e) and not trust_remote_code:
            raise KernelUnavailable(
                f"attn=fa3: `kernels` refuses {repo}: its publisher is not on the Hub's trusted "
                f"list ({e}); if you trust its code, set attn.fa3_trust_remote_code=true, "
                f"otherwise use attn=sdpa or attn=flex"
            ) from e
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")
        raise KernelUnavailable(
            f"attn=fa3: could not load {repo} ({pin_text}){' offline' if offline else ''}: "
            f"{type(e).__name__}: {e}; {fix}"
        ) from e
    if not hasattr(module, "flash_attn_func"):
        raise KernelUnavailable(f"attn=fa3: {repo} ({pin_text}) has no flash_attn_func; {fix}")
    return module


class FA3Attention(AttentionBackend):
    name = "fa3"
    capabilities = Capabilities(
        devices=("cuda",),
        min_capability=(8, 0),
        max_capability=(9, 0),
        precisions=("bf16", "fp8"),
        max_head_dim=256,
        why="FA3 builds exist for sm80 and sm90, bf16 only",
    )
    plain_softmax = True

    @classmethod
    def plan_options(cls, request, profile, precision, model):
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

    def __init__(
        self, repo: str, version: Any = None, revision: Any = None, module: Any = None, trust_remote_code: bool = False
    ):
        """module: an already-loaded kernel module (tests inject a reference implementation here).
        trust_remote_code: passed to kernels.get_kernel (see the module doc)."""
        self._fa3 = module if module is not None else load_fa3(repo, version, revision, trust_remote_code)
        pin = version if version is not None else revision
        self.kernel = f"fa3:{repo}@{pin}"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        check_shapes(q, k, v)
        # FA3 takes (B, T, H, D) and handles grouped K/V heads natively.
        out = self._fa3.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        if isinstance(out, tuple):  # some builds return (out, softmax_lse)
            out = out[0]
        return out.transpose(1, 2)
