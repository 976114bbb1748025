"""The two-rank harness: a function run on two gloo ranks on this CPU (each a process of its own, with torchrun's
environment), which a test then compares with one process; and the tiny run those tests resolve."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

RANK_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "speedrun.run.runner", "speedrun.run.build"]
"""What the ranks of start_ranks find already imported: torch (~1.3 s of CPU), dynamo (~1.2 s; torch.optim imports
it when an optimizer is built) and speedrun's run and training code."""

STEPS = 4
"""Training steps of TINY_RUN."""

TINY_RUN = [
    "hardware=cpu",
    "model=tiny",
    "model.n_layer=2",
    "model.d_model=32",
    "model.n_head=2",
    "model.n_kv_head=1",
    "model.seq_len=32",
    "hardware.micro_batch=2",
    "budget.tokens_per_step=256",
    f"budget.max_steps={STEPS}",
    "budget.warmup_steps=0",
    "optim.grad_clip=1.0",
    "optim.muon_momentum_warmup_steps=0",
]
"""The run the two-rank tests train: 4 steps of 256 tokens, 4 micro-batches of 2 x 32 on one process (2 a rank on
two ranks: the same tokens each step)."""


def plan_for(compose, *overrides, world=None, device="cpu"):
    """The Plan of ``overrides`` on a fake ``device``, as the ranks of ``world`` (a WorldInfo; None: one process)."""
    from speedrun.config import to_config
    from speedrun.plan import resolve
    from support.devices import fake_device

    return resolve(to_config(compose(list(overrides))), fake_device(device), world=world)


def start_ranks(fn, args: tuple, nprocs: int = 2) -> None:
    """fn(rank, *args) on ``nprocs`` processes, waited for; an exception in a rank fails the call (torch's
    start_processes). Each rank is a fresh process, forked from multiprocessing's fork server, which imported
    RANK_PRELOAD once for this xdist worker: a spawned interpreter would import them again for every rank. The server
    starts at the first call, from this process as it is then; a rank gets its sys.path and working dir from the
    caller (as a spawned one does) and sets its own rendezvous variables (torchrun_env)."""
    import multiprocessing

    import torch.multiprocessing

    multiprocessing.set_forkserver_preload(RANK_PRELOAD)  # read when the server starts: the first call
    torch.multiprocessing.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def free_port() -> int:
    """A TCP port free on this machine now, for the ranks' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env(rank: int, port: int, world_size: int = 2) -> None:
    """The variables torchrun gives rank ``rank`` of ``world_size`` on one machine (env:// rendezvous at ``port``)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )


def on_ranks(body, *args: Any, out_dir: Path, plan: Any = None, join: bool = True, nprocs: int = 2) -> list[Any]:
    """``body(rank, world, *args)`` on ``nprocs`` gloo ranks (torchrun's environment, one torch thread each); returns
    what each rank's body returned, by rank (through torch.save files in ``out_dir``).

    The rank's World (speedrun.distributed.world.current()) joins the process group before the body runs and leaves
    it after: with ``plan``, as a run's ranks do (World.init and its failure guard, then World.shutdown); without,
    a bare gloo group (left after a barrier). ``join=False``: the body joins on its own (a whole job, as run_job
    does) and is given world None. ``body`` is a module-level function (the ranks import it by name)."""
    start_ranks(_rank, (free_port(), nprocs, body, args, plan, join, str(out_dir)), nprocs=nprocs)
    import torch

    return [torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=False) for rank in range(nprocs)]


def _rank(rank: int, port: int, nprocs: int, body, args: tuple, plan: Any, join: bool, out_dir: str) -> None:
    torchrun_env(rank, port, nprocs)
    import torch

    torch.set_num_threads(1)
    world = None
    if join:
        from speedrun.distributed import world as dist

        world = dist.current()
        if plan is not None:
            world.init(plan)
        else:
            torch.distributed.init_process_group("gloo")
    out = body(rank, world, *args)
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    if world is None:
        return
    if plan is not None:
        world.shutdown(clean=True)
    else:
        torch.distributed.barrier()  # both ranks done before either tears gloo down (one leaving early can abort its peer)
        torch.distributed.destroy_process_group()
