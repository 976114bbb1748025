"""``python -m run ... --plan``: resolve the composed config on this machine and print the Plan as plan.json would
hold it, then exit. No run dir, no row, no data and no model: the way to check a recipe where it will run (what
`auto` picks, the micro-batch, the kernels, the memory estimate) before spending GPU time on it."""

from __future__ import annotations

import sys
from pathlib import Path

from speedrun.config import CONF_DIR, register_configs, to_config
from speedrun.distributed.environment import world_from_env
from speedrun.errors import ConfigError
from speedrun.hardware import profiles as hardware
from speedrun.model.registry import arch_from_argv, register_model_schema
from speedrun.plan import plan_json, resolve
from speedrun.plan.distributed import WorldInfo

FLAG = "--plan"


def wants_plan(argv: list[str]) -> bool:
    return FLAG in argv[1:]


def print_plan(argv: list[str]) -> int:
    """Compose ``argv``'s overrides with Hydra's compose API (so Hydra writes nothing), resolve, print; the exit
    status: 0, or 1 with one line naming the problem."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = [a for a in argv[1:] if a != FLAG]
    flags = [a for a in args if a.startswith("-")]
    if flags:
        return _refuse(f"--plan takes overrides only (group=option, key=value), not {' '.join(flags)}")
    register_configs()
    register_model_schema(arch_from_argv(argv))  # a model's own knobs, as `python -m run` composes them
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=args)
        plan = resolve(to_config(cfg), hardware.detect(), cwd=Path.cwd(), world=_world())
    except (ConfigError, HydraException, OmegaConfBaseException) as e:
        return _refuse(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    print(plan_json(plan))
    return 0


def _world() -> WorldInfo:
    """The world as this process's environment describes it (under torchrun, its WORLD_SIZE), without binding a
    GPU or joining a process group as a run's rank does."""
    import torch

    return world_from_env(visible_gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)


def _refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1
