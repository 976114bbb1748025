"""``speedrun <command> ...`` (the console command pip installs) and ``python -m speedrun ...``: one name for the
project's commands, each handed its arguments unchanged. ``speedrun run ...`` is ``python -m run ...`` exactly (the
same module runs as __main__), so every flag, override and sweep works the same either way."""

from __future__ import annotations

import importlib
import importlib.util
import runpy
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf

from speedrun.paths import CONF_DIR, PACKAGE_DIR, REPO_ROOT

COMMANDS: dict[str, tuple[str, str]] = {
    "report": ("speedrun.report.cli", "main"),
    "export": ("speedrun.export.cli", "main"),
    "tune": ("speedrun.tune", "main"),
    "bench": ("speedrun.bench.__main__", "main"),
}
"""command -> (module, function taking the argument list and returning an exit status); ``run`` is apart."""


def usage() -> str:
    """``speedrun --help``: the header ``python -m run --help`` starts with (conf/config.yaml's hydra.help.header,
    one text for both), after the line naming the commands."""
    header = str(OmegaConf.load(CONF_DIR / "config.yaml").hydra.help.header)
    return f"usage: speedrun {{run,report,export,tune,bench}} [arguments ...]   (python -m speedrun: the same)\n\n{header}\n"


HYDRA_HELP = """\
Hydra {hydra}, as speedrun's `python -m run` (and `speedrun run`) uses it; more at https://hydra.cc

flags:
  --help, -h              speedrun's help: its flags, commands, examples and config groups
  --hydra-help            this page
  --version               speedrun's version and Hydra's
  --cfg, -c job|hydra|all show the composed config instead of running
  --resolve               with --cfg: resolve the config's interpolations before printing it
  --package, -p PKG       with --cfg: only this package of the config
  --multirun, -m          a sweep: every combination, with the configured launcher and sweeper
  --config-dir, -cd DIR   add a folder of your own configs (DIR/experiment/mine.yaml composes as experiment=mine)
  --info, -i [all|config|defaults|defaults-tree|plugins|searchpath]   what Hydra composed and from where

Hydra's own groups, chosen as hydra/<group>=<option> on the command line:
  hydra/launcher          pool (the default: the local GPU pool), basic (jobs in this process), slurm, slurm_local
  hydra/sweeper           speedrun (the default: resume, fail-fast), optuna (adaptive: pip install -e '.[optuna]'), basic

Not offered: Hydra's shell completion (-sc), whose script completes `python <file>.py` command lines only.
"""
"""``python -m run --hydra-help``: Hydra's page of flags, less the shell completion it would advertise."""


def _hydra_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hydra-core")
    except PackageNotFoundError:  # a copy of the source without an installed Hydra
        return "not installed"


def hydra_help() -> str:
    return HYDRA_HELP.format(hydra=_hydra_version())


def version_line() -> str:
    """``speedrun --version`` and ``python -m run --version``: speedrun's version, then Hydra's (the composer)."""
    from speedrun.version import __version__

    return f"speedrun {__version__} (Hydra {_hydra_version()})"


def main(argv: list[str] | None = None) -> int:
    """Hand ``argv`` (the process's arguments by default) to the named command; its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(version_line())
        return 0
    command, rest = args[0], args[1:]
    if command == "run":
        return run(rest)
    if command not in COMMANDS:
        print(f"error: speedrun has no command {command!r}; use one of run, {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if command == "bench" and REPO_ROOT is None:
        print(
            "error: speedrun bench runs from a checkout of the repository (it runs scripts/ and writes "
            "docs/benchmarks.md): clone it and `pip install -e .` there",
            file=sys.stderr,
        )
        return 2
    module, name = COMMANDS[command]
    # a command's modules are imported only when it runs: `speedrun run` need not load the report's
    entry: Callable[[list[str]], int] = getattr(importlib.import_module(module), name)
    return int(entry(rest) or 0)


def run(args: list[str]) -> int:
    """``python -m run`` with ``args``: run.py runs as __main__ under its module name, as ``-m`` runs it, so a
    multi-GPU run starts its ranks the same way and a sweep's jobs are ``python -m run`` processes."""
    spec = importlib.util.find_spec("run")
    ours = PACKAGE_DIR.parent / "run.py"
    if spec is None or spec.origin is None or Path(spec.origin).resolve() != ours:
        found = spec.origin if spec is not None else None
        print(
            f"error: the module `run` found is {found}, not speedrun's {ours}: a run.py in the current folder or on "
            "PYTHONPATH hides it; rename that file or start from another folder",
            file=sys.stderr,
        )
        return 2
    sys.argv = [spec.origin, *args]
    runpy.run_module("run", run_name="__main__", alter_sys=True)  # its refusals and failures exit with their status
    return 0
