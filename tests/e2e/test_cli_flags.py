"""The flags a newcomer tries first: `--version` says speedrun's version (Hydra's own flag printed only Hydra's),
`--hydra-help` lists Hydra's flags without the shell completion that cannot complete `python -m run`, and `-sc`
is refused in one line instead of as an unknown key."""

from __future__ import annotations

import subprocess
from pathlib import Path

from speedrun import cli
from speedrun.version import __version__
from support.cli import run_cli


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m run ARGS` forked from this process (run.py's own lines run as __main__ there, not Hydra's)."""
    return run_cli(list(args), cwd=cwd, timeout=120, fork=True)


def test_version_is_speedruns(capsys, tmp_path):
    assert cli.main(["--version"]) == 0 and cli.main(["-V"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == lines[1] and lines[0].startswith(f"speedrun {__version__} (Hydra ")
    assert "--version" in cli.usage()  # speedrun --help names it
    proc = _run(tmp_path, "--version")
    assert proc.returncode == 0 and proc.stdout.strip() == lines[0], proc.stderr


def test_hydra_help_advertises_no_shell_completion_and_sc_is_refused_in_one_line(tmp_path):
    proc = _run(tmp_path, "--hydra-help")
    assert proc.returncode == 0, proc.stderr
    assert "--multirun" in proc.stdout and "hydra/sweeper" in proc.stdout and "optuna" in proc.stdout
    assert "install=bash" not in proc.stdout
    refused = _run(tmp_path, "-sc", "install=bash")
    assert refused.returncode == 1 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: shell completion (-sc) is not offered") and "unknown key" not in line
