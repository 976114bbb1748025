"""Size limits of the source: no module over MAX_MODULE_LINES lines and no function over MAX_FUNCTION_LINES
(from its ``def`` line to its last line, decorators not counted), over every .py file under src/ (speedrun, the
Hydra plugins and run.py). The limits catch a file that holds several ideas and a function that does several jobs;
they are not a target: one algorithm stays one module (and one loop one function) well past a few hundred lines,
since cutting it to fit a count scatters what a reader needs in one place."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
MAX_MODULE_LINES = 1000
MAX_FUNCTION_LINES = 300


def offenders(root: Path = SRC) -> dict[str, list[str]]:
    """{path relative to the repository: what is over a limit, with its length} for every .py file under root."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        over = []
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            over.append(f"module: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over.append(f"{node.name} (line {node.lineno}): {length} lines")
        if over:
            found[path.relative_to(root.parent).as_posix()] = over
    return found


def test_no_module_or_function_over_the_limits():
    over = offenders()
    lines = [f"{path}: {item}" for path, what in over.items() for item in what]
    assert not lines, f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function:\n" + "\n".join(lines)


def test_the_measure_counts_def_to_last_line_without_decorators(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "fits.py").write_text(f"@staticmethod\ndef f():\n{body}\n")
    nested = body.replace("\n", "\n    ")
    (tmp_path / "src" / "over.py").write_text(f"class C:\n    async def g(self):\n    {nested}\n        return 1\n")
    (tmp_path / "src" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert offenders(tmp_path / "src") == {
        "src/over.py": [f"g (line 2): {MAX_FUNCTION_LINES + 1} lines"],
        "src/long.py": [f"module: {MAX_MODULE_LINES + 1} lines"],
    }
