"""`--plan` for a card this machine lacks: resolved as if the card were here, said on the first line; the summary
by default, the whole Plan with --plan=json."""

from __future__ import annotations

import json

import pytest

from speedrun.hardware import profiles
from speedrun.hardware.cards import card_for
from support.cli import run_cli
from support.devices import fake_device


@pytest.mark.parametrize("name", [n for n, p in profiles.PROFILES.items() if p.device_type == "cuda"])
def test_every_gpu_profile_has_a_device_the_card_table_knows(name):
    device = profiles.device_for(name)
    assert device.device_type == "cuda" and device.profile is profiles.PROFILES[name]
    assert device.capability == device.profile.capability and card_for(device.name) is not None


def plan(monkeypatch, capsys, tmp_path, here: str, *args: str) -> tuple[int, list[str], str]:
    """print_plan on a machine whose device is profile ``here``'s: (exit status, stdout lines, stderr)."""
    from speedrun.distributed.environment import world_from_env
    from speedrun.run import cli_step as plan_only

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(profiles, "detect", lambda: fake_device(here))
    if here != "cpu":  # the faked card is visible: one GPU
        monkeypatch.setattr(plan_only, "_world", lambda absent_card=False: world_from_env(visible_gpus=1))
    code = plan_only.print_plan(["run", "debug=smoke", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_a_card_this_machine_lacks_gets_its_plan_and_a_first_line_that_says_so(monkeypatch, capsys, tmp_path):
    code, out, err = plan(monkeypatch, capsys, tmp_path, "cpu", "hardware=t4", "--plan")
    assert code == 0, err
    assert out[0].startswith("note: resolved for hardware=t4 as if a Tesla T4 were here"), out
    assert out[1] == "hardware    t4 on Tesla T4" and out[2].startswith("precision   fp16 + GradScaler"), out
    assert list(tmp_path.iterdir()) == []


def test_the_refusal_that_card_would_give(monkeypatch, capsys, tmp_path):
    code, out, err = plan(monkeypatch, capsys, tmp_path, "cpu", "hardware=t4", "precision=bf16", "--plan")
    assert code == 1 and out[0].startswith("note: resolved for hardware=t4"), out
    assert err.startswith("error: precision=bf16 needs compute capability") and "precision=fp16" in err, err


def test_a_larger_card_than_this_one_is_planned_for_too_and_json_stays_json(monkeypatch, capsys, tmp_path):
    code, out, err = plan(monkeypatch, capsys, tmp_path, "t4", "hardware=h100", "--plan=json")
    assert code == 0, err
    assert err.startswith("note: resolved for hardware=h100 as if a NVIDIA H100 80GB HBM3 were here")
    plan_dict = json.loads("\n".join(out))
    assert plan_dict["hardware"] == "h100" and plan_dict["emulated"] is False and plan_dict["precision"] == "bf16"


def test_a_card_that_can_be_emulated_here_is_no_absent_card(monkeypatch, capsys, tmp_path):
    code, out, err = plan(monkeypatch, capsys, tmp_path, "h100", "hardware=t4", "--plan")
    assert code == 0, err
    assert out[0] == "hardware    t4 (emulated) on NVIDIA H100 80GB HBM3, memory cap 15 GB", out


def test_an_unknown_plan_format_is_refused(monkeypatch, capsys, tmp_path):
    code, out, err = plan(monkeypatch, capsys, tmp_path, "cpu", "--plan=xml")
    assert code == 1 and out == [] and "--plan=json" in err


@pytest.mark.slow
def test_the_command_line_plans_for_a_t4_and_training_for_it_is_still_refused(tmp_path):
    proc = run_cli(["hardware=t4", "precision=bf16", "--plan"], cwd=tmp_path, env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1 and proc.stdout.startswith("note: resolved for hardware=t4"), proc.stdout
    assert "precision=fp16" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
