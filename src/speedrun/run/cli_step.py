"""`python -m run`'s own steps before a run starts (src/run.py calls them): the command line's keys and options
checked against the schema and conf/ (``unknown_override``), ``--plan`` (print the resolved Plan and exit), and the
check that the run dir can be made (``unwritable``), each answering with one line before Hydra would answer with a
traceback or write anything."""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import tempfile
import typing
from functools import cache
from pathlib import Path

from speedrun.config import CONF_DIR, Config, register_configs, to_config
from speedrun.config.choices import HardwareName
from speedrun.config.objective import objective_problem
from speedrun.distributed.environment import world_from_env
from speedrun.errors import ConfigError, PlanError, storage_problem
from speedrun.hardware import profiles as hardware
from speedrun.plan import choose_profile, plan_json, resolve
from speedrun.plan.dist_choice import WorldInfo
from speedrun.plan.model_choice import arch_from_argv, register_model_schema
from speedrun.plan.types import Plan
from speedrun.run import run_steps

# ---- unknown keys and options -----------------------------------------------------------------------------------------
# Overrides that name no key or no option, caught before Hydra composes: one line with the closest valid ones.
#
# Hydra answers a misspelt key (``budgett.train_seconds=10``) with advice to append it (``+budgett...``), which
# would only move the typo into the run; here the key is checked against the Config schema's field paths and a
# group's option against its files in conf/, and the message names the nearest ones (difflib) and the fix.


CONFIG_DIR_FLAGS = ("--config-dir", "-cd")
"""Hydra's flag that adds a config folder to the search path (its options are found beside conf/'s)."""

SWEEP_FUNCTIONS = ("range(", "choice(", "interval(", "glob(", "tag(", "sort(", "shuffle(")
"""Hydra's sweep syntax in a value: options it expands itself, not checked here."""


@cache
def key_paths() -> tuple[str, ...]:
    """Every settable key of the Config schema, dotted (budget.train_seconds, hardware.name, seed, ...)."""
    return tuple(_paths(Config, ""))


def _paths(schema: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(schema)
    out: list[str] = []
    for f in dataclasses.fields(schema):
        path = prefix + f.name
        out.append(path)
        nested = _dataclass_of(hints.get(f.name))
        if nested is not None:
            out.extend(_paths(nested, path + "."))
    return out


def _dataclass_of(hint: object) -> type | None:
    """The dataclass a field holds (through Optional), or None for a leaf (a number, a string, a dict, ...)."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    dataclasses_in = [a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return dataclasses_in[0] if len(dataclasses_in) == 1 else None


@cache
def group_options(extra: tuple[Path, ...] = ()) -> dict[str, tuple[str, ...]]:
    """Each config group in conf/ (hydra's own aside) and its options, the names of its YAML files, with those of
    the user's config folders ``extra`` (``--config-dir``) added."""
    found: dict[str, set[str]] = {}
    for root in (CONF_DIR, *extra):
        for d in sorted(root.iterdir()) if root.is_dir() else ():
            if d.is_dir() and d.name != "hydra":
                found.setdefault(d.name, set()).update(p.stem for p in d.glob("*.yaml"))
    return {group: tuple(sorted(options)) for group, options in sorted(found.items())}


def user_config_dirs(args: list[str]) -> tuple[Path, ...]:
    """The config folders ``args`` add to the search path, as Hydra reads them: ``--config-dir DIR`` (``-cd``,
    ``--config-dir=DIR``) and the file paths of a ``hydra.searchpath=[...]`` override."""
    dirs = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in CONFIG_DIR_FLAGS:
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            dirs.append(value)
        elif flag.lstrip("+") == "hydra.searchpath":
            entries = [e.strip().strip("'\"") for e in value.strip("[]").split(",")]
            dirs.extend(e.removeprefix("file://") for e in entries if e and not e.startswith("pkg://"))
    return tuple(Path(d).expanduser().resolve() for d in dirs if d)


def unknown_override(args: list[str], model_arch: str | None = None) -> str | None:
    """One line for the first override in ``args`` whose key or option does not exist, naming the closest valid
    ones and the fix; None when all exist. Flags, appends (+key), deletions (~key), hydra.* keys and, with a model
    of the user's own (``model_arch``), keys under model. are left to Hydra. A group's options include those of
    the config folders ``args`` add (user_config_dirs)."""
    groups = group_options(user_config_dirs(args))
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq or arg.startswith(("-", "+", "~")) or key.startswith("hydra") or "/" in key:
            continue
        if key in groups:
            problem = _unknown_option(key, value, groups[key])
        elif key.split(".")[0] == "model" and model_arch is not None:
            problem = None
        elif key == "objective" and not value.startswith(SWEEP_FUNCTIONS):
            problem = next(filter(None, map(objective_problem, value.split(","))), None)
        else:
            problem = _unknown_key(key, value)
        if problem is not None:
            return problem
    return None


def _unknown_option(group: str, value: str, options: tuple[str, ...]) -> str | None:
    if value.startswith(SWEEP_FUNCTIONS) or value in ("null", ""):
        return None
    for option in value.split(","):
        if option not in options:
            close = difflib.get_close_matches(option, options, n=3, cutoff=0.5)
            hint = f"did you mean {_either(close)}? fix: {group}={close[0]}" if close else "options:"
            return f"{group}={option} is no option of {group} ({', '.join(options)}); {hint}".removesuffix(" options:")
    return None


def _unknown_key(key: str, value: str) -> str | None:
    paths = key_paths()
    if key in paths or _under_leaf(key, paths):
        return None
    leaves = [p for p in paths if not any(q.startswith(p + ".") for q in paths)]
    close = difflib.get_close_matches(key, leaves, n=3, cutoff=0.6)
    if not close:
        return f"unknown key {key!r}; `python -m run --cfg job` lists every key"
    return f"unknown key {key!r}; did you mean {_either(close)}? fix: {close[0]}={value}"


def _under_leaf(key: str, paths: tuple[str, ...]) -> bool:
    """A key inside a field the schema leaves open (a dict): budget.x is unknown, a_dict_field.x is not."""
    parts = key.split(".")
    known = set(paths)
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head in known:
            return not any(p.startswith(head + ".") for p in paths)
    return False


def _either(names: list[str]) -> str:
    return " or ".join(names)


# ---- --plan -----------------------------------------------------------------------------------------------------------
# ``python -m run ... --plan``: resolve the composed config and print the Plan's summary (``--plan=json``: the
# whole Plan as plan.json would hold it), then exit. No run dir, no row, no data and no model: the way to check a
# recipe (what `auto` picks, the micro-batch, the kernels, the memory estimate) before spending GPU time on it.
#
# A hardware profile this machine lacks (hardware=t4 on a laptop, hardware=h100 on a T4) is resolved as if its card
# were present (speedrun.hardware.profiles.device_for), and the first line says so: the Plan, or the refusal, is the
# one that card would give.


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


# ---- the run dir can be made ------------------------------------------------------------------------------------------
# Before Hydra writes anything: the place a run's files go must take them.
#
# Hydra creates the run dir before speedrun's code runs, and reports a failure there as a traceback; a directory
# that cannot be written (read-only, full, another user's) is the machine's state, not a bug, so it gets one line.


DEFAULT_ROOT = "outputs"
"""Where conf/config.yaml puts run and sweep dirs unless hydra.run.dir / hydra.sweep.dir say otherwise."""


def output_root(argv: list[str]) -> Path:
    """The directory this command's run or sweep dir goes under: the parent of hydra.run.dir / hydra.sweep.dir
    when given, else outputs/ (both relative to the current directory)."""
    key = "hydra.sweep.dir=" if any(a in ("-m", "--multirun") for a in argv) else "hydra.run.dir="
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith(key)]
    return Path(given[-1]).expanduser().parent if given else Path(DEFAULT_ROOT)


def unwritable(argv: list[str]) -> str | None:
    """None when a directory can be made under the output root (made itself if missing), else the one line that
    says why not."""
    root = output_root(argv)
    try:
        root.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".speedrun-write-check-", dir=root))
    except OSError as e:
        return storage_problem(e) or f"cannot create the run's dir under {root}: {e}"
    return None
