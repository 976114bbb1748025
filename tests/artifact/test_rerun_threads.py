"""A CPU run's exported file re-runs with the thread count the run chose: sums over another number of threads round
differently, so a re-run on a machine of other load would not reproduce the run's val_bpb."""

from __future__ import annotations

import json

from speedrun.artifact.unwrap import read_wrapper
from speedrun.artifact.wrap import CodeSource


def test_with_threads_pins_an_unset_count_and_keeps_a_chosen_one():
    code = CodeSource({"src/x.py": ""}, {"seed": 0, "hardware": {"name": "cpu", "threads": None}})
    pinned = code.with_threads(3)
    assert pinned.config == {"seed": 0, "hardware": {"name": "cpu", "threads": 3}}
    assert code.config["hardware"]["threads"] is None  # the original is left as it was
    chosen = CodeSource({}, {"hardware": {"name": "cpu", "threads": 2}})
    assert chosen.with_threads(5).config == {"hardware": {"name": "cpu", "threads": 2}}  # the user's count wins
    assert CodeSource({}, None).with_threads(4).config is None  # a file made only to be counted carries no config


def test_the_smoke_runs_file_carries_the_threads_it_ran_with(default_smoke_run):
    assert default_smoke_run.proc.returncode == 0, default_smoke_run.proc.stderr[-2000:]
    result = json.loads((default_smoke_run.run_dir / "result.json").read_text())
    _, meta = read_wrapper((default_smoke_run.run_dir / "train_gpt.py").read_bytes())
    assert result["cpu_threads"] >= 1
    assert meta["config"]["hardware"]["threads"] == result["cpu_threads"]
