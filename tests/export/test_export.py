"""The self-extracting train_gpt.py and `python -m speedrun.export` (docs/export.md), in seconds: the file
round-trips the sources, refuses another torch major, and the export refuses what must not be submitted. The
acceptance test (a smoke run, its export, and the exported file run where speedrun is not installed):
tests/e2e/test_export_rerun.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from speedrun.artifact.wrap import CodeSource, build_wrapper, linked_files, packed_files, read_wrapper
from speedrun.export.cli import main as export_main
from support.export import CONFIG, bare_env, fake_run

# ------------------------------------------------------------------------------------------------- the file


def test_the_file_round_trips_the_sources_minified_and_they_compile():
    from speedrun.artifact.minify import minify_files

    code = CodeSource.snapshot({"seed": 3, "name": "x"})
    data, minified = build_wrapper(code)
    files, meta = read_wrapper(data)
    # byte-exact: the packed modules with the core linked down to what they import from it, minified
    assert list(files) == list(packed_files()) and files == minified == minify_files(linked_files(code))
    linked, core = linked_files(code), [p for p in code.files if p.startswith("src/speedrun/core/")]
    assert core and sum(map(len, (linked[p] for p in core))) < sum(map(len, (code.files[p] for p in core)))
    for path, text in files.items():
        if path.endswith(".py"):
            compile(text, path, "exec")
        else:  # the conf/ presets the resolver reads travel as they are
            assert text == code.files[path]
    assert meta["config"] == {"seed": 3, "name": "x"} and meta["versions"]["torch"] == torch.__version__
    assert build_wrapper(code)[0] == data  # the same source makes the same bytes: the count is reproducible


def test_the_file_refuses_another_torch_major(tmp_path):
    from speedrun.rerun import Refusal, check_torch

    check_torch("2.13.0+cpu", "2.5.1")
    with pytest.raises(Refusal, match=r"torch 2\.13\.0.*torch 3\.0\.0.*pip install 'torch>=2,<3'"):
        check_torch("2.13.0", "3.0.0")
    with pytest.raises(Refusal, match="not installed"):
        check_torch("2.13.0", None)
    # the file itself: it stops before any work, with the line above
    major = int(torch.__version__.split(".")[0])
    data, _ = build_wrapper(CodeSource(CodeSource.snapshot().files, {"seed": 0}, {"torch": f"{major + 1}.0.0"}))
    (tmp_path / "train_gpt.py").write_bytes(data)
    proc = subprocess.run(
        [sys.executable, "-S", "train_gpt.py"], cwd=tmp_path, env=bare_env(), capture_output=True, text=True
    )
    assert proc.returncode == 1 and f"pip install 'torch>={major + 1},<{major + 2}'" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_rerun_takes_parameter_golfs_environment(tmp_path):
    from speedrun.rerun import Refusal, rerun_config

    config = {
        "seed": 0,
        "name": "r",
        "data": {"path": None, "tokenizer": None, "vocab_size": 8, "cache_dir": "nowhere"},
    }
    data = tmp_path / "shards"
    data.mkdir()
    (data / "tokenizer.model").write_bytes(b"")
    env = {"DATA_PATH": str(data), "SEED": "42", "RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}
    tree = rerun_config(config, env, tmp_path / "train_gpt.py", tmp_path)
    assert tree["data"]["path"] == str(data) and tree["data"]["tokenizer"] == str(data / "tokenizer.model")
    assert tree["seed"] == 42 and (tree["dist"]["nproc"], tree["dist"]["nodes"]) == (8, 1)
    assert tree["artifact"] == {"code_rule": "wrapped", "code_file": str(tmp_path / "train_gpt.py")}
    assert tree["results_db"] == str(tmp_path / "runs" / "results.sqlite") and config["seed"] == 0
    with pytest.raises(Refusal, match="needs TOKENIZER_PATH"):
        rerun_config(config, {"DATA_PATH": str(tmp_path)}, tmp_path / "f", tmp_path)
    # A GPT-2 (tiktoken) run names its tokenizer, which needs no file next to the shards.
    gpt2 = {**config, "data": {**config["data"], "tokenizer": "gpt2", "path": "elsewhere", "vocab_size": 50257}}
    assert rerun_config(gpt2, {"DATA_PATH": str(tmp_path)}, tmp_path / "f", tmp_path)["data"]["tokenizer"] == "gpt2"
    with pytest.raises(Refusal, match="embedded corpus, which the file does not carry"):
        rerun_config(config, {}, tmp_path / "f", tmp_path)
    with pytest.raises(Refusal, match="torchrun --standalone --nproc_per_node=4"):
        rerun_config({**config, "dist": {"nproc": 4, "nodes": 1}}, {"DATA_PATH": str(data)}, tmp_path / "f", tmp_path)


# ----------------------------------------------------------------------------------------------- the export


def export(args: list, capsys) -> tuple[int, str]:
    code = export_main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_seeds_export_as_one_folder_with_mean_and_std(tmp_path, capsys):
    runs = [fake_run(tmp_path, seed) for seed in (1, 2, 3)]
    code, text = export([*runs, "--out", tmp_path / "X", "--name", "three"], capsys)
    assert code == 0, text
    sub = json.loads((tmp_path / "X" / "submission.json").read_text())
    assert (
        sub["seeds"] == [1, 2, 3]
        and sub["val_bpb"] == pytest.approx(1.52)
        and sub["val_bpb_std"] == pytest.approx(0.01)
    )
    assert sub["name"] == "three" and sub["bytes_code"] == (runs[0] / "train_gpt.py").stat().st_size
    assert (tmp_path / "X" / "train_gpt.py").read_bytes() == (runs[0] / "train_gpt.py").read_bytes()
    assert [(tmp_path / "X" / f"train_seed{s}.log").read_text() for s in (1, 2, 3)] == [
        "seed 1\n",
        "seed 2\n",
        "seed 3\n",
    ]
    assert "1.520000" in (tmp_path / "X" / "README.md").read_text()


@pytest.mark.parametrize(
    "kwargs, refusal",
    [
        ({"status": "failed"}, "status failed"),
        ({"artifact_ok": False}, "over its cap"),
        (
            {"result_extra": {"eval_complete_quant": False, "val_tokens_scored": 10, "val_tokens_total": 99}},
            "its score is partial",
        ),
    ],
)
def test_a_run_not_ok_over_its_cap_or_scored_in_part_needs_force(tmp_path, capsys, kwargs, refusal):
    run = fake_run(tmp_path, 0, **kwargs)
    code, text = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 1 and refusal in text and "--force" in text and not (tmp_path / "X").exists()
    code, text = export([run, "--out", tmp_path / "X", "--force"], capsys)
    assert code == 0 and (tmp_path / "X" / "train_gpt.py").is_file()


def test_runs_that_are_not_seeds_of_one_config_are_refused_naming_the_keys(tmp_path, capsys):
    a = fake_run(tmp_path, 0)
    b = fake_run(tmp_path, 1, optim={"matrix_lr": 0.05}, sweep="s1")  # the sweep id is bookkeeping
    code, text = export([a, b, "--out", tmp_path / "X", "--force"], capsys)
    assert code == 1 and "differ in optim.matrix_lr:" in text and "sweep" not in text.split("differ in")[1]
    assert not (tmp_path / "X").exists()


def test_an_earlier_export_is_replaced_only_with_force_and_other_files_never(tmp_path, capsys):
    run = fake_run(tmp_path, 0)
    out = tmp_path / "X"
    out.mkdir()
    (out / "old.txt").write_text("keep me")
    for flags in ([], ["--force"]):  # a folder holding what an export does not write is never replaced
        code, text = export([run, "--out", out, *flags], capsys)
        assert code == 1 and "holds files an export does not write (old.txt)" in text
    assert (out / "old.txt").read_text() == "keep me"
    (out / "old.txt").unlink()
    assert export([run, "--out", out], capsys)[0] == 0
    code, text = export([run, "--out", out], capsys)
    assert code == 1 and "holds an earlier export" in text and "--force" in text
    code, text = export([run, "--out", out, "--force"], capsys)
    assert code == 0 and (out / "submission.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".X.")]  # no temporary left beside it


def test_a_raw_rule_run_is_wrapped_from_this_source_only_if_it_ran_it(tmp_path, capsys):
    """A run counted raw wrote no train_gpt.py: the export builds one from the source here, refusing (unless
    --force) when that is not the source that ran."""
    from omegaconf import OmegaConf

    from speedrun.paths import REPO_ROOT
    from speedrun.records.identity import code_fingerprint

    run = fake_run(tmp_path, 0)
    (run / "train_gpt.py").unlink()
    (run / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create({**CONFIG, "artifact": {"code_rule": "raw"}}), run / ".hydra" / "config.yaml")
    result = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text(json.dumps({**result, "code_fingerprint": "0123456789abcdef"}))
    code, text = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 1 and "not the source that ran" in text and "--force" in text
    (run / "result.json").write_text(json.dumps({**result, "code_fingerprint": code_fingerprint(REPO_ROOT)}))
    code, text = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 0, text
    files, meta = read_wrapper((tmp_path / "X" / "train_gpt.py").read_bytes())
    assert list(files) == list(packed_files()) and meta["config"]["artifact"] == {"code_rule": "raw"}
