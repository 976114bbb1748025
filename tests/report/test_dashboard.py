"""``python -m speedrun.report --wandb-dashboard`` without W&B credentials (or an entity), or refused by W&B, ends in
one line that names the fix, never a traceback; the credentials are found where wandb looks for them. The dashboard's
layout: tests/report/test_report_curves.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def scrubbed_env(home: Path) -> dict[str, str]:
    """This environment without any W&B credentials: no WANDB_* variables, no NETRC, and HOME (so ~/.netrc and
    wandb's settings file) in an empty directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), WANDB_CONFIG_DIR=str(home / ".config" / "wandb"))
    return env


def test_a_dashboard_without_credentials_is_one_line_naming_the_fix(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "speedrun.report", "--db", str(tmp_path / "missing.sqlite"), "--out", str(out)]
        + ["--wandb-dashboard", "s1", "--wandb-entity", "me"],
        cwd=tmp_path,
        env=scrubbed_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no W&B credentials" in lines[0] and "WANDB_API_KEY" in lines[0] and "wandb login" in lines[0], lines[0]
    # checked before any work: the (missing) database was never opened and nothing was written
    assert "no runs match" not in proc.stderr and not out.exists()


def test_a_dashboard_without_an_entity_says_so_before_any_work(tmp_path, capsys):
    from speedrun import report

    assert report.main(["--db", str(tmp_path / "missing.sqlite"), "--wandb-dashboard", "s1"]) == 2
    err = capsys.readouterr().err
    assert "--wandb-entity is needed" in err and "no runs match" not in err


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    for key in [k for k in os.environ if k.startswith("WANDB_")] + ["NETRC"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    from speedrun.report import dashboard

    monkeypatch.setattr(dashboard, "_wandb_finds_credentials", lambda base: False)
    return dashboard


def test_credentials_are_found_where_wandb_looks(no_credentials, monkeypatch, tmp_path):
    dashboard = no_credentials
    problem = dashboard.credentials_problem()
    assert problem and "api.wandb.ai" in problem and "WANDB_API_KEY" in problem and "wandb login" in problem

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert dashboard.credentials_problem() is None
    monkeypatch.delenv("WANDB_API_KEY")

    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "y" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert dashboard.credentials_problem() is None

    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")  # a key for another server does not count
    assert "wandb.example.com" in dashboard.credentials_problem()
    netrc.write_text("machine wandb.example.com login user password " + "y" * 40 + "\n")
    assert dashboard.credentials_problem() is None


def test_a_workspace_wandb_refuses_is_one_line_too(no_credentials, monkeypatch, tmp_path, capsys):
    import wandb

    dashboard = no_credentials
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)

    class Refused:
        def save(self):
            raise wandb.errors.UsageError("api_key not valid\n(401)")

    monkeypatch.setattr(dashboard, "dashboard_spec", lambda *a: {"entity": "me", "name": "s1"})
    monkeypatch.setattr(dashboard, "build_workspace", lambda spec: Refused())
    assert dashboard.run_dashboard([], "s1", "speedrun", "me", False, tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "W&B refused the workspace" in err[0] and "api_key not valid (401)" in err[0], err
