"""Groups as tables: the one layout of the report's leaderboard and the sweep's summary, as aligned text
(console, summary.md, report.html) and as CSV (leaderboard.csv, summary.csv), plus the t-test table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from speedrun.report.groups import EVAL_KEY, EvalSets, Group, tested_count
from speedrun.stats import mean, std
from speedrun.tables import csv_text, fmt_number, fmt_p, mean_std_cell

METRICS: dict[str, str] = {
    "val_bpb": "{:.4f}",
    "val_bpb_quant": "{:.4f}",
    "tokens_per_s": "{:,.0f}",
    "mfu": "{:.4f}",
    "peak_mem_mb": "{:,.0f}",
    "artifact_bytes": "{:,.0f}",
    "overhead_s": "{:.1f}",
}
"""The metrics every table folds over a group's ok runs (mean ± sample std), with their display format.
overhead_s is derived (Run.metric): wall minus training seconds, what start-up, compiling and evaluating cost."""

TTT_METRICS: dict[str, str] = {"val_bpb_ttt_base": "{:.4f}", "val_bpb_ttt": "{:.4f}", "ttt_gain": "{:+.4f}"}
"""Shown when runs have them: val_bpb on the TTT evaluation without and with test-time training, and the gain
(base - ttt, per run) that TTT bought."""

SHARED_KEY = "gpu_shared"
TARGET_KEYS = ("reached", "time_to_target")
"""Columns of runs trained to a target (budget.target_val_loss / target_val_bpb): how many of a group's ok runs
reached it, and their mean time to it (runs that did not reach it are counted, not averaged)."""
"""Result column: the job shared its GPU with other jobs (pool launcher, jobs_per_gpu > 1), so its throughput
is not that of the card alone."""

COMPARISON = ["baseline", "delta", "t", "df", "p", "p_holm"]
HOLM = "p (Holm)"
"""The column of Holm-adjusted p-values, shown when more than one group was tested against a baseline."""

EPOCHS_KEY = "epochs"
"""Column of groups whose ok runs saw their training data more than once: the most passes one of them made."""
REPEATED_MARK = "†"
"""Beside the quality figures of a group that an epochs > 1 run is part of (see repeated_note)."""
QUALITY = ("val_bpb", "val_bpb_quant", "val_bpb_ttt", "val_bpb_ttt_base", "val_loss")
"""The figures that measure how well held-out text is predicted: what repeated training data inflates."""


def metrics_for(groups: Sequence[Group], first: str = "val_bpb") -> dict[str, str]:
    """METRICS with ``first`` leading, plus the TTT metrics that any ok run has."""
    runs = [r for g in groups for r in g.ok]
    ttt = [k for k in ("val_bpb_ttt_base", "val_bpb_ttt") if any(r.row.get(k) is not None for r in runs)]
    if "val_bpb_ttt_base" in ttt and "val_bpb_ttt" in ttt:
        ttt.append("ttt_gain")
    out = {first: METRICS.get(first, TTT_METRICS.get(first, "{:.4f}"))}
    out.update((k, v) for k, v in {**METRICS, **{k: TTT_METRICS[k] for k in ttt}}.items() if k != first)
    return out


def extra_columns(groups: Sequence[Group], keys: Sequence[str], sets: EvalSets) -> list[str]:
    """Columns shown only when they say something: the evaluation set when the groups span several, how many runs
    shared a GPU when any run did (every run records gpu_shared, false included), and the target's columns when
    runs were trained to one."""
    cols = []
    if (len(sets.fingerprints) > 1 or sets.mixed) and EVAL_KEY not in keys:
        cols.append(EVAL_KEY)
    if any(r.row.get(SHARED_KEY) for g in groups for r in g.runs):
        cols.append(SHARED_KEY)
    if any(r.row.get("reached") is not None for g in groups for r in g.ok):
        cols.extend(TARGET_KEYS)
    if any(g.repeated_data for g in groups):
        cols.append(EPOCHS_KEY)
    return cols


def repeated_note(groups: Sequence[Group]) -> list[str]:
    """The footnote of REPEATED_MARK, when a group carries it."""
    marked = [g for g in groups if g.repeated_data]
    if not marked:
        return []
    runs = sum((r.epochs or 0.0) > 1.0 for g in marked for r in g.ok)
    return [
        f"{REPEATED_MARK} {runs} ok run(s) in {len(marked)} group(s) saw their training data more than once "
        f"(column {EPOCHS_KEY}: the most passes in the group): their val_bpb measures memorising repeated text as "
        f"much as predicting new text, and does not compare with runs that saw it once; train on more data (e.g. "
        f"data=fineweb_sp1024) or fewer tokens"
    ]


def shared_note(groups: Sequence[Group]) -> list[str]:
    """A line when some ok runs shared their GPU: their throughput is not comparable with a card's alone."""
    ok = [r for g in groups for r in g.ok]
    shared = sum(bool(r.row.get(SHARED_KEY)) for r in ok)
    if not shared:
        return []
    return [
        f"{shared} of {len(ok)} ok run(s) shared their GPU with other jobs (jobs_per_gpu > 1; column "
        f"{SHARED_KEY} counts them): their tokens_per_s, mfu and peak_mem_mb are not the card's alone"
    ]


def _extra(g: Group, col: str) -> Any:
    if col == EVAL_KEY:
        return ",".join(g.fingerprints()) or "null"
    if col == "reached":
        trained_to_target = [r for r in g.ok if r.row.get("reached") is not None]
        return f"{g.count('reached')}/{len(trained_to_target)}"
    if col == "time_to_target":
        times = g.metric("time_to_target")  # null where the run did not reach it: left out, counted in `reached`
        return mean_std_cell(mean(times), std(times), "{:.1f}")
    if col == EPOCHS_KEY:
        return g.epochs
    return g.count(col)


def verdict(g: Group, alpha: float, holm: bool = False) -> list[str]:
    """delta, p, [the Holm-adjusted p when ``holm``] and the verdict of a group against its baseline, as table
    cells. The verdict reads the adjusted p when there is one."""
    blank = ["", "", ""] if holm else ["", ""]
    if g.is_baseline:
        return [*blank, "baseline"]
    if g.baseline is None:
        return [*blank, "no baseline group"]
    if g.untested:
        return [*blank, g.untested]
    if g.welch is None:
        return [*blank, "n < 2"]
    w = g.welch
    p = g.p_holm if holm and g.p_holm is not None else w.p
    return [
        f"{w.delta:+.4f}",
        fmt_p(w.p),
        *([fmt_p(p)] if holm else []),
        f"{FINDING[w.alternative]} ({'Holm ' if holm else ''}p<{alpha:g})" if p < alpha else "not significant",
    ]


FINDING = {"less": "better", "greater": "worse", "two-sided": "differs"}
"""The verdict's word for a significant result, per H1 (speedrun.stats.ALTERNATIVES; lower is better)."""


def table_rows(
    groups: Sequence[Group],
    keys: Sequence[str],
    metrics: dict[str, str],
    extras: Sequence[str],
    ranked: bool = False,
    alpha: float | None = None,
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: [#], the keys (or "combination"), extras, n (ok runs), failures, [not_run], the first
    metric, [delta, p, verdict when ``alpha`` is given: a baseline was compared], the other metrics."""
    first, *others = metrics
    show_not_run = any(g.not_run for g in groups)
    holm = tested_count(groups) > 1
    headers = (["#"] if ranked else []) + (list(keys) or ["combination"]) + list(extras) + ["n", "failures"]
    headers += (["not_run"] if show_not_run else []) + [first]
    headers += (["delta", "p", *([HOLM] if holm else []), "verdict"] if alpha is not None else []) + others
    rows = []
    for g in groups:
        row = ([g.rank] if ranked else []) + ([g.values[k] for k in keys] if keys else ["(all)"])
        row += [fmt_number(_extra(g, c), "{}") for c in extras] + [str(len(g.ok)), str(g.failures)]
        row += ([str(g.not_run)] if show_not_run else []) + [_cell(g, first, metrics[first])]
        row += (verdict(g, alpha, holm) if alpha is not None else []) + [_cell(g, m, metrics[m]) for m in others]
        rows.append(row)
    return headers, rows


def _cell(g: Group, metric: str, spec: str) -> str:
    xs = g.metric(metric)
    cell = mean_std_cell(mean(xs), std(xs), spec)
    return f"{cell} {REPEATED_MARK}" if cell and metric in QUALITY and g.repeated_data else cell


def ttest_rows(groups: Sequence[Group], metric: str, alpha: float) -> tuple[list[str], list[list[str]]]:
    """One row per group that has a baseline group: both samples, the difference and the test."""
    keys = list(groups[0].values) if groups else []
    holm = tested_count(groups) > 1
    headers = keys + ["n", "mean", "std", "n_base", "mean_base", "std_base", "delta", "t", "df", "p"]
    headers += [HOLM, "verdict"] if holm else ["verdict"]
    rows = []
    for g in groups:
        if g.baseline is None:
            continue
        a, b = g.metric(metric), g.baseline.metric(metric)
        w = g.welch
        rows.append(
            [g.values[k] for k in keys]
            + [
                str(len(a)),
                fmt_number(mean(a), "{:.4f}"),
                fmt_number(std(a), "{:.4f}"),
                str(len(b)),
                fmt_number(mean(b), "{:.4f}"),
                fmt_number(std(b), "{:.4f}"),
                f"{w.delta:+.4f}" if w else "",
                f"{w.t:.3f}" if w else "",
                f"{w.df:.1f}" if w else "",
                fmt_p(w.p) if w else "",
                *([fmt_p(g.p_holm) if w and g.p_holm is not None else ""] if holm else []),
                verdict(g, alpha, holm)[-1],
            ]
        )
    return headers, rows


def holm_note(groups: Sequence[Group]) -> str:
    """The line saying the p-values were Holm-adjusted, when more than one group was tested ("" otherwise)."""
    k = tested_count(groups)
    if k < 2:
        return ""
    return (
        f"{k} groups tested against a baseline: p (Holm) is Holm's step-down adjustment of p over those {k} tests "
        "(family-wise error at alpha), and the verdict reads it\n"
    )


def groups_csv(groups: Sequence[Group], keys: Sequence[str], metrics: Sequence[str], extras: Sequence[str]) -> str:
    """The one CSV layout (leaderboard.csv and summary.csv), plain numbers: the keys (or "combination"), extras,
    rank, n (ok runs), failures, not_run, seeds, <metric>_mean and <metric>_std, then the baseline comparison
    (baseline: "self" or the baseline group's label; delta, t, df, p of the Welch test)."""
    cols = (list(keys) or ["combination"]) + list(extras) + ["rank", "n", "failures", "not_run", "seeds"]
    cols += [f"{m}_{s}" for m in metrics for s in ("mean", "std")] + COMPARISON
    rows = []
    for g in groups:
        row: dict[str, Any] = {**g.values} if keys else {"combination": "(all)"}
        row.update({c: _extra(g, c) for c in extras})
        row.update(rank=g.rank, n=len(g.ok), failures=g.failures, not_run=g.not_run, seeds=g.seeds)
        for m in metrics:
            xs = g.metric(m)
            row[f"{m}_mean"], row[f"{m}_std"] = mean(xs), std(xs)
        row["baseline"] = "self" if g.is_baseline else g.baseline.label() if g.baseline is not None else None
        if g.welch is not None:
            row.update(delta=g.welch.delta, t=g.welch.t, df=g.welch.df, p=g.welch.p, p_holm=g.p_holm)
        rows.append(row)
    return csv_text(cols, rows)
