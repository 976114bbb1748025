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


def main(argv: list[str] | None = None) -> int:
    """Hand ``argv`` (the process's arguments by default) to the named command; its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0 if args else 2
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
