"""speedrun.bench.resume: what the dist_resume check reports from an uninterrupted and a stopped-and-resumed run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speedrun.bench import resume as resume_check


def _run(path: Path, losses: dict[int, float], tokens_per_s: float, log: str) -> Path:
    path.mkdir()
    result = {
        "status": "ok",
        "steps": max(losses),
        "tokens_per_s": tokens_per_s,
        "world_size": 4,
        "device_name": "H100",
    }
    (path / "result.json").write_text(json.dumps(result))
    lines = [json.dumps({"step": s, "tokens": 10 * s, "train_loss": v}) for s, v in sorted(losses.items())]
    lines.append(json.dumps({"step": max(losses), "val_loss": 3.0}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "run.log").write_text(log)
    return path


def test_compare_reads_the_resume_step_the_saves_and_the_loss_gap(tmp_path):
    full = _run(tmp_path / "full", {1: 5.0, 2: 4.0, 3: 3.5, 4: 3.2}, 1000.0, "")
    log = (
        "[t] checkpoint at step 2: /r/checkpoints/step_00000002.pt (1.5s, not in train time)\n"
        "[t] interrupted: signal 15 at step 2\n"
        "[t] resumed from /r/checkpoints/step_00000002.pt: step 2, 20 tokens, 9.0 train seconds done\n"
        "[t] checkpoint at step 4: /r/checkpoints/step_00000004.pt (2.5s, not in train time)\n"
    )
    resumed = _run(tmp_path / "resumed", {1: 5.0, 2: 4.0, 3: 3.5, 4: 3.25}, 990.0, log)
    out = resume_check.compare(resume_check.read_run(full), resume_check.read_run(resumed))
    assert out["resumed_from_step"] == 2 and out["steps_compared"] == 4
    assert out["max_train_loss_diff"] == pytest.approx(0.05)
    assert out["tokens_per_s_ratio"] == pytest.approx(0.99)
    assert out["checkpoints"] == 2 and out["checkpoint_write_s"] == {"mean": 2.0, "max": 2.5}
    assert resume_check.resume_metrics(full, resumed) == {
        "resumed_from_step": 2,
        "max_train_loss_diff": pytest.approx(0.05),
        "checkpoint_write_s": 2.5,
    }
    assert resume_check.resume_metrics(full, tmp_path / "missing")["max_train_loss_diff"] is None
