"""The shell's side of a run on several processes: which processes exist (``current``, from the environment), the
failure guard, the ranks' record, their directories and logs, and leaving the process group. The collectives are
speedrun.core.dist's ``World``, which ``RunWorld`` extends.

Which processes exist is read from the environment (with speedrun.distributed.environment): torchrun / torch's
elastic launch set RANK, WORLD_SIZE, LOCAL_RANK...; a submitit (SLURM) job of several tasks gets the same variables
from submitit's own mapping of its job environment. Failures are the guard's (speedrun.distributed.guard).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from speedrun.core.dist import World
from speedrun.distributed.environment import RANK_DIR_ENV, set_process_env, submitit_rendezvous, world_from_env
from speedrun.distributed.guard import Guard
from speedrun.plan import Plan
from speedrun.plan.dist_choice import WorldInfo
from speedrun.records.identity import gpu_uuid

log = logging.getLogger("speedrun")


def current() -> RunWorld:
    """This process's World, from its environment. A rank binds its GPU (cuda:LOCAL_RANK) here, before anything
    touches CUDA, so that ``detect()`` and every later allocation land on it."""
    import torch

    mapping = submitit_rendezvous()
    if mapping:
        os.environ.update(mapping)
    info = world_from_env(visible_gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if info.started:
        set_process_env()
        if info.visible_gpus > info.local_rank:
            torch.cuda.set_device(info.local_rank)
    return RunWorld(info)


class RunWorld(World):
    """A run's World as ``python -m run`` holds it: the collectives, plus where the ranks came from (``info``), the
    failure guard and what rank 0 records about them."""

    def __init__(self, info: WorldInfo):
        super().__init__(info.rank, info.world_size, info.local_rank)
        self.info = info
        self.on_stop: Callable[[str, str, str], None] | None = None
        """Rank 0: called from the guard's thread with (status, error, traceback) when a peer failed or a stop
        signal came, so the run's row is closed even if this process is killed before it can finish."""
        self._private_dir: str | None = None

    def init(self, plan: Plan) -> None:
        """Join the run's process group (NCCL on GPUs, gloo on CPU) and start the failure guard."""
        if self.single:
            return
        # before NCCL reads its environment (a rank started by torchrun or SLURM has not seen dist.nvls yet)
        set_process_env(nvls=plan.dist.nvls)
        self.join(plan.dist.backend, plan.dist.timeout_s)
        self.guard = Guard(self, nccl=plan.dist.backend == "nccl")
        self.guard.start()

    def describe(self, device_name: str) -> dict[str, Any]:
        """What the record says about the ranks: world_size, nodes, and each rank's host and device (its own GPU,
        cuda:LOCAL_RANK, by name and UUID; ``device_name`` is what the resolver saw, device 0, and names a CPU)."""
        if self.single:
            return {"world_size": 1, "nodes": 1}
        import torch

        uuid = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device_name = torch.cuda.get_device_name(torch.cuda.current_device())
            uuid = gpu_uuid()
        ranks = self.gather({"host": socket.gethostname(), "device": device_name, "uuid": uuid})
        return {
            "world_size": self.world_size,
            "nodes": len({r["host"] for r in ranks}),
            "gpu_names": [r["device"] for r in ranks],
            "gpu_uuids": [r["uuid"] for r in ranks],
            "hosts": sorted({r["host"] for r in ranks}),
        }

    def private_dir(self) -> str:
        """A rank > 0's own directory (its Hydra output dir when launch.worker_argv made one), removed at exit:
        the ranks share rank 0's run dir and row, and only rank 0 writes them."""
        if self._private_dir is None:
            self._private_dir = os.environ.get(RANK_DIR_ENV) or tempfile.mkdtemp(prefix=f"speedrun-rank{self.rank}-")
            atexit.register(shutil.rmtree, self._private_dir, True)
        return self._private_dir

    def quiet(self) -> None:
        """Ranks > 0 log warnings and errors only, to the console (rank 0 writes run.log)."""
        if self.rank == 0:
            return
        logging.getLogger("speedrun").setLevel(logging.WARNING)
        root = logging.getLogger()
        for handler in list(root.handlers):
            if isinstance(handler, logging.FileHandler):
                root.removeHandler(handler)
                handler.close()

    def settle(self, result: dict[str, Any], exc: BaseException, run_dir: Any) -> None:
        """After an exception: name the rank that failed first (a peer's error outranks the collective error or
        the SIGTERM its failure caused here), call a stop signal an interrupt, and publish this rank's own
        failure so that the other ranks stop within seconds."""
        if self.guard is None:
            return
        self.guard.settle(result, exc, run_dir)

    def shutdown(self, clean: bool) -> None:
        """Leave the process group: destroyed after a run every rank finished, aborted (NCCL) otherwise so that
        no collective can hold the process at exit."""
        if self.guard is None:
            return
        self.guard.stop()
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        try:
            if clean:
                # Every rank passes this barrier before any tears its connections down: a gloo rank that leaves
                # while its peer is still closing can abort in gloo's teardown (seen on CI, rarely). A bounded
                # barrier (gloo's monitored one) so that a peer that died after the last step cannot hold us.
                dist.monitored_barrier(group=self.ctrl, timeout=timedelta(seconds=60))
                dist.destroy_process_group()
            else:
                self.guard.abort()
        except Exception as e:  # noqa: BLE001 - the run is recorded already; leaving the group is best effort
            log.warning("rank %d: leaving the process group: %s: %s", self.rank, type(e).__name__, e)


class NoRecords:
    """The results database of ranks > 0: they record nothing (rank 0 writes the run's row)."""

    path = None

    def upsert(self, run_id: str, row: dict[str, Any]) -> None:
        pass

    def rows(self, *args: Any) -> list:
        return []

    def mark_lost(self) -> list[str]:
        return []


SINGLE_RUN = RunWorld(WorldInfo())
"""The world of a one-process ``python -m run`` (a JobRecord's default)."""
