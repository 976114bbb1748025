"""A CPU run's exported file re-runs with the thread count the run chose: sums over another number of threads round
differently, so a re-run on a machine of other load would not reproduce the run's val_bpb."""

from __future__ import annotations

import json
import re


def test_the_smoke_runs_file_carries_the_threads_it_ran_with(default_smoke_run):
    assert default_smoke_run.proc.returncode == 0, default_smoke_run.proc.stderr[-2000:]
    result = json.loads((default_smoke_run.run_dir / "result.json").read_text())
    human = (default_smoke_run.run_dir / "train_gpt_human.py").read_text()
    settings = human.partition("\nPLAN = ")[2]
    assert result["cpu_threads"] >= 1
    assert re.search(r"^    threads=(\d+),$", settings, re.M).group(1) == str(result["cpu_threads"])
