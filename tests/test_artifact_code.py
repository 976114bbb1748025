"""The artifact's code, by parameter-golf's rule: exactly the source the run's path imports, counted raw.

The import graph is walked statically from src/run.py (every ``import`` and ``from ... import`` in a module,
function-level ones included, and the "speedrun.x:Class" strings the attention registry imports by name), so a
module added to, or dropped from, the path fails here until speedrun.finishing.artifact.CODE_FILES says so.
"""

from __future__ import annotations

import ast
import json
import re
import types
from pathlib import Path

import torch

from speedrun.finishing.artifact import CODE_FILES, MANIFEST, NOT_COUNTED, SRC


def _module_file(module: str) -> Path | None:
    path = SRC.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _imported(path: Path, module: str) -> set[str]:
    """Dotted names a module imports (candidates: ``from a import b`` may name a submodule a.b or an attribute)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            by_name = re.fullmatch(r"(speedrun(?:\.\w+)+):\w+", node.value)  # importlib, e.g. the attention REGISTRY
            if by_name:
                out.add(by_name.group(1))
    return out


def reachable_from_run() -> set[str]:
    """Files (relative to src/) imported, transitively, from src/run.py; NOT_COUNTED modules are not followed."""
    seen: dict[str, Path] = {}
    todo = [("run", SRC / "run.py")]
    while todo:
        module, path = todo.pop()
        rel = path.relative_to(SRC).as_posix()
        if module in seen or rel in NOT_COUNTED:
            seen.setdefault(module, path)
            continue
        seen[module] = path
        for name in _imported(path, module):
            if name.split(".")[0] != "speedrun":
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
                sub = ".".join(parts[:i])
                found = _module_file(sub)
                if found is not None and sub not in seen:
                    todo.append((sub, found))
    return {p.relative_to(SRC).as_posix() for p in seen.values()}


def test_code_files_are_exactly_what_the_run_path_imports():
    reachable = reachable_from_run()
    counted = set(CODE_FILES)
    missing = reachable - counted - set(NOT_COUNTED)
    stale = counted - reachable
    assert not missing, (
        f"on the train/eval/dequantize path but not in speedrun.finishing.artifact.CODE_FILES: {sorted(missing)}"
    )
    assert not stale, f"in CODE_FILES but no longer imported from src/run.py: {sorted(stale)}"
    assert set(NOT_COUNTED) <= reachable, "NOT_COUNTED names a module the path does not import"
    # the tools stay out: nothing on the path imports them
    assert not {f for f in counted if f.startswith(("speedrun/report/", "hydra_plugins/"))}
    assert not {"speedrun/report/sweep.py", "speedrun/stats.py", "speedrun/run/loggers.py"} & counted


def test_finalize_counts_code_raw_and_lists_the_files(compose, tmp_path):
    """artifact_bytes = compressed model + raw code (not compressed code, which read 84 KB for 275 KB of source);
    artifact_code.json lists every counted file with its bytes, and artifact_ok compares the sum with the cap."""
    from conftest import fake_device
    from speedrun.config import to_config
    from speedrun.finishing.finalize import evaluate_and_export
    from speedrun.model.attention import get_backend
    from speedrun.model.gpt import GPT
    from speedrun.plan import resolve
    from test_ttt import BOS, TINY, docs_stream, luts

    raw = sum(len((SRC / f).read_text(encoding="utf-8").encode("utf-8")) for f in CODE_FILES)
    gpt = GPT(TINY, get_backend("sdpa", kernel="math"))
    data = types.SimpleNamespace(val_tokens=docs_stream([50, 30]), luts=luts(), bos_id=BOS, train_batches=None)
    for cap, ok in ((raw + 10**6, True), (raw, False)):
        cfg = to_config(
            compose(
                [
                    "hardware=cpu",
                    "model=tiny",
                    "model.n_layer=2",
                    "model.d_model=32",
                    "model.seq_len=24",
                    "data.vocab_size=64",
                    "hardware.micro_batch=4",
                    "budget.tokens_per_step=96",
                    f"quant.cap_bytes={cap}",
                ]
            )
        )
        out = evaluate_and_export(
            resolve(cfg, fake_device("cpu")),
            gpt,
            lambda x, y: gpt(x, y, reduction="none"),
            data,
            tmp_path,
            lambda line: None,
        )
        model_bytes = (tmp_path / "model.int8.zlib").stat().st_size
        assert (out["artifact_model_bytes"], out["artifact_code_bytes"]) == (model_bytes, raw)
        assert out["artifact_bytes"] == model_bytes + raw and out["artifact_ok"] is ok
        manifest = json.loads((tmp_path / MANIFEST).read_text())
        assert [f["path"] for f in manifest["files"]] == list(CODE_FILES)
        assert sum(f["bytes"] for f in manifest["files"]) == raw == manifest["artifact_code_bytes"]
    assert torch.isfinite(torch.tensor(out["val_bpb_quant"]))
