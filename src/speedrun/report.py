"""``python -m speedrun.report``: the leaderboard, significance against a baseline, plots and an HTML report.

    python -m speedrun.report                                   # every run in outputs/results.sqlite
    python -m speedrun.report --sweep latest --baseline attn=sdpa
    python -m speedrun.report --where model.n_layer=2 --group-by attn,precision --out outputs/report

Runs are grouped by ``--group-by`` keys (default: the overrides that vary among the selected runs, seeds
folded, plus ``hardware`` when it varies), so each group is one combination and its runs are repeats. A key is
looked up as a results column first (what ran: ``attn``, ``hardware``, ``precision`` are the resolved values),
then in the composed config (``optim.matrix_lr``; a group such as ``model`` gives its ``name``), then in the
Plan. ``--baseline KEY=VALUE`` compares every group with the group that has KEY=VALUE and the same other keys,
by a one-sided Welch t-test of H1: the group's mean ``--metric`` (val_bpb) is lower than the baseline's.
"""
from __future__ import annotations

import argparse
import base64
import csv
import html
import io
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from .stats import Welch, finite, mean, pareto_front, std, welch_less
from .sweep import (MANIFEST, SUMMARY_METRICS, fmt_number, format_table, mean_std_cell,
                    override_dict, split_overrides, varying_keys)

LOWER_IS_BETTER = ("val_bpb", "val_bpb_quant", "val_bpb_ttt", "val_loss")
FAILED = ("failed", "diverged", "interrupted")


# ---------------------------------------------------------------------------------------------------------
# runs


@dataclass
class Run:
    row: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Run":
        return cls(row=row, config=_json(row.get("config")), plan=_json(row.get("plan")),
                   overrides=override_dict(split_overrides(row.get("overrides"))))

    def get(self, key: str) -> Any:
        """A key's value for this run: results column, else config (dotted), else Plan, else override text."""
        value = self.row.get(key)
        if value is not None and key not in ("config", "plan", "overrides"):
            return value
        if key == "model.name" and self.plan.get("model_name"):
            return self.plan["model_name"]
        # model=auto is resolved per device: the Plan holds the model that actually ran.
        for tree in ((self.plan, self.config) if key.startswith("model.") else (self.config, self.plan)):
            found, value = _dotted(tree, key)
            if found:
                return value.get("name", json.dumps(value, sort_keys=True)) if isinstance(value, dict) else value
        return self.overrides.get(key)

    @property
    def status(self) -> str:
        return str(self.row.get("status"))


def _json(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _dotted(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def canon(value: Any) -> str:
    """A value as a comparable string: 2 == 2.0 == "2", True == "true", None == "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{float(value):.12g}"
    text = str(value).strip()
    if text.lower() in ("none", "null", "~"):
        return "null"
    if text.lower() in ("true", "false"):
        return text.lower()
    try:
        return f"{float(text):.12g}"
    except ValueError:
        return text


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        for part in item.split(",") if what == "--baseline" else [item]:
            if "=" not in part:
                raise SystemExit(f"{what} {part!r}: expected KEY=VALUE")
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def load_runs(db: Path, sweeps: Sequence[str] = (), name: Optional[str] = None, hardware: Optional[str] = None,
              where: Optional[dict[str, str]] = None) -> list[Run]:
    from .records import ResultsDB

    if not db.exists():
        raise SystemExit(f"no results database at {db}: run something first (python -m run)")
    runs = [Run.from_row(r) for r in ResultsDB(db).rows()]
    if sweeps:
        runs = _select_sweeps(runs, sweeps, db.resolve().parent / "multirun")
    wanted = dict(where or {})
    if name is not None:
        wanted["name"] = name
    if hardware is not None:
        wanted["hardware"] = hardware
    for key, value in wanted.items():
        options = {canon(v) for v in value.split(",")}
        runs = [r for r in runs if canon(r.get(key)) in options]
    return sorted(runs, key=lambda r: r.row.get("started_at") or 0.0)


def _select_sweeps(runs: list[Run], sweeps: Sequence[str], multirun: Optional[Path] = None) -> list[Run]:
    """Runs of the named sweeps: an id, ``latest``, or a sweep dir. A sweep that resumed also takes the
    earlier runs its manifest (sweep.json) reused, even when it ran no job itself. ``multirun`` is where
    sweep dirs live (outputs/multirun beside the database), searched for manifests by id."""
    manifests = {p.parent.name: p.parent for p in multirun.glob(f"*/*/{MANIFEST}")} if multirun else {}
    ids, dirs = set(), []
    for s in sweeps:
        if s == "latest":
            started = {r.row["sweep"]: r.row.get("started_at") or 0.0 for r in runs if r.row.get("sweep")}
            for sweep_id, d in manifests.items():
                started[sweep_id] = max(started.get(sweep_id, 0.0), _manifest_started(d))
            if not started:
                raise SystemExit("--sweep latest: no sweep in the database or under " + str(multirun))
            ids.add(max(started, key=lambda k: started[k]))
        elif Path(s).is_dir():
            dirs.append(Path(s).resolve())
            ids.add(Path(s).name)
        else:
            ids.add(s)
    dirs += [manifests[i] for i in ids if i in manifests]
    for r in runs:
        if r.row.get("sweep") in ids and r.row.get("run_dir"):
            dirs.append(Path(r.row["run_dir"]).parent)
    reused: set[str] = set()
    for d in dict.fromkeys(dirs):
        path = d / MANIFEST
        if path.exists():
            try:
                jobs = json.loads(path.read_text()).get("jobs", [])
            except ValueError:
                continue
            reused.update(str(j["run_dir"]) for j in jobs if j.get("state") == "reused" and j.get("run_dir"))
    return [r for r in runs if r.row.get("sweep") in ids or str(r.row.get("run_dir") or r.row["run_id"]) in reused]


def _manifest_started(sweep_dir: Path) -> float:
    try:
        return float(json.loads((sweep_dir / MANIFEST).read_text()).get("started_at") or 0.0)
    except (OSError, ValueError, TypeError):
        return 0.0


# ---------------------------------------------------------------------------------------------------------
# groups and the leaderboard


def default_group_keys(runs: Sequence[Run]) -> list[str]:
    """The override keys whose effective value differs among the runs (seeds folded), plus hardware if it
    differs: runs that share these are repeats of one combination."""
    candidates = varying_keys([r.overrides for r in runs])
    keys = [k for k in candidates if "/" not in k and not k.startswith("hydra")
            and len({canon(r.get(k)) for r in runs}) > 1]
    if len({canon(r.get("hardware")) for r in runs}) > 1 and "hardware" not in keys:
        keys.insert(0, "hardware")
    return keys or ["name"]


@dataclass
class Group:
    values: dict[str, str]
    runs: list[Run]
    welch: Optional[Welch] = None
    baseline: Optional["Group"] = None
    is_baseline: bool = False

    @property
    def ok(self) -> list[Run]:
        return [r for r in self.runs if r.status == "ok"]

    @property
    def failures(self) -> int:
        return sum(r.status in FAILED for r in self.runs)

    def metric(self, key: str) -> list[float]:
        return finite(r.row.get(key) for r in self.ok)

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())


def group_runs(runs: Sequence[Run], keys: Sequence[str]) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for r in runs:
        values = {k: _display(r.get(k)) for k in keys}
        groups.setdefault(tuple(canon(v) for v in values.values()), Group(values, [])).runs.append(r)
    return list(groups.values())


def _display(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def compare(groups: list[Group], baseline: dict[str, str], metric: str) -> None:
    """Pair each group with its baseline (same other keys, baseline keys set) and run the Welch test."""
    index = {tuple(canon(v) for v in g.values.values()): g for g in groups}
    for g in groups:
        target = {k: (baseline[k] if k in baseline else v) for k, v in g.values.items()}
        base = index.get(tuple(canon(v) for v in target.values()))
        if base is None:
            continue
        if base is g:
            g.is_baseline = True
            continue
        g.baseline = base
        g.welch = welch_less(g.metric(metric), base.metric(metric))


def sort_groups(groups: list[Group], metric: str) -> list[Group]:
    def key(g: Group) -> tuple:
        m = mean(g.metric(metric))
        return (m is None, m if m is not None else 0.0)

    return sorted(groups, key=key)


def leaderboard_rows(groups: Sequence[Group], metric: str, with_baseline: bool, alpha: float
                     ) -> tuple[list[str], list[list[str]]]:
    keys = list(groups[0].values) if groups else []
    headers = ["#"] + keys + ["n", "fail", metric]
    if with_baseline:
        headers += ["delta", "p", "verdict"]
    others = [m for m in SUMMARY_METRICS if m != metric]
    headers += others
    rows = []
    for rank, g in enumerate(groups, 1):
        xs = g.metric(metric)
        row = [str(rank)] + [g.values[k] for k in keys] + [str(len(xs)), str(g.failures),
                                                           mean_std_cell(mean(xs), std(xs), "{:.4f}")]
        if with_baseline:
            row += _verdict(g, alpha)
        for m in others:
            ys = g.metric(m)
            row.append(mean_std_cell(mean(ys), std(ys), SUMMARY_METRICS[m]))
        rows.append(row)
    return headers, rows


def _verdict(g: Group, alpha: float) -> list[str]:
    if g.is_baseline:
        return ["", "", "baseline"]
    if g.baseline is None:
        return ["", "", "no baseline group"]
    if g.welch is None:
        return ["", "", "n < 2"]
    w = g.welch
    verdict = f"better (p<{alpha:g})" if w.p < alpha else "not significant"
    return [f"{w.delta:+.4f}", _fmt_p(w.p), verdict]


def _fmt_p(p: float) -> str:
    return f"{p:.2e}" if p < 1e-3 else f"{p:.4f}"


def ttest_rows(groups: Sequence[Group], metric: str, alpha: float) -> tuple[list[str], list[list[str]]]:
    """One row per group that has a baseline group: both samples, the difference and the test."""
    keys = list(groups[0].values) if groups else []
    headers = keys + ["n", "mean", "std", "n_base", "mean_base", "std_base", "delta", "t", "df", "p", "verdict"]
    rows = []
    for g in groups:
        if g.baseline is None:
            continue
        a, b = g.metric(metric), g.baseline.metric(metric)
        w = g.welch
        rows.append([g.values[k] for k in keys]
                    + [str(len(a)), fmt_number(mean(a), "{:.4f}"), fmt_number(std(a), "{:.4f}"),
                       str(len(b)), fmt_number(mean(b), "{:.4f}"), fmt_number(std(b), "{:.4f}"),
                       f"{w.delta:+.4f}" if w else "", f"{w.t:.3f}" if w else "", f"{w.df:.1f}" if w else "",
                       _fmt_p(w.p) if w else "", _verdict(g, alpha)[2]])
    return headers, rows


# ---------------------------------------------------------------------------------------------------------
# plots


def make_plots(groups: Sequence[Group], out: Path, metric: str) -> dict[str, Path]:
    """PNG plots into ``out``; {} (with a note) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install -e '.[report]')", file=sys.stderr)
        return {}
    colors = {g.label(): plt.get_cmap("tab10")(i % 10) for i, g in enumerate(groups)}
    plots = {}
    for name, fn in (("pareto", _plot_pareto), ("loss_curves", _plot_loss), ("quant_vs_size", _plot_quant)):
        fig = fn(plt, groups, colors, metric)
        if fig is None:
            continue
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        plots[name] = path
    return plots


def _plot_pareto(plt: Any, groups: Sequence[Group], colors: dict, metric: str) -> Any:
    hardware = sorted({_display(r.get("hardware")) for g in groups for r in g.ok})
    if not hardware:
        return None
    fig, axes = plt.subplots(1, len(hardware), figsize=(6.5 * len(hardware), 4.8), squeeze=False)
    for ax, hw in zip(axes[0], hardware):
        points, labels = [], []
        for g in groups:
            runs = [r for r in g.ok if _display(r.get("hardware")) == hw]
            xs = finite(r.row.get("tokens_per_s") for r in runs)
            ys = finite(r.row.get(metric) for r in runs)
            if not xs or len(xs) != len(ys):
                continue
            c = colors[g.label()]
            ax.scatter(xs, ys, color=c, alpha=0.35, s=14)
            mx, my = mean(xs), mean(ys)
            ax.errorbar([mx], [my], xerr=[std(xs) or 0], yerr=[std(ys) or 0], fmt="o", color=c, ms=7, capsize=3,
                        label=g.label())
            points.append((mx, my))
            labels.append(g.label())
        front = pareto_front(points)
        if front:
            ax.plot([points[i][0] for i in front], [points[i][1] for i in front], "k--", lw=1, label="Pareto front")
        if points and max(p[0] for p in points) > 10 * min(p[0] for p in points):
            ax.set_xscale("log")
        ax.set_title(f"hardware: {hw}")
        ax.set_xlabel("tokens/s (training)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{metric} vs throughput (group means ± std; lower-right is better)")
    return fig


def _plot_loss(plt: Any, groups: Sequence[Group], colors: dict, metric: str, max_runs: int = 60) -> Any:
    fig, ax = plt.subplots(figsize=(8, 4.8))
    drawn, labelled = 0, set()
    for g in groups:
        for r in g.runs:
            if drawn >= max_runs:
                break
            xs, ys = _curve(r)
            if not xs:
                continue
            label = g.label() if g.label() not in labelled else None
            labelled.add(g.label())
            ax.plot(xs, ys, color=colors[g.label()], alpha=0.8, lw=1.2, label=label,
                    ls="-" if r.status == "ok" else ":", marker="o", ms=2.5)
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("training tokens")
    ax.set_ylabel("train loss (nats/token)")
    ax.set_title("training loss (metrics.jsonl; dotted: runs that did not end ok)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def _curve(r: Run) -> tuple[list[float], list[float]]:
    run_dir = r.row.get("run_dir") or r.row.get("run_id")
    path = Path(str(run_dir)) / "metrics.jsonl"
    xs, ys = [], []
    if not path.exists():
        return xs, ys
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        x, y = rec.get("tokens"), rec.get("train_loss")
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(y):
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys


def _plot_quant(plt: Any, groups: Sequence[Group], colors: dict, metric: str) -> Any:
    fig, ax = plt.subplots(figsize=(8, 4.8))
    any_point = False
    caps = set()
    for g in groups:
        pts = [(r.row.get("artifact_bytes"), r.row.get("val_bpb_quant")) for r in g.ok]
        pts = [(x, y) for x, y in pts if finite([x]) and finite([y])]
        if not pts:
            continue
        any_point = True
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=colors[g.label()], label=g.label(), s=22)
        caps.update(c for c in (_dotted(r.config, "quant.cap_bytes")[1] for r in g.ok) if isinstance(c, int))
    if not any_point:
        plt.close(fig)
        return None
    lo, hi = ax.get_xlim()
    for cap in caps:
        if cap <= 2 * hi:
            ax.axvline(cap, color="r", ls="--", lw=1, label=f"cap {cap:,} bytes")
    ax.set_xlabel("artifact bytes (compressed weights + code)")
    ax.set_ylabel("val_bpb_quant")
    ax.set_title("what the artifact earns vs what it weighs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


# ---------------------------------------------------------------------------------------------------------
# HTML

_CSS = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1400px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td.text { text-align: left; white-space: normal; }
tr.baseline td { background: #eef5ff; } tr.better td { background: #eefbea; }
.meta { color: #555; font-size: 0.9em; } img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
figure { margin: 1em 0; } figcaption { color: #555; font-size: 0.9em; }
"""


def _html_table(table_id: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                row_classes: Optional[Sequence[str]] = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td{_cell_class(c)}>{html.escape(str(c))}</td>' for c in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return (f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


_NUMERIC = re.compile(r"^[+-]?[\d,.]+(e[+-]?\d+)?( ± [\d,.]+(e[+-]?\d+)?)?$")


def _cell_class(value: Any) -> str:
    return "" if not str(value) or _NUMERIC.match(str(value)) else ' class="text"'


def render_html(title: str, meta: list[str], board: tuple[list[str], list[list[str]]], board_classes: list[str],
                ttest: Optional[tuple[list[str], list[list[str]]]], failures: list[list[str]],
                plots: dict[str, Path]) -> str:
    captions = {"pareto": "val_bpb vs training throughput per hardware, with the Pareto front of group means",
                "loss_curves": "training loss curves from each run's metrics.jsonl",
                "quant_vs_size": "val_bpb of the dequantized artifact vs its compressed size"}
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             "<div class=\"meta\">" + "<br>".join(html.escape(m) for m in meta) + "</div>",
             "<h2>Leaderboard</h2>", _html_table("leaderboard", *board, row_classes=board_classes)]
    if ttest is not None:
        parts += ["<h2>Against the baseline (one-sided Welch t-test)</h2>", _html_table("ttest", *ttest)]
    if plots:
        parts.append("<h2>Plots</h2>")
        for name, path in plots.items():
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            parts.append(f'<figure><img id="plot-{name}" alt="{html.escape(captions.get(name, name))}" '
                         f'src="data:image/png;base64,{data}"><figcaption>{html.escape(captions.get(name, name))}'
                         f"</figcaption></figure>")
    if failures:
        parts += ["<h2>Runs that did not end ok</h2>",
                  _html_table("failures", ["status", "group", "error", "run dir"], failures)]
    parts.append("</body></html>")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------------
# the command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m speedrun.report", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--db", type=Path, default=Path("outputs/results.sqlite"), help="results database")
    p.add_argument("--sweep", action="append", default=[], metavar="ID",
                   help="a sweep id, 'latest', or a sweep dir (repeatable)")
    p.add_argument("--name", help="only runs with this name")
    p.add_argument("--hardware", help="only runs on this hardware profile (the resolved one: cpu, t4, h100...)")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="only runs where KEY (column or config key, e.g. optim.matrix_lr) is VALUE; "
                        "VALUE may be a comma list (repeatable)")
    p.add_argument("--group-by", metavar="KEYS", help="comma-separated keys (default: the overrides that vary)")
    p.add_argument("--baseline", action="append", default=[], metavar="KEY=VALUE",
                   help="compare every group with the group where KEY=VALUE (one-sided Welch t-test)")
    p.add_argument("--metric", default="val_bpb", choices=LOWER_IS_BETTER, help="metric to rank and test")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level for the verdict")
    p.add_argument("--out", type=Path, default=Path("outputs/report"), help="where CSV, PNGs and report.html go")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    where = parse_pairs(args.where, "--where")
    baseline = parse_pairs(args.baseline, "--baseline")
    runs = load_runs(args.db, args.sweep, args.name, args.hardware, where)
    if not runs:
        print(f"no runs match in {args.db}", file=sys.stderr)
        return 2
    keys = [k.strip() for k in args.group_by.split(",") if k.strip()] if args.group_by else default_group_keys(runs)
    keys += [k for k in baseline if k not in keys]
    groups = group_runs([r for r in runs if r.status != "running"], keys)
    if baseline:
        compare(groups, baseline, args.metric)
        if not any(g.is_baseline for g in groups):
            print(f"--baseline {','.join(f'{k}={v}' for k, v in baseline.items())}: no group matches", file=sys.stderr)
            return 2
    groups = sort_groups(groups, args.metric)
    board = leaderboard_rows(groups, args.metric, bool(baseline), args.alpha)
    ttest = ttest_rows(groups, args.metric, args.alpha) if baseline else None
    running = sum(r.status == "running" for r in runs)
    meta = [f"database: {args.db.resolve()}", f"runs: {len(runs)} ({running} still running or killed)",
            f"grouped by: {', '.join(keys)}; cells: mean ± sample std over ok runs; fail: runs not ok",
            f"generated: {time.strftime('%Y-%m-%d %H:%M:%S')}"]
    filters = [f"--sweep {s}" for s in args.sweep] + [f"--{k} {v}" for k, v in (("name", args.name),
                                                                                  ("hardware", args.hardware)) if v]
    filters += [f"--where {k}={v}" for k, v in where.items()]
    if filters:
        meta.insert(1, "filters: " + " ".join(filters))
    if baseline:
        meta.append(f"baseline: {', '.join(f'{k}={v}' for k, v in baseline.items())}; H1: the group's mean "
                    f"{args.metric} is lower than its baseline's (one-sided Welch t-test), alpha {args.alpha:g}")

    print("\n".join(meta))
    print(f"\nleaderboard ({args.metric}, lower is better):\n" + format_table(*board))
    if ttest is not None:
        print(f"\nagainst the baseline (one-sided Welch t-test on {args.metric}):\n" + format_table(*ttest))

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "leaderboard.csv", groups, args.metric)
    plots = {} if args.no_plots else make_plots(groups, out, args.metric)
    failures = [[r.status, g.label(), str(r.row.get("error") or "")[:300], str(r.row.get("run_dir") or "")]
                for g in groups for r in g.runs if r.status != "ok"]
    classes = ["baseline" if g.is_baseline else "better" if g.welch and g.welch.p < args.alpha else ""
               for g in groups]
    page = render_html("speedrun report", meta, board, classes, ttest, failures, plots)
    (out / "report.html").write_text(page)
    print(f"\nwrote {out / 'leaderboard.csv'}" + "".join(f", {p}" for p in plots.values())
          + f", {out / 'report.html'}")
    return 0


def _write_csv(path: Path, groups: Sequence[Group], metric: str) -> None:
    """The leaderboard with plain numbers: per group n, fail, and mean/std of every metric (+ the test)."""
    keys = list(groups[0].values) if groups else []
    metrics = [metric] + [m for m in SUMMARY_METRICS if m != metric]
    cols = keys + ["n", "fail"] + [f"{m}_{s}" for m in metrics for s in ("mean", "std")]
    cols += ["baseline", "delta", "t", "df", "p"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for g in groups:
        row: dict[str, Any] = {**g.values, "n": len(g.metric(metric)), "fail": g.failures}
        for m in metrics:
            xs = g.metric(m)
            row[f"{m}_mean"], row[f"{m}_std"] = mean(xs), std(xs)
        if g.is_baseline:
            row["baseline"] = "self"
        elif g.baseline is not None:
            row["baseline"] = g.baseline.label()
        if g.welch is not None:
            row.update(delta=g.welch.delta, t=g.welch.t, df=g.welch.df, p=g.welch.p)
        w.writerow(row)
    path.write_text(buf.getvalue())


if __name__ == "__main__":
    sys.exit(main())
