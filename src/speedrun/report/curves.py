"""Train-loss and validation curves per group: the mean over a group's runs (its seeds) with a ± std band, against
training tokens or train seconds, read from each run's metrics.jsonl (speedrun.core.train).

One line per group rather than per run keeps a plot of many runs readable; the dense per-step train loss is
smoothed (an exponential moving average over about 2% of the points) before averaging. Each run's curve is
interpolated onto a common grid over the range every run of the group covers, so the mean never mixes runs in
and out. More groups than ``max_groups`` are cut to the first ones (the leaderboard's order) with a note.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from speedrun.report.groups import Group

X_KEYS = {"tokens": "tokens", "seconds": "elapsed_s"}


def read_curves(run_dir: Any, x: str = "tokens") -> dict[str, tuple[list[float], list[float]]]:
    """{"train": (xs, train_loss), "val": (xs, val_bpb)} from a run dir's metrics.jsonl ({} when it has none)."""
    path = Path(str(run_dir)) / "metrics.jsonl"
    out: dict[str, tuple[list[float], list[float]]] = {"train": ([], []), "val": ([], [])}
    if not path.exists():
        return out
    xkey = X_KEYS[x]
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        kind, ykey = ("val", "val_bpb") if rec.get("kind") == "val" else ("train", "train_loss")
        xv, yv = rec.get(xkey), rec.get(ykey)
        if _finite(xv) and _finite(yv):
            out[kind][0].append(float(xv))
            out[kind][1].append(float(yv))
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def smooth(ys: Sequence[float]) -> np.ndarray:
    """Exponential moving average with a span of about 2% of the points (no smoothing below 50 points)."""
    arr = np.asarray(ys, dtype=float)
    if len(arr) < 50:
        return arr
    alpha = 2.0 / (0.02 * len(arr) + 1)
    out = np.empty_like(arr)
    acc = arr[0]
    for i, y in enumerate(arr):
        acc = alpha * y + (1 - alpha) * acc
        out[i] = acc
    return out


def aggregate(
    curves: Sequence[tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]], points: int = 200
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """(grid, mean, std or None for a single run) over the x range all curves cover; None without two points."""
    arrays = [(np.asarray(xs, float), np.asarray(ys, float)) for xs, ys in curves if len(xs) >= 1]
    if not arrays:
        return None
    lo, hi = max(xs[0] for xs, _ in arrays), min(xs[-1] for xs, _ in arrays)
    if hi < lo:
        return None
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    stacked = np.stack([np.interp(grid, xs, ys) for xs, ys in arrays])
    return grid, stacked.mean(axis=0), stacked.std(axis=0, ddof=1) if len(arrays) > 1 else None


def plot_curves(plt: Any, groups: Sequence[Group], colors: dict, x: str = "tokens", max_groups: int = 20) -> Any:
    """The figure: train loss (left) and periodic val_bpb (right, when any run has it), one line + band per group."""
    shown = list(groups)[:max_groups]
    data = {}
    for g in shown:
        runs = g.ok or g.runs
        per_run = [read_curves(r.row.get("run_dir") or r.row.get("run_id"), x) for r in runs]
        train = [(c["train"][0], smooth(c["train"][1])) for c in per_run if c["train"][0]]
        val = [c["val"] for c in per_run if c["val"][0]]
        # validation points are few and exact: keep as many grid points as the sparsest run has, marked
        data[g.label()] = {
            "train": aggregate(train),
            "val": aggregate(val, points=min(len(xs) for xs, _ in val)) if val else None,
        }
    has_val = any(d["val"] is not None for d in data.values())
    if not any(d["train"] is not None for d in data.values()) and not has_val:
        return None
    fig, axes = plt.subplots(1, 2 if has_val else 1, figsize=(14 if has_val else 8, 4.8), squeeze=False)
    panels = [("train", "train loss (nats/token, smoothed)")] + ([("val", "val_bpb (periodic)")] if has_val else [])
    for ax, (kind, ylabel) in zip(axes[0], panels):
        for label, d in data.items():
            agg = d[kind]
            if agg is None:
                continue
            grid, mean, std = agg
            ax.plot(
                grid,
                mean,
                color=colors[label],
                lw=1.4,
                label=label or "(all)",
                marker="o" if kind == "val" and len(grid) < 30 else None,
                ms=3,
            )
            if std is not None:
                ax.fill_between(grid, mean - std, mean + std, color=colors[label], alpha=0.18, lw=0)
        ax.set_xlabel("training tokens" if x == "tokens" else "train seconds")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    more = len(groups) - len(shown)
    title = "group mean ± std over runs" + (f"; {more} more group(s) not shown" if more > 0 else "")
    fig.suptitle(title)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
    return fig
