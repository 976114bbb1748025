"""The packages of src/speedrun import one way, lowest first (docs/architecture.md): a module may import its own
package and the packages below it, never one above. Function-local imports count: a lazy import is still an
edge. A cycle between packages is the first thing this catches."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "speedrun"

LAYERS = [
    {"errors", "paths", "tables", "stats", "progress"},  # shared helpers: import nothing of speedrun's above them
    {"config"},
    {"hardware"},
    {"records"},
    {"data"},
    {"model"},
    {"kernels"},
    {"plan"},
    {"distributed"},
    {"evaluation"},
    {"artifact"},
    {"quant"},
    {"ttt"},
    {"training"},
    {"run"},
    {"report"},
    {"__init__", "tune", "export", "rerun", "bench"},  # entry points (rerun: an exported train_gpt.py's)
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def unit_of(path: Path) -> str:
    """The package a module belongs to (first part under src/speedrun), or a top-level module's own name."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_units(path: Path) -> set[tuple[str, int]]:
    """(unit, line) for every speedrun module that ``path`` imports, anywhere in the file."""
    tree = ast.parse(path.read_text())
    here = path.relative_to(PACKAGE.parent).with_suffix("").parts
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[: len(here) - node.level])
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from speedrun import x` names a unit by its imported name
            mods = [f"{mod}.{a.name}" for a in node.names] if mod == "speedrun" else [mod]
        else:
            continue
        for mod in mods:
            parts = mod.split(".")
            if parts[0] == "speedrun" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return found


def edges() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = unit_of(path)
        for dst, line in imported_units(path):
            if dst != src:
                out.append((src, dst, f"{path.relative_to(PACKAGE.parent)}:{line}"))
    return out


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


@pytest.mark.parametrize("src,dst", [("plan", "kernels"), ("model", "config")])
def test_the_checker_sees_a_function_local_import(tmp_path, src, dst):
    """The checker itself: a lazy import inside a function is an edge."""
    mod = tmp_path / "m.py"
    mod.write_text(f"def f():\n    from speedrun.{dst} import x\n")
    assert (dst, 2) in {(u, ln) for u, ln in imported_units_at(mod)}


def imported_units_at(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return {
        (n.module.split(".")[1], n.lineno)
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("speedrun.")
    }
