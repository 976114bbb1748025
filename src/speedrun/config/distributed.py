"""Schema of the ``dist`` group: one run on several processes (one GPU each), on one node or several."""

from __future__ import annotations

from dataclasses import dataclass

from speedrun.config.choices import Choice, _require


class DistBackend(Choice):
    auto = "auto"
    nccl = "nccl"
    gloo = "gloo"


@dataclass
class DistConfig:
    name: str = "default"
    """The option (conf/dist/default.yaml: one process unless dist.nproc says otherwise)."""
    nproc: int = 1
    """Processes per node, one GPU each. Above 1, `python -m run` starts them itself (torch's elastic launch);
    under torchrun or a SLURM job the launcher's count is used, and a different value here is refused."""
    nodes: int = 1
    """Nodes. Above 1 the ranks must be started by a cluster launcher: hydra/launcher=slurm (one SLURM task per
    rank) or torchrun on every node."""
    backend: DistBackend = DistBackend.auto
    """Collectives: auto = nccl on GPUs, gloo on CPU."""
    timeout_s: float = 600.0
    """Longest a collective may wait for the other ranks (process-group timeout). A rank that raises ends the
    others within seconds (they watch for it); this bounds the rest: a rank that hangs or dies silently. It must
    cover the slowest rank-0-only phase (GPTQ export) and compile-time skew between ranks."""
    nvls: bool | None = None
    """NVLink multicast (NCCL's NVLS algorithms and torch's symmetric-memory multicast). null leaves NCCL's and
    torch's defaults (and any NCCL_NVLS_ENABLE you set); false sets NCCL_NVLS_ENABLE=0 and
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 in every rank; true sets NCCL_NVLS_ENABLE=1 and
    TORCH_SYMM_MEM_DISABLE_MULTICAST=0. Turn it off on machines whose NVLink multicast is unavailable or
    unreliable."""

    def __post_init__(self) -> None:
        _require(self.nproc >= 1, f"dist.nproc={self.nproc} must be >= 1")
        _require(self.nodes >= 1, f"dist.nodes={self.nodes} must be >= 1")
        _require(self.timeout_s > 0, f"dist.timeout_s={self.timeout_s} must be > 0")
