"""The export's acceptance test: a smoke run, its export (`python -m speedrun.export`), and the exported
train_gpt.py run where speedrun is not installed and importing hydra, omegaconf or yaml fails, reaching the run's
val_bpb to 1e-6 (CPU is deterministic), counting itself as the run counted it and importing nothing of speedrun's;
then the readable train_gpt_human.py beside it, reaching the same val_bpb."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from support.export import bare_env

pytestmark = pytest.mark.slow

# Runs a file as `python <file>` would, after putting a finder first on sys.meta_path that refuses the packages an
# exported file must not need, and prints the speedrun modules imported when the process ends.
BLOCKED = ("hydra", "omegaconf", "yaml", "speedrun")
HARNESS = """
import atexit, runpy, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("refused: " + name)
sys.meta_path.insert(0, Refuse())
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def printed(stdout: str) -> dict[str, str]:
    """The result block's "key: value" lines."""
    return dict(re.findall(r"^(\w+): (\S+)$", stdout, re.M))


def test_an_exported_run_reruns_where_speedrun_is_not_installed(tmp_path, data_cache, default_smoke_run):
    from speedrun.data.prepare import embedded_dir

    # 1. a smoke run; its train_gpt.py is what it counted. The pytest session's default smoke run (conftest; the export
    # only reads its run dir), where this test made a smoke run of its own (2 shorter steps): ~5 s less, its rerun
    # below ~1 s more
    proc = default_smoke_run.proc
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    result_path = default_smoke_run.run_dir / "result.json"
    result = json.loads(result_path.read_text())
    assert result["artifact_code_rule"] == "wrapped"
    assert result["artifact_code_bytes"] == (result_path.parent / "train_gpt.py").stat().st_size

    # 2. the export
    out = tmp_path / "X"
    exported = subprocess.run(
        [sys.executable, "-m", "speedrun.export", str(result_path.parent), "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "requirements.txt",
        "submission.json",
        "train_gpt.py",
        "train_gpt_human.py",
        "train_seed0.log",
    ]
    readme = (out / "README.md").read_text()
    assert "`train_gpt.py`: the self-extracting run, the code counted" in readme
    assert "`train_gpt_human.py`: the same code to read (not counted)" in readme
    human = (out / "train_gpt_human.py").read_text()
    assert "# ---- speedrun/core/model.py ----" in human and "\n# " in human  # modules as written, comments kept
    assert "\nPLAN = RunSettings(" in human and human.rstrip().endswith("main(PLAN, __file__)")
    assert result["artifact_code_bytes"] == os.path.getsize(out / "train_gpt.py")
    submission = json.loads((out / "submission.json").read_text())
    assert submission["bytes_code"] == result["artifact_code_bytes"] and submission["seeds"] == [0]
    assert submission["val_bpb"] == result["val_bpb_quant"] and submission["metric"] == "val_bpb_quant"

    # 3. a directory holding only the folder and the data, on a Python where speedrun is not importable
    clean = tmp_path / "clean"
    shutil.copytree(out, clean / "X")
    shutil.copytree(embedded_dir(data_cache, 1024), clean / "data")
    env = bare_env(DATA_PATH=str(clean / "data"))
    no_speedrun = subprocess.run(
        [sys.executable, "-S", "-c", "import speedrun"], cwd=clean, env=env, text=True, capture_output=True
    )
    if no_speedrun.returncode == 0:  # installed into site-packages itself, not editable (a .pth file): cannot hide it
        pytest.skip("speedrun is installed into site-packages (not editable), so python -S cannot hide it")
    assert "No module named 'speedrun'" in no_speedrun.stderr

    def run(name: str) -> dict[str, str]:
        proc = subprocess.run(
            [sys.executable, "-S", "-c", HARNESS.format(blocked=BLOCKED), f"X/{name}"],
            cwd=clean,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        return printed(proc.stdout)

    again = run("train_gpt.py")
    assert again["status"] == "ok" and abs(float(again["val_bpb"]) - result["val_bpb"]) <= 1e-6
    assert float(again["val_bpb_quant"]) == pytest.approx(result["val_bpb_quant"], abs=1e-6)
    # the re-run counts the file that ran, byte for byte, and writes the artifact it scored
    assert int(again["artifact_code_bytes"]) == os.path.getsize(clean / "X" / "train_gpt.py")
    assert int(again["artifact_model_bytes"]) == result["artifact_model_bytes"]
    assert (clean / "final_model.int8.zlib").stat().st_size == result["artifact_model_bytes"]

    # 4. the readable file re-runs the same run: the same val_bpb, exactly, and counts the train_gpt.py beside it
    from_human = run("train_gpt_human.py")
    assert from_human["val_bpb"] == again["val_bpb"] and from_human["val_bpb_quant"] == again["val_bpb_quant"]
    assert from_human["artifact_code_bytes"] == again["artifact_code_bytes"]
