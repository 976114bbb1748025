"""The report's PNG plots: val_bpb vs throughput per card with the Pareto front, train-loss and validation curves
per group (speedrun.report.curves), and val_bpb_quant vs artifact size. matplotlib is optional (the ``report``
extra); without it there are no plots."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from speedrun.report.curves import plot_curves
from speedrun.report.groups import Group
from speedrun.report.run_rows import Run, dotted
from speedrun.stats import finite, mean, pareto_front, std
from speedrun.tables import display


def make_plots(groups: Sequence[Group], out: Path, metric: str, curve_x: str = "tokens") -> dict[str, Path]:
    """PNG plots into ``out``; {} (with a note) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "plots skipped: matplotlib is not installed (the report extra: pip install matplotlib scipy)",
            file=sys.stderr,
        )
        return {}
    cmap, n = ("tab10", 10) if len(groups) <= 10 else ("tab20", 20)
    colors = {g.label(): plt.get_cmap(cmap)(i % n) for i, g in enumerate(groups)}
    plots = {}

    def curves(plt: Any, groups: Sequence[Group], colors: dict, metric: str) -> Any:
        return plot_curves(plt, groups, colors, x=curve_x)

    for name, fn in (("pareto", _plot_pareto), ("loss_curves", curves), ("quant_vs_size", _plot_quant)):
        fig = fn(plt, groups, colors, metric)
        if fig is None:
            continue
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        plots[name] = path
    return plots


def _card(r: Run) -> str:
    """The panel a run's throughput belongs to: its profile, and the card when known (an H200 runs the h100
    profile faster than an H100 does)."""
    hardware, device = display(r.get("hardware")), r.get("device_name")
    return f"{hardware} ({device})" if device else hardware


def _plot_pareto(plt: Any, groups: Sequence[Group], colors: dict, metric: str) -> Any:
    cards = sorted({_card(r) for g in groups for r in g.ok})
    if not cards:
        return None
    fig, axes = plt.subplots(1, len(cards), figsize=(6.5 * len(cards), 4.8), squeeze=False)
    for ax, card in zip(axes[0], cards):
        points = []
        for g in groups:
            runs = [r for r in g.ok if _card(r) == card]
            xs = finite(r.row.get("tokens_per_s") for r in runs)
            ys = finite(r.row.get(metric) for r in runs)
            if not xs or len(xs) != len(ys):
                continue
            c = colors[g.label()]
            ax.scatter(xs, ys, color=c, alpha=0.35, s=14)
            mx, my = mean(xs), mean(ys)
            assert mx is not None and my is not None  # xs and ys are not empty
            ax.errorbar(
                [mx], [my], xerr=[std(xs) or 0], yerr=[std(ys) or 0], fmt="o", color=c, ms=7, capsize=3, label=g.label()
            )
            points.append((mx, my))
        front = pareto_front(points)
        if front:
            ax.plot([points[i][0] for i in front], [points[i][1] for i in front], "k--", lw=1, label="Pareto front")
        if points and max(p[0] for p in points) > 10 * min(p[0] for p in points):
            ax.set_xscale("log")
        ax.set_title(f"hardware: {card}")
        _finish(ax, "tokens/s (training)", metric)
    fig.suptitle(f"{metric} vs throughput (group means ± std; lower-right is better)")
    return fig


def _finish(ax: Any, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _plot_quant(plt: Any, groups: Sequence[Group], colors: dict, metric: str) -> Any:
    fig, ax = plt.subplots(figsize=(8, 4.8))
    any_point = False
    caps: set[int] = set()
    for g in groups:
        pts = [(r.row.get("artifact_bytes"), r.row.get("val_bpb_quant")) for r in g.ok]
        pts = [(x, y) for x, y in pts if finite([x]) and finite([y])]
        if not pts:
            continue
        any_point = True
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=colors[g.label()], label=g.label(), s=22)
        caps.update(c for c in (dotted(r.config, "quant.cap_bytes")[1] for r in g.ok) if isinstance(c, int))
    if not any_point:
        plt.close(fig)
        return None
    lo, hi = ax.get_xlim()
    for cap in caps:
        if cap <= 2 * hi:
            ax.axvline(cap, color="r", ls="--", lw=1, label=f"cap {cap:,} bytes")
    ax.set_title("what the artifact earns vs what it weighs")
    _finish(ax, "artifact bytes (compressed weights + code)", "val_bpb_quant")
    return fig
