"""``python -m run ... --plan``: resolve the composed config and print the Plan's summary (``--plan=json``: the
whole Plan as plan.json would hold it), then exit. No run dir, no row, no data and no model: the way to check a
recipe (what `auto` picks, the micro-batch, the kernels, the memory estimate) before spending GPU time on it.

A hardware profile this machine lacks (hardware=t4 on a laptop, hardware=h100 on a T4) is resolved as if its card
were present (speedrun.hardware.profiles.device_for), and the first line says so: the Plan, or the refusal, is the
one that card would give."""

from __future__ import annotations

import sys
from pathlib import Path

from speedrun.config import CONF_DIR, Config, register_configs, to_config
from speedrun.config.choices import HardwareName
from speedrun.config.did_you_mean import CONFIG_DIR_FLAGS, unknown_override
from speedrun.distributed.environment import world_from_env
from speedrun.errors import ConfigError, PlanError
from speedrun.hardware import profiles as hardware
from speedrun.plan import choose_profile, plan_json, resolve
from speedrun.plan.dist_choice import WorldInfo
from speedrun.plan.model_choice import arch_from_argv, register_model_schema
from speedrun.plan.types import Plan
from speedrun.run import run_steps

FLAG = "--plan"
FORMATS = ("summary", "json")
"""What ``--plan=<format>`` prints: Plan.describe()'s summary (the default, ``--plan`` alone) or the whole Plan."""


def wants_plan(argv: list[str]) -> bool:
    return any(a == FLAG or a.startswith(FLAG + "=") for a in argv[1:])


def print_plan(argv: list[str]) -> int:
    """Compose ``argv``'s overrides with Hydra's compose API (so Hydra writes nothing), resolve, print; the exit
    status: 0, or 1 with one line naming the problem."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    formats = [a.partition("=")[2] or "summary" for a in argv[1:] if a == FLAG or a.startswith(FLAG + "=")]
    args, searchpath = _config_dirs_as_override([a for a in argv[1:] if not (a == FLAG or a.startswith(FLAG + "="))])
    flags = [a for a in args if a.startswith("-")]
    if flags:
        return _refuse(f"--plan takes overrides only (group=option, key=value), not {' '.join(flags)}")
    if any(f not in FORMATS for f in formats):
        return _refuse(f"--plan={formats[-1]}: use --plan (a summary) or --plan=json (the whole Plan)")
    arch = arch_from_argv(argv)
    problem = unknown_override(args + searchpath, model_arch=arch)
    if problem is not None:
        return _refuse(problem)
    register_configs()
    register_model_schema(arch)  # a model's own knobs, as `python -m run` composes them
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = to_config(compose(config_name="config", overrides=args + searchpath))
        device, note = _device_for(cfg)
        if note is not None:  # on stderr where stdout must stay JSON
            print(note, file=sys.stderr if formats[-1] == "json" else sys.stdout, flush=True)
        plan = resolve(cfg, device, cwd=Path.cwd(), world=_world(absent_card=note is not None))
    except (ConfigError, HydraException, OmegaConfBaseException) as e:
        return _refuse(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    print(plan_json(plan) if formats[-1] == "json" else plan.describe())
    for line in step_warnings(plan):  # on stderr where stdout must stay JSON
        print(line, file=sys.stderr if formats[-1] == "json" else sys.stdout)
    return 0


def step_warnings(plan: Plan) -> list[str]:
    """The run's warnings for step-counted settings longer than the run (speedrun.run.run_steps), where the plan
    alone fixes its steps (a step or token budget), so they come before any GPU time. A time budget's steps are
    projected from warm-up's step times: the run says them then."""
    run = run_steps.known_steps(plan)
    return run_steps.resolve(plan, run)[1] if run is not None else []


def _config_dirs_as_override(args: list[str]) -> tuple[list[str], list[str]]:
    """(``args`` without ``--config-dir DIR`` flags, the hydra.searchpath override that adds those folders), since
    Hydra's compose API takes overrides, not its command line's flags."""
    rest, dirs, skip = [], [], False
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if skip:
            skip = False
        elif flag in CONFIG_DIR_FLAGS:
            dirs.append(value if eq else (args[i + 1] if i + 1 < len(args) else ""))
            skip = not eq
        else:
            rest.append(arg)
    paths = [f"file://{Path(d).expanduser().resolve()}" for d in dirs if d]
    return rest, ([f"hydra.searchpath=[{','.join(paths)}]"] if paths else [])


def _device_for(cfg: Config) -> tuple[hardware.DetectedDevice, str | None]:
    """This machine's device, or, where it cannot serve the requested profile (no GPU, or a smaller one), that
    profile's card as if it were present, with the line that says so."""
    detected = hardware.detect()
    requested = cfg.hardware.name
    if requested in (HardwareName.auto, HardwareName.cpu):
        return detected, None
    try:
        choose_profile(str(requested), detected)
    except PlanError:
        device = hardware.device_for(str(requested))
        note = (
            f"note: resolved for hardware={requested} as if a {device.name} were here; this machine "
            f"({detected.name}) lacks it, and a run here would be refused"
        )
        return device, note
    return detected, None


def _world(absent_card: bool = False) -> WorldInfo:
    """The world as this process's environment describes it (under torchrun, its WORLD_SIZE), without binding a
    GPU or joining a process group as a run's rank does. For a card this machine lacks: one of it (at least)."""
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return world_from_env(visible_gpus=max(visible, 1) if absent_card else visible)


def _refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1
