"""How a step is split: tokens per step, the micro-batch (the kernel group's, the user's, the profile's or the
warm-up search's start) and the ranks' share, and the context stages' micro-batches."""

from __future__ import annotations

import dataclasses
from typing import Any

from speedrun.config import Config
from speedrun.core.model import ModelShape
from speedrun.errors import PlanError
from speedrun.hardware.profiles import HardwareProfile
from speedrun.plan.dist_choice import DistPlan, WorldInfo, check_step_split, resolve_dist
from speedrun.plan.kernel_choice import kernel_micro_batch, kernel_settings
from speedrun.plan.types import Stage


@dataclasses.dataclass(frozen=True)
class StepSplit:
    """How a step is split: what the resolver decides between the model's shape and the kernel settings."""

    tokens_per_step: int
    micro_batch: int
    grad_accum: int
    search: bool
    dist: DistPlan
    seq_len: int
    settings: Any
    """The kernel group's settings and where they came from (speedrun.plan.kernel_choice.kernel_settings)."""
    kernel_source: Any
    kernel_micro: int | None
    """The micro-batch the kernel group chose (None: none)."""

    @property
    def micro_steps(self) -> int:
        """Micro-batches per step (1 while the batch search decides it)."""
        return 1 if self.search else self.tokens_per_step // (self.micro_batch * self.seq_len)


def resolve_batch(
    cfg: Config,
    profile: HardwareProfile,
    model_name: str,
    model: ModelShape,
    world: WorldInfo | None,
    lengths: list[tuple[int, float]] | None,
) -> StepSplit:
    """Tokens per step, the micro-batch (the kernel group's, the user's or the profile's) and the ranks' split."""
    seq_len = model.seq_len
    tokens_per_step = cfg.budget.tokens_per_step or profile.tokens_per_step
    # the kernel group may choose the micro-batch (kernel.micro_batch, or a tuned table's): read it first
    settings, kernel_source = kernel_settings(cfg, profile, model_name)
    kernel_micro = kernel_micro_batch(cfg, settings)
    search = cfg.hardware.micro_batch == "auto"
    dist = resolve_dist(cfg.dist, world, profile.device_type)
    if search:  # each rank's share of the step: the search's candidates divide it (training.batch_search)
        micro_batch = start_micro_batch(profile, seq_len, tokens_per_step // dist.world_size)
    else:
        micro_batch = kernel_micro or cfg.hardware.micro_batch
        if micro_batch is None:  # nobody chose it: the profile's, fitted to the step, the ranks and the stages
            micro_batch = default_micro_batch(profile, seq_len, tokens_per_step, dist.world_size, lengths)
    # tokens_per_step is global: every rank runs grad_accum micro-batches of its own share of each step
    grad_accum = check_step_split(
        tokens_per_step, micro_batch, seq_len, dist.world_size, [length for length, _ in lengths or ()]
    )
    return StepSplit(
        tokens_per_step, micro_batch, grad_accum, search, dist, seq_len, settings, kernel_source, kernel_micro
    )


def start_micro_batch(profile: HardwareProfile, seq_len: int, tokens_per_step: int) -> int:
    """hardware.micro_batch=auto: the profile's default micro-batch, or the nearest smaller one that divides the
    sequences per step (``tokens_per_step``: one rank's share of it), as the plan's value until the warm-up search
    replaces it (and on CPU, where it does not run)."""
    sequences = max(1, tokens_per_step // seq_len)
    default = max(1, profile.micro_batch_tokens // seq_len)
    return max(d for d in range(1, min(default, sequences) + 1) if sequences % d == 0)


def default_micro_batch(
    profile: HardwareProfile,
    seq_len: int,
    tokens_per_step: int,
    world_size: int,
    lengths: list[tuple[int, float]] | None,
) -> int:
    """hardware.micro_batch left unset: the profile's micro-batch at ``seq_len`` (the longest length), or the
    largest smaller one whose tokens split ``tokens_per_step`` over ``world_size`` ranks and that every stage length
    divides. A default that stood in the way of dist.nproc would refuse a request the user never made; a
    micro-batch the user set is kept, and refused by the checks after this if it cannot split. Where none splits,
    the profile's, which those checks refuse naming what does."""
    default = max(1, profile.micro_batch_tokens // seq_len)

    def splits(batch: int) -> bool:
        tokens = batch * seq_len
        return tokens_per_step % (world_size * tokens) == 0 and all(tokens % length == 0 for length, _ in lengths or ())

    return next((b for b in range(default, 0, -1) if splits(b)), default)


def stages_of(lengths: list[tuple[int, float]], micro_tokens: int) -> tuple[Stage, ...]:
    bad = [length for length, _ in lengths if micro_tokens % length]
    if bad:
        raise PlanError(
            f"schedule.seq_len: lengths {bad} do not divide the micro-batch tokens ({micro_tokens} = "
            f"hardware.micro_batch x the longest length); tokens per micro-batch stay constant across stages, so "
            f"pick lengths that divide {micro_tokens} or change hardware.micro_batch"
        )
    return tuple(Stage(length, until, micro_tokens // length) for length, until in lengths)
