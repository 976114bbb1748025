"""Which processes a run has, from the environment: torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK...), a
submitit job's own mapping of its tasks onto them, and the NCCL variables every rank sets before its process group
is made."""

from __future__ import annotations

import os

from speedrun.errors import ConfigError
from speedrun.plan.dist_choice import WorldInfo

NVLS_ENV = {
    False: {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"},
    True: {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"},
}
"""``dist.nvls``: NVLink multicast (NCCL's NVLS, torch's symmetric-memory multicast) off or on; null sets nothing,
leaving NCCL's and torch's defaults."""

DEFAULT_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
"""NCCL's watchdog tears the process down on a collective error or timeout (3, torch's default, spelt out): the
last line of defence when a rank hangs or dies without raising."""

RANK_DIR_ENV = "SPEEDRUN_RANK_DIR"
"""A rank > 0's private directory for Hydra's output and its own (discarded) records; see launch.worker_argv."""

LAUNCHED_ENV = "SPEEDRUN_LAUNCHED"
"""Set by `python -m run dist.nproc=N` for the ranks it starts (their launcher is "elastic", not "torchrun")."""


def nvls_env(nvls: bool | None) -> dict[str, str]:
    """The variables ``dist.nvls`` sets (none when null)."""
    return {} if nvls is None else dict(NVLS_ENV[bool(nvls)])


def set_process_env(environ: dict | None = None, nvls: bool | None = None) -> None:
    """NCCL's error handling on (unless set) and NVLink multicast as ``dist.nvls`` says (null: untouched) in
    ``environ`` (default: this process's, which the ranks it starts inherit)."""
    env = os.environ if environ is None else environ
    env.update(nvls_env(nvls))
    for key, value in DEFAULT_ENV.items():
        env.setdefault(key, value)


def submitit_rendezvous() -> dict[str, str] | None:
    """In a submitit job (SLURM, or submitit's local executor) of several tasks: the env:// variables that
    torch.distributed reads, from submitit's own mapping (helpers.TorchDistributedEnvironment): MASTER_ADDR = the
    job's first host, MASTER_PORT = from the job id (the same in every task), RANK = the task's global id,
    LOCAL_RANK = its id on its node. None outside such a job. A plain shell inside an allocation has SLURM_*
    variables too, so only a submitit job (SUBMITIT_EXECUTOR set) counts."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:
        return None
    env = TorchDistributedEnvironment()
    if env.world_size <= 1:
        return None
    return {
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
        "RANK": str(env.rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_RANK": str(env.local_rank),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
    }


def world_from_env(environ: dict | None = None, visible_gpus: int = 0) -> WorldInfo:
    """This process's place in a run, from torchrun's variables (after ``submitit_rendezvous`` set them)."""
    env = os.environ if environ is None else environ
    try:
        world_size = int(env.get("WORLD_SIZE") or 1)
        int(env.get("RANK") or 0)
    except ValueError:
        raise ConfigError(
            f"RANK={env.get('RANK')!r} WORLD_SIZE={env.get('WORLD_SIZE')!r} in the environment are not numbers; "
            "unset RANK and WORLD_SIZE (dist.nproc=N starts the ranks)"
        ) from None
    if "RANK" not in env or world_size <= 1:
        return WorldInfo(visible_gpus=visible_gpus)
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:  # torchrun, torch's elastic launch and submitit_rendezvous set all of them: these are left over
        raise ConfigError(
            f"RANK={env['RANK']} WORLD_SIZE={world_size} are set but {' and '.join(missing)} not, as a shell keeps "
            "them from an earlier job; unset RANK and WORLD_SIZE, or start the ranks with torchrun or dist.nproc=N"
        )
    launcher = "submitit" if env.get("SUBMITIT_EXECUTOR") else "elastic" if env.get(LAUNCHED_ENV) else "torchrun"
    return WorldInfo(
        launcher=launcher,
        rank=int(env["RANK"]),
        world_size=world_size,
        local_rank=int(env.get("LOCAL_RANK") or 0),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE") or world_size),
        visible_gpus=visible_gpus,
    )
