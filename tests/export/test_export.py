"""The self-extracting train_gpt.py and `python -m speedrun.export` (docs/export.md), in seconds: the file
round-trips the sources, refuses another torch major, and the export refuses what must not be submitted. The
acceptance test (a smoke run, its export, and the exported file run where speedrun is not installed):
tests/e2e/test_export_rerun.py.
"""

from __future__ import annotations

import json

import pytest

from speedrun.artifact.wrap import CodeSource, build_wrapper, frozen_settings, unwrap_payload
from speedrun.export.cli import main as export_main
from support.export import CONFIG, fake_run

# ------------------------------------------------------------------------------------------------- the file


@pytest.fixture(scope="module")
def default_plan():
    from speedrun.artifact.sizes import resolved

    return resolved([])[1]


def test_the_file_is_the_readable_module_minified_and_the_same_source_makes_the_same_bytes(default_plan):
    from speedrun.artifact.link import counted

    code = CodeSource.snapshot().for_plan(default_plan)
    data, human = build_wrapper(code)
    assert unwrap_payload(data) == counted(human)
    compile(unwrap_payload(data), "train_gpt.py", "exec")
    assert "\nPLAN = RunSettings(" in human and "def main(run: RunSettings, file: str)" in human
    assert build_wrapper(code)[0] == data  # the count is reproducible


def test_the_file_takes_parameter_golfs_environment(tmp_path, default_plan):
    from speedrun.driver import from_environment

    run = frozen_settings(default_plan)
    data = tmp_path / "shards"
    data.mkdir()
    (data / "tokenizer.model").write_bytes(b"")
    again = from_environment(run, {"DATA_PATH": str(data), "SEED": "42"})
    assert again.data.path == str(data) and again.data.tokenizer == str(data / "tokenizer.model")
    assert again.seed == 42 and run.seed == 0
    named = from_environment(run, {"DATA_PATH": str(tmp_path), "TOKENIZER_PATH": "t.model"})
    assert named.data.tokenizer == "t.model" and named.data.path == str(tmp_path)
    assert from_environment(run, {}) == run
    # torchrun's ranks: a step keeps its tokens (grad_accum scaled), or the file says why it cannot
    accum = run.train.grad_accum
    assert from_environment(run, {"WORLD_SIZE": "1"}).train.grad_accum == accum
    if accum % 2 == 0:
        assert from_environment(run, {"WORLD_SIZE": "2"}).train.grad_accum == accum // 2
    with pytest.raises(SystemExit, match="cannot be split over"):
        from_environment(run, {"WORLD_SIZE": str(accum * 2 + 1)})


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


def test_a_raw_rule_run_is_wrapped_from_this_source_only_if_it_ran_it(tmp_path, capsys, default_plan):
    """A run counted raw wrote no train_gpt.py: the export builds one from the source here, refusing (unless
    --force) when that is not the source that ran."""
    from omegaconf import OmegaConf

    from speedrun.paths import REPO_ROOT
    from speedrun.plan import plan_json
    from speedrun.records.identity import code_fingerprint

    run = fake_run(tmp_path, 0)
    (run / "train_gpt.py").unlink()
    (run / "plan.json").write_text(plan_json(default_plan))
    OmegaConf.save(OmegaConf.create({**CONFIG, "artifact": {"code_rule": "raw"}}), run / ".hydra" / "config.yaml")
    result = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text(json.dumps({**result, "code_fingerprint": "0123456789abcdef"}))
    code, text = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 1 and "not the source that ran" in text and "--force" in text
    (run / "result.json").write_text(json.dumps({**result, "code_fingerprint": code_fingerprint(REPO_ROOT)}))
    code, text = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 0, text
    human = (tmp_path / "X" / "train_gpt_human.py").read_text()
    assert "\nPLAN = RunSettings(" in human and unwrap_payload((tmp_path / "X" / "train_gpt.py").read_bytes())
