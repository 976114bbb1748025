"""speedrun as an installed library: the wheel carries the conf/ tree and the `speedrun` command, and unpacked away
from the repository it composes from its own configs, overlaid by a user's --config-dir, and fingerprints its code
as a checkout of the same files does; the `speedrun` command dispatches to each command's main. The whole install
(a fresh venv with torch, a smoke run and the report from an empty folder) is scripts/check_wheel.sh, in .ci/run.

The wheel is built once for this file (about 5 s, without build isolation: setuptools comes with the dev extra)
from a copy of the files git lists, as a checkout of the commit has them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from speedrun import cli
from speedrun.paths import CONF_DIR, REPO_ROOT, installed_code, source_path
from speedrun.records.identity import code_fingerprint
from speedrun.run.cli_step import unknown_override

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BUILD_INPUTS = ["pyproject.toml", "setup.py", "README.md", "src", "conf"]

MINE = "# @package _global_\nname: mine\nbudget:\n  max_steps: 3\n"
"""A user's own experiment, in a config folder of their own (DIR/experiment/mine.yaml)."""


def git_files(*paths: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *paths], cwd=REPO, capture_output=True, check=True
    )
    return [p for p in out.stdout.decode().split("\0") if p]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the files git lists (so nothing untracked or ignored leaks in)."""
    tree = tmp_path_factory.mktemp("tree")
    for rel in git_files(*BUILD_INPUTS):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tree / rel)
    dist = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(tree)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = dist.glob("speedrun-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    """The wheel unpacked as pip lays it into site-packages."""
    path = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(path)
    return path


def from_site(site: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python <args>` with only the unpacked wheel on PYTHONPATH (it comes before the editable install's path)."""
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def user_conf(tmp_path: Path) -> Path:
    mine = tmp_path / "myconf"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "mine.yaml").write_text(MINE)
    return mine


def test_the_wheel_carries_every_config_the_code_and_the_command(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    conf = {rel.removeprefix("conf/") for rel in git_files("conf") if rel.endswith(".yaml")}
    assert "config.yaml" in conf and {"experiment/t4_colab.yaml", "kernel/tuned/h100.yaml"} <= conf
    missing = sorted(c for c in conf if f"speedrun/conf/{c}" not in names)
    assert not missing, f"conf/ files the wheel lacks: {missing}"
    code = {rel.removeprefix("src/") for rel in git_files("src")}
    assert not sorted(code - names), f"src/ files the wheel lacks: {sorted(code - names)}"
    assert {"run.py", "speedrun/data/assets/pydoc311.jsonl.xz", "hydra_plugins/speedrun_plugins/sweeper.py"} <= names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "speedrun = speedrun.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_layout_finds_its_conf_and_fingerprints_like_the_checkout(site, tmp_path):
    probe = (
        "import json; from speedrun import paths; from speedrun.records.identity import code_fingerprint; "
        "print(json.dumps({'repo': str(paths.REPO_ROOT), 'conf': str(paths.CONF_DIR), "
        "'run': str(paths.source_path('src/run.py')), 'model': str(paths.source_path('conf/model/tiny.yaml')), "
        "'files': sorted(paths.installed_code()), 'fingerprint': code_fingerprint(paths.REPO_ROOT)}))"
    )
    proc = from_site(site, ["-c", probe], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["repo"] == "None" and got["conf"] == str(site / "speedrun" / "conf")
    assert got["run"] == str(site / "run.py") and got["model"] == str(site / "speedrun/conf/model/tiny.yaml")
    # named as the repository names them, so the same files hash the same whichever way they were installed
    assert got["files"] == sorted(git_files("src", "conf"))
    assert got["fingerprint"] == code_fingerprint(REPO_ROOT)


def test_the_installed_run_composes_from_its_conf_overlaid_by_a_config_dir(site, tmp_path):
    mine = user_conf(tmp_path)
    proc = from_site(site, ["-m", "run", "--config-dir", str(mine), "experiment=mine", "--cfg", "job"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "name: mine" in proc.stdout and "max_steps: 3" in proc.stdout
    typo = from_site(site, ["-m", "run", "--config-dir", str(mine), "experiment=mien", "--cfg", "job"], cwd=tmp_path)
    assert typo.returncode != 0 and "did you mean mine?" in typo.stderr


def test_a_checkout_plans_with_a_config_dir(tmp_path):
    mine = user_conf(tmp_path)
    args = ["--config-dir", str(mine), "experiment=mine", "debug=smoke", "--plan=json"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "run", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["name"] == "mine"


def test_did_you_mean_knows_a_config_dirs_options(tmp_path):
    mine = user_conf(tmp_path)
    assert unknown_override(["experiment=mine"]) is not None  # not one of conf/'s
    assert unknown_override(["--config-dir", str(mine), "experiment=mine"]) is None
    assert unknown_override([f"--config-dir={mine}", "experiment=pgolf_record"]) is None
    assert unknown_override([f"hydra.searchpath=[file://{mine}]", "experiment=mine"]) is None
    problem = unknown_override(["-cd", str(mine), "experiment=mien"])
    assert problem is not None and "did you mean mine?" in problem


def test_the_checkout_layout_reads_conf_beside_src():
    assert REPO_ROOT == REPO and CONF_DIR == REPO / "conf"
    assert installed_code() == {}  # the checkout's files are git's to list
    assert source_path("src/run.py") == REPO / "src" / "run.py"
    with pytest.raises(ValueError, match="no path under src/ or conf/"):
        source_path("docs/export.md")


def test_speedrun_dispatches_to_each_command(capsys, monkeypatch):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: speedrun {run,report,export,tune,bench}") and "--plan=json" in out
    assert "-m, --multirun" in out and "speedrun export" in out
    assert cli.main([]) == 2
    assert cli.main(["fly"]) == 2 and "no command 'fly'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:  # argparse's --help exits 0 after printing
        cli.main(["report", "--help"])
    assert done.value.code == 0 and "python -m speedrun.report" in capsys.readouterr().out
    monkeypatch.setattr(cli, "REPO_ROOT", None)  # as from a wheel
    assert cli.main(["bench", "--list"]) == 2 and "runs from a checkout" in capsys.readouterr().err


def test_speedrun_run_help_is_speedruns_then_hydras_groups(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "speedrun", "run", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("speedrun: train a small GPT")
    flags, groups = out.index("--plan=json"), out.index("experiment: ")
    assert flags < out.index("examples:") < groups and "t4_colab" in out[groups:]
