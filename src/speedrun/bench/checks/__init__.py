"""Every declared check, by name. A module per theme; each exports CHECKS, and the order here is the order of
``--list`` and of docs/benchmarks.md."""

from __future__ import annotations

from speedrun.bench.checks import cpu, kernels, multi_gpu, peers, quickstart, record, target
from speedrun.bench.spec import Check

ALL: tuple[Check, ...] = (
    *quickstart.CHECKS,
    *cpu.CHECKS,
    *peers.CHECKS,
    *kernels.CHECKS,
    *multi_gpu.CHECKS,
    *record.CHECKS,
    *target.CHECKS,
)
CHECKS: dict[str, Check] = {c.name: c for c in ALL}
if len(CHECKS) != len(ALL):
    raise ValueError(f"two checks share a name: {sorted(c.name for c in ALL)}")
