"""A run stopped and resumed against the same run uninterrupted: the step it resumed from, the largest gap between
the two training-loss curves over the steps both ran, and each checkpoint's write time.

Reads each run dir's metrics.jsonl (one record per step: train_loss; val_* at periodic validation) and run.log
(its "checkpoint at step N: <path> (S s, not in train time)" and "resumed from <path>: step N," lines). The
resumed run's metrics.jsonl holds its first part's steps and the resumed part's, each step once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

CKPT = re.compile(r"checkpoint at step (\d+): (\S+) \(([\d.]+)s, not in train time\)")
RESUMED = re.compile(r"resumed from \S+: step (\d+),")


def read_run(run_dir: Path) -> dict[str, Any]:
    """A run dir's result, per-step training and validation losses, checkpoint saves and resume points."""
    result = json.loads((run_dir / "result.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    log = (run_dir / "run.log").read_text() if (run_dir / "run.log").is_file() else ""
    saves = [(int(m.group(1)), float(m.group(3))) for m in CKPT.finditer(log)]
    resumed = [int(m.group(1)) for m in RESUMED.finditer(log)]
    train = {r["step"]: r["train_loss"] for r in records if "train_loss" in r}
    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    return {"dir": str(run_dir), "result": result, "train": train, "val": val, "saves": saves, "resumed": resumed}


def compare(full: dict[str, Any], resumed: dict[str, Any]) -> dict[str, Any]:
    """Both runs' status, steps and tokens/s with their ratio; the step it resumed from; the largest training-loss
    difference over the steps both ran (0 when the resume is exact); every save's write time."""
    a, b = full["result"], resumed["result"]
    common = sorted(set(full["train"]) & set(resumed["train"]))
    diffs = [abs(full["train"][s] - resumed["train"][s]) for s in common]
    save_times = [t for _, t in resumed["saves"]]
    keys = ("status", "steps", "tokens_per_s", "world_size", "val_loss", "device_name")
    return {
        "full": {k: a.get(k) for k in keys},
        "resumed": {k: b.get(k) for k in keys},
        "tokens_per_s_ratio": (b["tokens_per_s"] / a["tokens_per_s"]) if a.get("tokens_per_s") else None,
        "resumed_from_step": resumed["resumed"][-1] if resumed["resumed"] else None,
        "steps_compared": len(common),
        "max_train_loss_diff": max(diffs) if diffs else None,
        "checkpoints": len(save_times),
        "checkpoint_write_s": {
            "mean": sum(save_times) / len(save_times) if save_times else None,
            "max": max(save_times) if save_times else None,
        },
    }


def resume_metrics(full_dir: Path, resumed_dir: Path) -> dict[str, Any]:
    """What a check's stopped-and-resumed arm reports beside its result.json keys (None where a run dir lacks
    what is compared)."""
    try:
        out = compare(read_run(full_dir), read_run(resumed_dir))
    except (OSError, ValueError, KeyError):
        return {"resumed_from_step": None, "max_train_loss_diff": None, "checkpoint_write_s": None}
    return {
        "resumed_from_step": out["resumed_from_step"],
        "max_train_loss_diff": out["max_train_loss_diff"],
        "checkpoint_write_s": out["checkpoint_write_s"]["max"],
    }
