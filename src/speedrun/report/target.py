"""``python -m speedrun.report --target val_loss=3.28``: time to target, modded-nanogpt's metric.

Runs trained with that target (budget.target_val_loss / target_val_bpb, recorded as target_metric and
target_value) are grouped as the leaderboard groups them; each group is ranked by its mean time_to_target (train
seconds at the first periodic evaluation at or below the target, evaluations excluded) over the seeds that reached
it. Seeds that did not reach it stay in the table, counted in ``reached`` (k/n), but have no time to average. The
acceptance test is on the final evaluation of every ok seed: a one-sided one-sample t-test of H1 "the mean final
metric is below the target", accepted at p < 0.01 (modded-nanogpt's rule for a record). With a baseline, each
group's time_to_target is compared with its baseline's by the one-sided Welch t-test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from speedrun.config.track_rules import load_track
from speedrun.report.groups import Group, compare, group_runs, tested_count
from speedrun.report.run_rows import Run
from speedrun.stats import Below, mean, std, ttest_below
from speedrun.tables import fmt_number, fmt_p, mean_std_cell

TARGET_METRICS = ("val_loss", "val_bpb")
ACCEPT_TRACK = "mng_124m"
"""modded-nanogpt accepts a record when the mean final val loss over seeds is below the target at the p-value its
track states (conf/track/mng_124m.yaml, acceptance.p_value)."""


def accept_p() -> float:
    """The acceptance test's level, from modded-nanogpt's track."""
    return float(load_track(ACCEPT_TRACK).acceptance.p_value or 0.0)


def parse_target(text: str) -> tuple[str, float]:
    """``val_loss=3.28`` -> ("val_loss", 3.28); ValueError naming the expected form otherwise."""
    metric, sep, value = text.partition("=")
    metric = metric.strip()
    try:
        number = float(value) if sep else math.nan
    except ValueError:
        number = math.nan
    if metric not in TARGET_METRICS or not math.isfinite(number) or number <= 0:
        raise ValueError(
            f"--target {text}: expected METRIC=VALUE with METRIC one of {', '.join(TARGET_METRICS)} and VALUE a "
            "number > 0, e.g. --target val_loss=3.28"
        )
    return metric, number


def with_target(runs: Sequence[Run], metric: str, value: float) -> list[Run]:
    """The runs trained with this target (their recorded target_metric and target_value)."""
    return [
        r
        for r in runs
        if r.row.get("target_metric") == metric
        and isinstance(r.row.get("target_value"), (int, float))
        and math.isclose(float(r.row["target_value"]), value, rel_tol=1e-9)
    ]


@dataclass
class TargetRow:
    group: Group
    reached: int
    times: list[float]
    """time_to_target of the ok seeds that reached the target."""
    steps: list[float]
    final: list[float]
    """The final evaluation's metric of every ok seed (reached or not): what the acceptance test reads."""
    below: Below | None
    rank: str = ""


def target_rows(runs: Sequence[Run], keys: Sequence[str], metric: str, value: float) -> list[TargetRow]:
    """One row per group of ``runs`` (already those with the target), ranked by mean time_to_target; groups where
    no seed reached it come last, unranked ("-")."""
    rows = []
    for g in group_runs([r for r in runs if r.status != "running"], keys):
        reached = [r for r in g.ok if r.row.get("reached")]  # the database stores true as 1
        final = g.metric(metric)
        rows.append(
            TargetRow(
                group=g,
                reached=len(reached),
                times=[float(r.row["time_to_target"]) for r in reached if r.row.get("time_to_target") is not None],
                steps=[float(r.row["steps_to_target"]) for r in reached if r.row.get("steps_to_target") is not None],
                final=final,
                below=ttest_below(final, value),
            )
        )
    rows.sort(key=lambda t: (not t.times, mean(t.times) or 0.0))
    for i, t in enumerate(rows, 1):
        t.rank = str(i) if t.times else "-"
    return rows


def target_table(
    runs: Sequence[Run], keys: Sequence[str], metric: str, value: float, baseline: dict[str, str]
) -> tuple[list[str], list[str], list[list[str]]]:
    """The --target section: notes (what the columns mean, what was left out), headers and rows."""
    chosen = with_target(runs, metric, value)
    rows = target_rows(chosen, keys, metric, value)
    if baseline:  # Welch on time_to_target: unreached seeds have none and drop out of both samples
        compare([t.group for t in rows], baseline, "time_to_target")
    holm = tested_count([t.group for t in rows]) > 1
    notes = [
        f"runs trained with budget.target_{metric}={value:g}; #: rank by mean time_to_target "
        "(train seconds at the first periodic evaluation at or below the target, evaluations excluded) over the "
        "seeds that reached it",
        "reached: ok seeds that reached it / ok seeds; the others are counted there, not dropped, but their time is "
        "not averaged in (they have none)",
        f"final {metric}: mean ± std of the final evaluation over all ok seeds; p: one-sided one-sample t-test of "
        f"H1 mean final {metric} < {value:g}; accepted: p < {accept_p():g} (modded-nanogpt's acceptance rule)",
    ]
    if baseline:
        notes.append(
            f"baseline {', '.join(f'{k}={v}' for k, v in baseline.items())}: one-sided Welch t-test of H1 the "
            "group's mean time_to_target is lower than its baseline's (reached seeds only)"
            + ("; p (Holm): adjusted over the groups tested (Holm's step-down method)" if holm else "")
        )
    left_out = len(runs) - len(chosen)
    if left_out:
        notes.append(
            f"{left_out} selected run(s) trained without this target (budget.target_{metric}={value:g}): not in "
            "this table"
        )
    headers = [*keys, "#", "reached", "time_to_target s", "steps_to_target", f"final {metric}", "p", "accepted"]
    if baseline:
        headers += ["delta s vs baseline", "p (Welch)", *(["p (Holm)"] if holm else [])]
    table = []
    for t in rows:
        g = t.group
        cells = [g.values[k] for k in keys] + [
            t.rank,
            f"{t.reached}/{len(g.ok)}" + (f" ({g.failures} failed)" if g.failures else ""),
            mean_std_cell(mean(t.times), std(t.times), "{:.2f}"),
            fmt_number(mean(t.steps), "{:.0f}"),
            mean_std_cell(mean(t.final), std(t.final), "{:.4f}"),
            fmt_p(t.below.p) if t.below else "n<2",
            ("yes" if t.below.p < accept_p() else "no") if t.below else "",
        ]
        if baseline:
            w = g.welch
            if g.is_baseline or not w:
                cells += ["baseline" if g.is_baseline else g.untested, "", *([""] if holm else [])]
            else:
                cells += [f"{w.delta:+.2f}", fmt_p(w.p), *([fmt_p(g.p_holm or w.p)] if holm else [])]
        table.append(cells)
    return notes, headers, table
