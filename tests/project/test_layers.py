"""The packages of src/speedrun import one way, lowest first (docs/architecture.md): a module may import its own
package and the packages below it, never one above. Every import counts, whatever its form (``import speedrun``,
``import speedrun.x``, ``from speedrun import x``, relative) and wherever it is (a function-local import, one under
TYPE_CHECKING): a lazy import is still an edge. A cycle between packages is the first thing this catches."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "speedrun"

LAYERS = [
    # shared modules: import nothing of speedrun's above them
    {"errors", "paths", "tables", "stats", "progress", "version"},
    # the run's math (model, data, step, eval, quant, TTT): one floor, importing only the shared modules it needs
    {"core"},
    # the exported file's entry point: the core and the shared modules alone (speedrun.artifact.link links them)
    {"driver"},
    {"config"},
    {"hardware"},
    {"records"},
    {"data"},
    {"kernels"},
    {"plan"},
    {"distributed"},
    {"artifact"},
    {"run"},
    {"report"},
    # entry points (task: src/run.py's, with sweep_trial, an Optuna trial's reporting that it installs; cli and
    # __main__: the `speedrun` command)
    {"__init__", "tune", "task", "sweep_trial", "export", "bench", "cli", "__main__"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def unit_of(path: Path) -> str:
    """The package a module belongs to (first part under src/speedrun), or a top-level module's own name."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def is_unit(name: str) -> bool:
    """Whether ``name`` is one of speedrun's packages or top-level modules (what ``from speedrun import name`` may
    name besides an attribute of speedrun/__init__.py)."""
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def unit_of_module(dotted: str) -> str | None:
    """The unit a dotted module name imports: ``speedrun.x...`` -> x, ``speedrun`` itself -> its __init__ (where
    ``speedrun.main`` lives); None for anything outside speedrun."""
    parts = dotted.split(".")
    if parts[0] != "speedrun":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def imported_units(source: str, module: tuple[str, ...]) -> set[tuple[str, int]]:
    """(unit, line) for every speedrun import in ``source``, anywhere in it (function-local and TYPE_CHECKING
    ones included): ``import speedrun``, ``import speedrun.x``, ``from speedrun import x``, ``from speedrun.x
    import y`` and relative imports. ``module`` is the dotted path of the module ``source`` is (for relative
    imports), e.g. ("speedrun", "model", "gpt")."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(module[: len(module) - node.level])
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from speedrun import x` imports unit x when x is a package or module, else a name of __init__
            names = [a.name for a in node.names]
            mods = [f"{mod}.{n}" if is_unit(n) else mod for n in names] if mod == "speedrun" else [mod]
        else:
            continue
        for mod in mods:
            unit = unit_of_module(mod)
            if unit is not None:
                found.add((unit, node.lineno))
    return found


def imported_units_of(path: Path) -> set[tuple[str, int]]:
    """imported_units of one module of src/speedrun."""
    module = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return imported_units(path.read_text(), module)


def edges() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = unit_of(path)
        for dst, line in imported_units_of(path):
            if dst != src:
                out.append((src, dst, f"{path.relative_to(PACKAGE.parent)}:{line}"))
    return out


CORE_MAY_IMPORT = {"core", "progress", "tables", "errors"}
"""What speedrun.core imports of speedrun: itself and three shared modules. An exported train_gpt.py carries the
linked core and exactly these, so anything else the core imported would be missing from it."""


def core_imports_outside(package: Path = PACKAGE) -> list[str]:
    """'file:line: imports speedrun.unit' for each speedrun import of a module under ``package``/core outside
    CORE_MAY_IMPORT."""
    out = []
    for path in sorted((package / "core").rglob("*.py")):
        module = path.relative_to(package.parent).with_suffix("").parts
        for unit, line in sorted(imported_units(path.read_text(), module)):
            if unit not in CORE_MAY_IMPORT:
                out.append(f"{path.relative_to(package.parent)}:{line}: imports speedrun.{unit}")
    return out


def test_core_imports_only_the_shared_modules_it_ships_with():
    outside = core_imports_outside()
    assert not outside, "speedrun.core imports outside core/progress/tables/errors:\n" + "\n".join(outside)


def test_the_core_check_names_an_import_outside(tmp_path):
    """The check itself, on a toy tree: the shared and core imports pass, the config one is named with its line
    (a function-local one too)."""
    core = tmp_path / "speedrun" / "core"
    core.mkdir(parents=True)
    (core / "m.py").write_text(
        "import torch\nfrom speedrun.errors import E\nfrom speedrun.core.x import y\nfrom speedrun.config import C\n"
        "def f():\n    from speedrun.plan import P\n"
    )
    assert core_imports_outside(tmp_path / "speedrun") == [
        "speedrun/core/m.py:4: imports speedrun.config",
        "speedrun/core/m.py:6: imports speedrun.plan",
    ]


def test_every_unit_has_a_layer():
    units = {unit_of(p) for p in PACKAGE.rglob("*.py")}
    assert units <= set(RANK), f"add these to LAYERS: {sorted(units - set(RANK))}"


def test_imports_run_downward_only():
    upward = [f"{where}: {src} imports {dst}" for src, dst, where in edges() if RANK[dst] > RANK[src]]
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for src, dst, _ in edges():
        graph.setdefault(src, set()).add(dst)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    cycles = sorted({tuple(sorted((a, b))) for a, b, _ in edges() if reaches(b, a, set())})
    assert not cycles, f"cycles between packages: {cycles}"


CHECKER_CASES = [
    ("def f():\n    from speedrun.kernels import x\n", ("kernels", 2)),  # function-local
    ("def f():\n    import speedrun\n", ("__init__", 2)),
    ("import speedrun.report.cli\n", ("report", 1)),
    ("import speedrun.report.cli as cli\n", ("report", 1)),
    ("from speedrun import bench\n", ("bench", 1)),
    ("from speedrun import main\n", ("__init__", 1)),
    ("from speedrun.config import Config\n", ("config", 1)),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from speedrun.plan.types import Plan\n", ("plan", 3)),
    ("from ..kernels import tiles\n", ("kernels", 1)),  # relative, from speedrun.model.m
    ("from .. import tune\n", ("tune", 1)),
]


@pytest.mark.parametrize("source,edge", CHECKER_CASES)
def test_the_checker_sees_every_form_of_import(source, edge):
    """The checker itself, on each way a module can import another: every one is an edge."""
    assert edge in imported_units(source, ("speedrun", "model", "m"))


def test_the_checker_ignores_other_packages():
    source = "import speedrunner\nfrom torch import speedrun\nimport os.path\n"
    assert imported_units(source, ("speedrun", "model", "m")) == set()


def module_edges(package: str, root: Path = PACKAGE) -> dict[str, set[str]]:
    """{module of speedrun.<package>: the modules of that package it imports}, every import counted (function-local
    and TYPE_CHECKING ones too: a lazy import still ties the two modules)."""
    graph: dict[str, set[str]] = {}
    prefix = f"speedrun.{package}."
    for path in sorted((root / package).glob("*.py")):
        module = path.relative_to(root.parent).with_suffix("").parts
        graph[path.stem] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(list(module[: len(module) - node.level]) + ([base] if base else []))
                names = [base] if base != f"speedrun.{package}" else [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            graph[path.stem] |= {n[len(prefix) :].split(".")[0] for n in names if n.startswith(prefix)} - {path.stem}
    return graph


def cycles_in(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each module that reaches itself, with the path back (one per module, shortest found first)."""
    out = []
    for start in sorted(graph):
        paths = [[start]]
        seen: set[str] = set()
        while paths:
            path = paths.pop(0)
            for nxt in sorted(graph.get(path[-1], ())):
                if nxt == start:
                    out.append([*path, start])
                    paths = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    paths.append([*path, nxt])
    return out


def test_no_import_cycle_between_the_modules_of_run():
    """run/ is the shell `python -m run` runs: its modules import one way too (the runner, the job, its record, the
    loggers), so each can be read and tested after the ones it uses."""
    found = cycles_in(module_edges("run"))
    assert not found, "import cycles in speedrun/run/: " + "; ".join(" -> ".join(c) for c in found)


def test_the_cycle_check_finds_one(tmp_path):
    run = tmp_path / "speedrun" / "run"
    run.mkdir(parents=True)
    (run / "a.py").write_text("from speedrun.run.b import x\n")
    (run / "b.py").write_text("def f():\n    from speedrun.run import a\n")
    (run / "c.py").write_text("from speedrun.run.a import y\n")
    assert cycles_in(module_edges("run", tmp_path / "speedrun")) == [["a", "b", "a"], ["b", "a", "b"]]


def test_nothing_in_speedrun_imports_the_hydra_plugins():
    """The plugins (src/hydra_plugins/) are Hydra's to load; speedrun's code under them may import speedrun, never
    the other way (a run exported without Hydra would lack them)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n.split(".")[0] == "hydra_plugins" for n in names):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not found, "speedrun imports hydra_plugins at: " + ", ".join(found)
