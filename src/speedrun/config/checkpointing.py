"""Schema of the loop's keeping: checkpoints during training and what a resumed run reads.

Checkpoints hold everything the loop needs to continue bit for bit (model, optimizers, GradScaler, data position,
RNG states, schedule progress and the elapsed budget); speedrun.run.checkpoint writes and reads them, and
speedrun.run.resume turns ``resume=<run dir>`` into the run's own config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speedrun.config.choices import _require


@dataclass
class CheckpointConfig:
    every_seconds: float | None = None
    """Write a checkpoint every this many wall-clock seconds of training (None: off). Wall clock, not train
    seconds: what a preemption or a time limit takes away is wall time."""
    every_steps: int | None = None
    """Write a checkpoint every this many optimizer steps (None: off); exact and card-independent."""
    keep: int = 2
    """Checkpoints kept in <run dir>/checkpoints/ (the oldest are deleted after a newer one is complete)."""
    on_signal: bool = True
    """SIGTERM, Ctrl-C or a SLURM preemption signal during training write a checkpoint at the end of the current
    step before the run stops (a second signal stops at once). On several ranks a signal that reaches any rank
    stops every rank at the same step, after one checkpoint (rank 0's file)."""
    auto_resume: bool = True
    """A job that starts in a run dir already holding a checkpoint of the same config (a SLURM job requeued into
    its sweep dir) resumes from it instead of starting over."""

    def __post_init__(self) -> None:
        _require(
            self.every_seconds is None or self.every_seconds > 0,
            f"checkpoint.every_seconds={self.every_seconds} must be > 0 (or null: off)",
        )
        _require(
            self.every_steps is None or self.every_steps >= 1,
            f"checkpoint.every_steps={self.every_steps} must be >= 1 (or null: off)",
        )
        _require(self.keep >= 1, f"checkpoint.keep={self.keep} must be >= 1")

    @property
    def periodic(self) -> bool:
        return self.every_seconds is not None or self.every_steps is not None


def parse_batch(value: Any, key: str) -> int | str | None:
    """A batch-size field that takes an int >= 1, "auto" (searched on the device during warm-up) or null.

    The field is typed Any in the schema: OmegaConf has no int-or-str union, and a str field would turn every
    ``hardware.micro_batch=8`` into "8" for whoever reads the config."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return "auto"
        try:
            value = int(value)
        except ValueError:
            value = None
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    _require(
        ok,
        f"{key} must be an integer >= 1, auto (the largest that fits, found during warm-up) or null "
        f"(the profile's default)",
    )
    return value
