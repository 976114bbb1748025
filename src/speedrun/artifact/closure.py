"""What a run's self-extracting train_gpt.py carries: the import closure of its re-run, computed from the source and
the run's Plan, never listed by hand.

The walk starts at the file's entry point (speedrun.rerun) and follows every ``import`` of a speedrun module, at a
module's top or inside a function (a re-run may call it), but not those under ``if TYPE_CHECKING:``. It does not
follow an import into a SELECTED module: those are the modules a run reaches only when its Plan chooses them (the
attention backend, test-time training, GPTQ and its levers, a data source, a launcher), each with the Plan's test
beside it. The model class, which speedrun.plan.model_choice imports by name (speedrun.core.model.BUILTIN), is a root of the walk beside the entry
point. A selected module is packed, and walked from, when the test holds for the run's Plan. The code imports a
selected module only inside the function that needs it, under the same choice, so a module the file leaves out is
never imported; tests/artifact/test_closure.py runs an exported file with only its own modules importable.

A module added to the path is packed as soon as an import reaches it; a new choice-dependent module joins SELECTED.
"""

from __future__ import annotations

import ast
import functools
import json
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from speedrun.plan.types import Plan

from speedrun.core.model import BUILTIN

SRC = Path(__file__).resolve().parents[2]
"""src/: the packed files are src/<module path>."""

ENTRY = "speedrun.rerun"
"""The self-extracting file's entry point."""


PlanView = Union["Plan", types.SimpleNamespace]
"""A Plan, or a run dir's plan.json read as its attributes (recorded_plan): what SELECTED's tests read."""


def _ttt(plan: PlanView) -> bool:
    return str(plan.ttt.name) != "off"


SELECTED: dict[str, Callable[[PlanView], bool]] = {
    **{f"speedrun.core.ttt_{m}": _ttt for m in ("lora", "docs", "global", "graphs", "scorers", "score")},
    "speedrun.run.finish_ttt": _ttt,
    "speedrun.distributed.launch": lambda plan: plan.dist.launch == "self",  # torchrun's ranks need no launcher
    "speedrun.kernels.tuned": lambda plan: plan.kernel.source.startswith("tuned"),
    "speedrun.kernels.profile": lambda plan: plan.kernel.profile,
    "speedrun.run.wandb_logger": lambda plan: str(plan.logger.name) == "wandb",
    "speedrun.artifact.raw_rule": lambda plan: str(plan.artifact.code_rule) == "raw",
    "speedrun.kernels.tiles": lambda plan: plan.attn == "flex",
    "speedrun.run.track_verdict": lambda plan: plan.track.name is not None,
    "speedrun.run.batch_search": lambda plan: plan.micro_batch_search or plan.eval.batch_search,
    "speedrun.hardware.threads": lambda plan: plan.device == "cpu",
    # a re-run always names its data (speedrun.rerun.rerun_data), and starts a fresh run dir that resumes nothing
    "speedrun.data.prepare": lambda plan: False,
    "speedrun.run.resume": lambda plan: False,
    # a re-run counts the file that ran (artifact.code_file): it makes none, so minifies nothing
    "speedrun.artifact.wrap": lambda plan: False,
    "speedrun.artifact.minify": lambda plan: False,
}
"""A module (and the package under it) a run reaches only when its Plan chooses it -> that choice."""


def selected_key(module: str) -> str | None:
    """The SELECTED entry ``module`` falls under (itself or a package above it), or None."""
    for key in SELECTED:
        if module == key or module.startswith(key + "."):
            return key
    return None


def module_file(module: str) -> Path | None:
    path = SRC.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


@functools.cache
def _imports(path: Path, module: str, mtime: float) -> tuple[tuple[str, bool], ...]:
    """(dotted speedrun name, at the module's top) for each import in ``path``; ``from a import b`` gives a and a.b
    (b may be a submodule)."""
    del mtime  # part of the cache key only: an edited file is parsed again
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.dump(child.test):
                visit(ast.Module(body=child.orelse, type_ignores=[]), top)  # the else branch runs
                continue
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((alias.name, inner) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([base] if base else []))
                out.append((base, inner))
                out.extend((f"{base}.{alias.name}", inner) for alias in child.names)
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return tuple((name, top) for name, top in out if name.split(".")[0] == "speedrun")


def imports_of(module: str) -> dict[str, bool]:
    """{speedrun module ``module`` imports: whether at its top level}, each package on the way included."""
    path = module_file(module)
    if path is None:
        return {}
    out: dict[str, bool] = {}
    for name, top in _imports(path, module, path.stat().st_mtime):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
            sub = ".".join(parts[:i])
            if module_file(sub) is not None:
                out[sub] = out.get(sub, False) or top
    return out


def closure(roots: Iterable[str], chosen: Callable[[str], bool]) -> set[str]:
    """The modules importing ``roots`` runs, transitively, following an import into a SELECTED module only when
    ``chosen(its SELECTED key)``."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen or module_file(module) is None:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # its packages run first
        for name in imports_of(module):
            key = selected_key(name)
            if key is None or chosen(key):
                todo.append(name)
    return seen


def reached(plan: PlanView | None) -> list[str]:
    """The modules a re-run of ``plan`` imports, as files relative to src/, sorted; ``plan`` None: every choice (a
    file for a run whose Plan is not known)."""

    def chosen(key: str) -> bool:
        return plan is None or SELECTED[key](plan)

    # the model class is imported by its name (model.arch -> "module:Class"), the way a model of one's own is
    arches = BUILTIN.values() if plan is None else [BUILTIN.get(plan.model_arch, plan.model_arch)]
    roots = [ENTRY, *(arch.partition(":")[0] for arch in arches)] + [key for key in SELECTED if chosen(key)]
    files = {module_file(m) for m in closure(roots, chosen)}
    return sorted(p.relative_to(SRC).as_posix() for p in files if p is not None)


def recorded_plan(run_dir: Path) -> types.SimpleNamespace | None:
    """A run dir's plan.json, read as the attributes SELECTED's tests take (the Plan's fields, nested), or None when
    the run dir has none: what the export packs for a run that wrote no train_gpt.py."""
    try:
        text = (run_dir / "plan.json").read_text(encoding="utf-8")
    except OSError:
        return None
    return json.loads(text, object_hook=lambda d: types.SimpleNamespace(**d))
