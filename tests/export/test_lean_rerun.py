"""An exported train_gpt.py re-runs with torch, numpy, sentencepiece and its compressor alone: run where importing
hydra, omegaconf or yaml fails and speedrun is not installed, it reaches the run's val_bpb, imports only speedrun
modules it carries, and carries no module it does not import. Each compressor's exec line decodes its payload,
whatever bytes the compressed payload holds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from speedrun.artifact.unwrap import compressor_of, read_wrapper
from speedrun.artifact.wrap import CodeSource, available_compressors, build_wrapper
from support.export import bare_env

# Runs the file as `python train_gpt.py` would, after putting a finder first on sys.meta_path that refuses the
# packages a re-run must not need, and writes {speedrun module: its file} when the process ends.
BLOCKED = ("hydra", "omegaconf", "yaml")
HARNESS = """
import atexit, json, os, runpy, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("refused: " + name)
sys.meta_path.insert(0, Refuse())
def dump():
    mods = {{n: getattr(m, "__file__", None) for n, m in list(sys.modules.items()) if n.split(".")[0] == "speedrun"}}
    with open(os.environ["MODULES_OUT"], "w") as f:
        json.dump(mods, f)
atexit.register(dump)
sys.argv = ["train_gpt.py"]
runpy.run_path("train_gpt.py", run_name="__main__")
"""


def _module(path: str) -> str:
    return path.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")


@pytest.mark.slow
def test_a_rerun_needs_no_hydra_and_imports_only_what_its_file_carries(tmp_path, data_cache, default_smoke_run):
    from speedrun.data.layout import embedded_dir

    assert default_smoke_run.proc.returncode == 0, default_smoke_run.proc.stderr[-3000:]
    result = json.loads((default_smoke_run.run_dir / "result.json").read_text())
    shutil.copy(default_smoke_run.run_dir / "train_gpt.py", tmp_path / "train_gpt.py")
    out = tmp_path / "modules.json"
    env = bare_env(DATA_PATH=str(embedded_dir(data_cache, 1024)), MODULES_OUT=str(out))
    proc = subprocess.run(
        [sys.executable, "-S", "-c", HARNESS.format(blocked=BLOCKED)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    (again_path,) = (tmp_path / "runs").glob("*/result.json")
    again = json.loads(again_path.read_text())
    assert again["status"] == "ok" and abs(again["val_bpb"] - result["val_bpb"]) <= 1e-6
    assert again["artifact_code_bytes"] == os.path.getsize(tmp_path / "train_gpt.py") == result["artifact_code_bytes"]

    imported = json.loads(out.read_text())
    files, _ = read_wrapper((tmp_path / "train_gpt.py").read_bytes())
    packed = {_module(p) for p in files if p.endswith(".py")}
    outside = {m: f for m, f in imported.items() if not f or f"{os.sep}speedrun-" not in f}
    assert not outside, f"imported from outside the file: {outside}"
    assert set(imported) <= packed, f"imported but not packed: {sorted(set(imported) - packed)}"
    assert packed <= set(imported), f"packed but never imported: {sorted(packed - set(imported))}"


def test_each_compressors_file_decodes_any_payload_bytes(tmp_path):
    """A file per compressor, its payload holding bytes a one-line literal must escape (random text compresses to
    every byte value): each runs and hands its meta to speedrun.rerun.main, here a stand-in that prints it."""
    noise = "".join(chr(b) for b in os.urandom(20_000))  # incompressible: NUL, CR, LF, quote, backslash all occur
    stand_in = "def main(meta, file):\n    print('meta', meta)\n"
    code = CodeSource({"src/speedrun/__init__.py": "", "src/speedrun/rerun.py": stand_in, "src/n.txt": noise}, {"k": 1})
    sizes = {}
    for name in available_compressors():
        data, _ = build_wrapper(code, name)
        assert compressor_of(data) == name and read_wrapper(data)[0]["src/n.txt"] == noise
        (tmp_path / "train_gpt.py").write_bytes(data)
        proc = subprocess.run(
            [sys.executable, "train_gpt.py"], cwd=tmp_path, env=bare_env(), capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0 and '"config":{"k":1}' in proc.stdout, (name, proc.stderr)
        sizes[name] = len(data)
    # with no compressor named, the file is the smallest of them
    assert len(build_wrapper(code)[0]) == min(sizes.values())
