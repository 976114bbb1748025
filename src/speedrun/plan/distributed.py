"""The ``dist`` part of the resolver: how many ranks, on how many nodes, started by whom, and how a step's
tokens split over them. Torch-free: ``WorldInfo`` is what speedrun.distributed.world read from the environment."""

from __future__ import annotations

from dataclasses import dataclass

from speedrun.config import DistConfig
from speedrun.errors import PlanError


@dataclass(frozen=True)
class WorldInfo:
    """This process's place among the processes of a run, as its environment tells (speedrun.distributed.world.current)."""

    launcher: str = "none"
    """How the ranks were started: none (this process is the whole run, or will start the ranks itself),
    torchrun (RANK, WORLD_SIZE, LOCAL_RANK... set by torchrun or another elastic launch), elastic (the same,
    started by `python -m run dist.nproc=N`) or submitit (a SLURM or submitit-local job with several tasks)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    visible_gpus: int = 0
    """CUDA devices this process can see."""

    @property
    def started(self) -> bool:
        """True in a rank that a launcher started (the world exists already)."""
        return self.launcher != "none"


@dataclass(frozen=True)
class DistPlan:
    world_size: int = 1
    nodes: int = 1
    nproc: int = 1
    """Ranks per node (one GPU each on CUDA)."""
    backend: str = "none"
    """nccl, gloo, or none for a single process."""
    launch: str = "single"
    """single (one process), self (this `python -m run` starts the ranks with torch's elastic launch), or who
    started this rank: elastic (such a `python -m run`), torchrun, submitit."""
    timeout_s: float = 600.0
    nvls: bool | None = None
    """NVLink multicast: null leaves NCCL's default, false/true set it off/on in every rank (speedrun.distributed.environment.nvls_env)."""


def resolve_dist(cfg: DistConfig, world: WorldInfo | None, device_type: str) -> DistPlan:
    """The requested ``dist`` against the processes that exist or will be started; PlanError when it cannot run."""
    # None (tests, tools): this process alone, on the device detected (one GPU on CUDA)
    world = world or WorldInfo(visible_gpus=1 if device_type == "cuda" else 0)
    if world.started:
        nproc = world.local_world_size
        nodes = max(1, world.world_size // nproc)
        for key, asked, got in (("nproc", cfg.nproc, nproc), ("nodes", cfg.nodes, nodes)):
            if asked != 1 and asked != got:
                raise PlanError(
                    f"dist.{key}={asked}, but {world.launcher} started {got} (ranks per node: {nproc}, "
                    f"world size {world.world_size}); drop dist.{key} or make the two agree"
                )
        launch = world.launcher
    else:
        nproc, nodes = cfg.nproc, cfg.nodes
        if nodes > 1:
            raise PlanError(
                f"dist.nodes={nodes}: ranks on several machines are started by a cluster launcher; use "
                f"`python -m run -m hydra/launcher=slurm dist.nodes={nodes} dist.nproc={nproc}` or "
                f"torchrun on every node (README, 'Many GPUs'), or dist.nodes=1"
            )
        launch = "self" if nproc > 1 else "single"
    world_size = nproc * nodes
    if device_type == "cuda":
        # Each rank drives one GPU of its node: local rank i uses cuda:i.
        needed = world.local_rank + 1 if world.started else nproc
        if needed > world.visible_gpus:
            raise PlanError(
                f"dist.nproc={nproc} needs {nproc} GPUs on this node, {world.visible_gpus} visible "
                f"(CUDA_VISIBLE_DEVICES); use dist.nproc={max(1, world.visible_gpus)} or fewer"
            )
    backend = str(cfg.backend)
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl" and device_type != "cuda":
        raise PlanError("dist.backend=nccl needs CUDA GPUs; on CPU use dist.backend=gloo (or auto)")
    return DistPlan(
        world_size=world_size,
        nodes=nodes,
        nproc=nproc,
        backend=backend if world_size > 1 else "none",
        launch=launch,
        timeout_s=float(cfg.timeout_s),
        nvls=cfg.nvls,
    )


def check_step_split(
    tokens_per_step: int, micro_batch: int, seq_len: int, world_size: int, lengths: list[int] | tuple[int, ...] = ()
) -> int:
    """Gradient accumulation per rank: tokens_per_step (global) = world_size x micro-batch tokens x accumulation.
    lengths: a progressive schedule's, which the micro-batch tokens of a micro-batch the message offers must hold
    (speedrun.plan._stages)."""
    micro_tokens = micro_batch * seq_len
    if world_size == 1 and tokens_per_step % micro_tokens:
        raise PlanError(
            f"budget.tokens_per_step={tokens_per_step} is not a multiple of micro-batch tokens "
            f"({micro_batch} seqs x {seq_len} = {micro_tokens}); set budget.tokens_per_step to a multiple of "
            f"{micro_tokens} or change hardware.micro_batch"
        )
    split = world_size * micro_tokens
    if tokens_per_step % split:
        lower = tokens_per_step // split * split
        steps = " or ".join(str(t) for t in (lower, lower + split) if t > 0)
        smaller = next(
            (
                b
                for b in range(micro_batch - 1, 0, -1)
                if tokens_per_step % (world_size * b * seq_len) == 0 and all(b * seq_len % n == 0 for n in lengths)
            ),
            None,
        )
        raise PlanError(
            f"budget.tokens_per_step={tokens_per_step} does not split over {world_size} ranks x micro-batch tokens "
            f"({micro_batch} seqs x {seq_len} = {micro_tokens}): it must be a multiple of {split}; set "
            f"budget.tokens_per_step={steps}"
            + (f", or hardware.micro_batch={smaller}" if smaller else "")
            + ", or change dist.nproc"
        )
    return tokens_per_step // split
