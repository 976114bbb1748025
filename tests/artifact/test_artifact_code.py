"""The artifact's code, by parameter-golf's rule: exactly the source the run's path imports, counted raw
(artifact.code_rule=raw) or as the self-extracting file that packs it (wrapped, the default).

The import graph is walked statically from src/run.py (every ``import`` and ``from ... import`` in a module,
function-level ones included, and the "speedrun.x:Class" strings the attention registry imports by name), so a
module added to, or dropped from, the path fails here until speedrun.artifact.raw_rule.CODE_FILES says so (the raw
rule's list). What the wrapped file packs is computed per run (speedrun.artifact.closure): tests/artifact/test_closure.py.
"""

from __future__ import annotations

import ast
import json
import re
import types
from pathlib import Path

import pytest
import torch

from speedrun.artifact.code_count import HUMAN_FILE, MANIFEST, WRAPPED_FILE
from speedrun.artifact.raw_rule import CODE_FILES, NOT_COUNTED, SRC
from support.tiny import BOS, TTT_TINY, byte_luts, docs_stream


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


def reachable_from_run(root: str = "run", skip: tuple[str, ...] = tuple(NOT_COUNTED)) -> set[str]:
    """Files (relative to src/) imported, transitively, from module ``root`` (src/run.py); ``skip`` (the NOT_COUNTED
    modules) are not followed."""
    seen: dict[str, Path] = {}
    start = _module_file(root)
    assert start is not None, root
    todo = [(root, start)]
    while todo:
        module, path = todo.pop()
        rel = path.relative_to(SRC).as_posix()
        if module in seen or rel in skip:
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
        f"on the train/eval/dequantize path but not in speedrun.artifact.raw_rule.CODE_FILES: {sorted(missing)}"
    )
    assert not stale, f"in CODE_FILES but no longer imported from src/run.py: {sorted(stale)}"
    assert set(NOT_COUNTED) <= reachable, "NOT_COUNTED names a module the path does not import"
    # the tools stay out: nothing on the path imports them
    assert not {f for f in counted if f.startswith(("speedrun/report/", "hydra_plugins/"))}
    assert not {"speedrun/report/sweep.py", "speedrun/stats.py", "speedrun/run/wandb_logger.py"} & counted


def _finalize(compose, tmp_path, overrides, code=None):
    """evaluate_and_export of a tiny GPT on CPU, with these overrides on top of a tiny config."""
    from speedrun.config import to_config
    from speedrun.core.attention import get_backend
    from speedrun.core.model import GPT
    from speedrun.plan import resolve
    from speedrun.run.finish import evaluate_and_export
    from support.devices import fake_device

    gpt = GPT(TTT_TINY, get_backend("sdpa", kernel="math"))
    data = types.SimpleNamespace(val_tokens=docs_stream([50, 30]), luts=byte_luts(), bos_id=BOS, train_batches=None)
    tiny = ["hardware=cpu", "model=tiny", "model.n_layer=2", "model.d_model=32", "model.seq_len=24"]
    tiny += ["data.vocab_size=64", "hardware.micro_batch=4", "budget.tokens_per_step=96"]
    cfg = to_config(compose([*tiny, *overrides]))
    return evaluate_and_export(
        resolve(cfg, fake_device("cpu")),
        gpt,
        lambda x, y: gpt(x, y, reduction="none"),
        data,
        tmp_path,
        lambda line: None,
        code=code,
    )


def test_finalize_counts_the_wrapped_file_it_writes(compose, tmp_path):
    """The default rule: artifact_code_bytes is the length of the train_gpt.py written beside the model (so the two
    cannot disagree), several times smaller than the raw count, with train_gpt_human.py, the module it compresses;
    artifact_code.json says so and lists every linked module with its raw bytes."""
    from speedrun.artifact.link import counted
    from speedrun.artifact.wrap import compressor_of, unwrap_payload

    out = _finalize(compose, tmp_path, [])  # no source handed in: today's, linked for the plan
    wrapped = tmp_path / WRAPPED_FILE
    raw = sum(len((SRC / f).read_bytes()) for f in CODE_FILES)
    assert out["artifact_code_rule"] == "wrapped" and out["artifact_code_bytes"] == wrapped.stat().st_size < raw / 3
    model_bytes = (tmp_path / "model.int8.zlib").stat().st_size
    assert out["artifact_bytes"] == model_bytes + out["artifact_code_bytes"] and out["artifact_ok"] is True
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["artifact_code_rule"] == "wrapped" and manifest["code_file"] == WRAPPED_FILE
    # the compressor that made the smaller file, recorded in the result and the manifest alike
    assert out["artifact_code_compressor"] == manifest["compressor"] == compressor_of(wrapped.read_bytes())
    paths = [f["path"] for f in manifest["files"]]
    assert "src/speedrun/driver.py" in paths and "src/speedrun/core/model.py" in paths
    assert not [p for p in paths if p.startswith(("src/speedrun/run/", "src/speedrun/plan/"))]  # no shell
    human = (tmp_path / HUMAN_FILE).read_text()
    assert unwrap_payload(wrapped.read_bytes()) == counted(human)


def test_the_wrapped_rule_is_refused_before_any_work_without_the_minifier(compose, monkeypatch):
    """No python-minifier: the resolver refuses, naming the install and the raw rule (as a missing compressor)."""
    import importlib.util

    from speedrun.config import to_config
    from speedrun.errors import PlanError
    from speedrun.plan import resolve
    from support.devices import fake_device

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "python_minifier" else real(name))
    cfg = to_config(compose(["hardware=cpu", "model=tiny"]))
    with pytest.raises(PlanError, match=r"pip install 'python-minifier.*artifact.code_rule=raw"):
        resolve(cfg, fake_device("cpu"))
    resolve(to_config(compose(["hardware=cpu", "model=tiny", "artifact.code_rule=raw"])), fake_device("cpu"))


def test_finalize_counts_code_raw_and_lists_the_files(compose, tmp_path):
    """artifact.code_rule=raw: artifact_bytes = compressed model + raw code (not compressed code, which read 84 KB
    for 275 KB of source); artifact_code.json lists every counted file with its bytes, and artifact_ok compares the
    sum with the cap; no train_gpt.py is written."""
    raw = sum(len((SRC / f).read_text(encoding="utf-8").encode("utf-8")) for f in CODE_FILES)
    for cap, ok in ((raw + 10**6, True), (raw, False)):
        out = _finalize(compose, tmp_path, ["artifact.code_rule=raw", f"quant.cap_bytes={cap}"])
        model_bytes = (tmp_path / "model.int8.zlib").stat().st_size
        assert (out["artifact_model_bytes"], out["artifact_code_bytes"]) == (model_bytes, raw)
        assert out["artifact_bytes"] == model_bytes + raw and out["artifact_ok"] is ok
        assert out["artifact_code_rule"] == "raw" and not (tmp_path / WRAPPED_FILE).exists()
        assert out["artifact_code_compressor"] is None
        manifest = json.loads((tmp_path / MANIFEST).read_text())
        assert [f["path"] for f in manifest["files"]] == list(CODE_FILES)
        assert sum(f["raw_bytes"] for f in manifest["files"]) == raw == manifest["artifact_code_bytes"]
    assert torch.isfinite(torch.tensor(out["val_bpb_quant"]))
