"""Compare a run that was stopped and resumed with the same run uninterrupted: the loss curves (one plot, the resumed
run's step marked), tokens/s of each, and the checkpoints' write times. What issue 26's GPU check reports.

    python scripts/resume_check.py <uninterrupted run dir> <resumed run dir> [--plot out.png] [--json out.json]

Reads each run dir's result.json, metrics.jsonl (one record per step: train_loss, and val_* at periodic
validation) and run.log (its "checkpoint at step N: <path> (S s, not in train time)" lines). The resumed run's
metrics.jsonl holds the first part's steps and the resumed part's, each step once; its result.json says
resumed_from_step only in the results database, so the step is read from the log's "resumed from" line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

CKPT = re.compile(r"checkpoint at step (\d+): (\S+) \(([\d.]+)s, not in train time\)")
RESUMED = re.compile(r"resumed from \S+: step (\d+),")


def read_run(run_dir: Path) -> dict[str, Any]:
    result = json.loads((run_dir / "result.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    log = (run_dir / "run.log").read_text() if (run_dir / "run.log").is_file() else ""
    saves = [(int(m.group(1)), float(m.group(3))) for m in CKPT.finditer(log)]
    resumed = [int(m.group(1)) for m in RESUMED.finditer(log)]
    train = {r["step"]: r["train_loss"] for r in records if "train_loss" in r}
    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    return {"dir": str(run_dir), "result": result, "train": train, "val": val, "saves": saves, "resumed": resumed}


def compare(full: dict[str, Any], resumed: dict[str, Any]) -> dict[str, Any]:
    """The numbers the check quotes: both runs' status, steps and tokens/s with their ratio; the step it resumed
    from; the largest loss difference over the steps both ran (0 when the resume is exact); every save's write
    time."""
    a, b = full["result"], resumed["result"]
    common = sorted(set(full["train"]) & set(resumed["train"]))
    diffs = [abs(full["train"][s] - resumed["train"][s]) for s in common]
    save_times = [t for _, t in resumed["saves"]]
    return {
        "full": {k: a.get(k) for k in ("status", "steps", "tokens_per_s", "world_size", "val_loss", "device_name")},
        "resumed": {k: b.get(k) for k in ("status", "steps", "tokens_per_s", "world_size", "val_loss", "device_name")},
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


def plot(full: dict[str, Any], resumed: dict[str, Any], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps = sorted(full["train"])
    ax.plot(steps, [full["train"][s] for s in steps], label="uninterrupted", lw=2.5, alpha=0.5)
    at = summary["resumed_from_step"] or 0
    for part, keep in (("before the stop", lambda s: s <= at), ("after resume", lambda s: s > at)):
        xs = [s for s in sorted(resumed["train"]) if keep(s)]
        ax.plot(xs, [resumed["train"][s] for s in xs], label=f"stopped and resumed: {part}", lw=1)
    if at:
        ax.axvline(at, color="gray", ls="--", lw=0.8)
    for run, marker in ((full, "o"), (resumed, "x")):
        if run["val"]:
            xs = sorted(run["val"])
            ax.plot(xs, [run["val"][s] for s in xs], marker, ls="none", label=f"val_loss ({Path(run['dir']).name})")
    r = summary["resumed"]
    ax.set(xlabel="step", ylabel="loss", title=f"{r['world_size']} x {r['device_name']}: resumed from step {at}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("full", type=Path)
    parser.add_argument("resumed", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    full, resumed = read_run(args.full), read_run(args.resumed)
    summary = compare(full, resumed)
    text = json.dumps(summary, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if args.plot:
        plot(full, resumed, summary, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
