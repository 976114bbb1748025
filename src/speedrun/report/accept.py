"""``python -m speedrun.report --accept pgolf``: would a contest accept each group, by its own statistics.

The rule and its numbers are the track's (conf/track/<name>.yaml, ``acceptance``; speedrun.config.track), never
repeated here. parameter-golf (``improve_by``): a candidate's mean ``val_loss`` over seeds must be lower than the
baseline's (the standing record) by at least ``margin`` nats at p < ``p_value``, by a one-sided Welch t-test of H1
mean(candidate) - mean(baseline) < -margin, i.e. the Welch test of the candidate's values shifted up by the margin.
modded-nanogpt (``below``): the mean must be under ``threshold`` at p < ``p_value`` (a one-sample t-test; its
time-to-target view is ``--target``). Several groups judged at once are Holm-corrected, and the verdict reads the
adjusted p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speedrun.config.track import TrackConfig
from speedrun.config.track_rules import load_track
from speedrun.report.groups import Group
from speedrun.stats import Below, Welch, holm, mean, ttest_below, welch
from speedrun.tables import fmt_number, fmt_p

SHORT_NAMES = {"pgolf": "pgolf_10min_16mb", "mng": "mng_124m"}
"""--accept's short spellings: the contest's record track."""
MIN_SEEDS = 2
"""A Welch or one-sample t-test needs two values a side to estimate a spread."""


def parse_accept(text: str) -> TrackConfig:
    """--accept's track (pgolf, mng, or a conf/track/ name); ValueError naming the choices for another, or for a
    track that states no acceptance rule."""
    try:
        track = load_track(SHORT_NAMES.get(text, text))
    except ValueError as e:
        raise ValueError(f"--accept {text}: {e} (or pgolf, mng)") from None
    if track.acceptance.rule is None or track.acceptance.metric is None:
        raise ValueError(
            f"--accept {text}: track {track.name} states no acceptance rule; use --accept pgolf (parameter-golf's "
            "record track) or --accept mng (modded-nanogpt's)"
        )
    rule = track.acceptance
    needs = {"improve_by": ("margin", "p_value"), "below": ("threshold", "p_value")}[str(rule.rule)]
    missing = [f"track.acceptance.{k}" for k in needs if getattr(rule, k) is None]
    if missing:
        raise ValueError(
            f"--accept {text}: track {track.name}'s {rule.rule} rule has no {' or '.join(missing)}; set it in "
            f"conf/track/{track.name}.yaml"
        )
    return track


@dataclass
class Judged:
    """One candidate group under the rule."""

    group: Group
    values: list[float]
    base: list[float]
    """The baseline's values (improve_by); empty for ``below``."""
    test: Welch | Below | None
    p_holm: float | None = None
    untested: str = ""

    @property
    def diff(self) -> float | None:
        """mean - baseline mean (improve_by), mean - threshold (below)."""
        return self.test.delta if isinstance(self.test, Below) else _diff(self.values, self.base)


def _diff(a: Sequence[float], b: Sequence[float]) -> float | None:
    ma, mb = mean(a), mean(b)
    return None if ma is None or mb is None else ma - mb


def judge(track: TrackConfig, groups: Sequence[Group]) -> list[Judged]:
    """The candidates and their tests, Holm-adjusted over every test made. improve_by judges the groups that have
    a baseline (compare() paired them); below judges every group that is not a baseline."""
    rule, metric = track.acceptance, str(track.acceptance.metric)
    out = []
    for g in groups:
        values = g.metric(metric)
        if rule.rule == "below":
            if not g.is_baseline:
                out.append(Judged(g, values, [], ttest_below(values, float(rule.threshold or 0.0))))
            continue
        if g.baseline is None:
            continue
        base = g.baseline.metric(metric)
        if g.untested:
            out.append(Judged(g, values, base, None, untested=g.untested))
            continue
        margin = float(rule.margin or 0.0)
        out.append(Judged(g, values, base, welch([v + margin for v in values], base, "less")))
    tested = [j for j in out if j.test is not None]
    for j, p in zip(tested, holm([j.test.p for j in tested if j.test is not None])):
        j.p_holm = p
    return out


def verdict(j: Judged, track: TrackConfig) -> str:
    """accepted / not accepted, or what is missing to test."""
    if j.untested:
        return f"not tested: {j.untested}"
    if j.test is None:
        sides = [("candidate", j.values)] + ([("baseline", j.base)] if track.acceptance.rule == "improve_by" else [])
        short = [f"{who} has {len(xs)}" for who, xs in sides if len(xs) < MIN_SEEDS]
        more = ", ".join(f"{MIN_SEEDS - len(xs)} more for the {who}" for who, xs in sides if len(xs) < MIN_SEEDS)
        return (
            f"too few seeds: {', '.join(short)} ok run(s) with {track.acceptance.metric}; the test needs >= "
            f"{MIN_SEEDS} per group (run {more})"
        )
    p = j.p_holm if j.p_holm is not None else j.test.p
    return "accepted" if p < float(track.acceptance.p_value or 0.0) else "not accepted"


def accept_table(
    track: TrackConfig, judged: Sequence[Judged], keys: Sequence[str]
) -> tuple[list[str], list[str], list[list[str]]]:
    """Notes, headers and rows of the --accept section."""
    rule = track.acceptance
    several = sum(j.test is not None for j in judged) > 1
    improve = rule.rule == "improve_by"
    headers = [
        *keys,
        "n",
        *(["n_base", "mean", "mean_base", "diff", "margin"] if improve else ["mean", "threshold", "diff"]),
    ]
    headers += ["t", "df", "p", *(["p (Holm)"] if several else []), "verdict"]
    rows = []
    for j in judged:
        t = j.test
        cells = [j.group.values[k] for k in keys] + [str(len(j.values))]
        if improve:
            cells += [str(len(j.base)), fmt_number(mean(j.values), "{:.4f}"), fmt_number(mean(j.base), "{:.4f}")]
            cells += [fmt_number(j.diff, "{:+.4f}"), f"-{rule.margin:g}"]
        else:
            cells += [fmt_number(mean(j.values), "{:.4f}"), f"{rule.threshold:g}", fmt_number(j.diff, "{:+.4f}")]
        cells += [f"{t.t:.3f}", f"{t.df:.1f}", fmt_p(t.p)] if t else ["", "", ""]
        cells += [fmt_p(j.p_holm) if j.p_holm is not None else ""] if several else []
        rows.append([*cells, verdict(j, track)])
    return accept_notes(track, judged, several), headers, rows


def accept_notes(track: TrackConfig, judged: Sequence[Judged], several: bool) -> list[str]:
    rule, metric = track.acceptance, track.acceptance.metric
    source = f" (source: {', '.join(track.sources)})" if track.sources else ""
    if rule.rule == "improve_by":
        how = (
            f"one-sided Welch t-test over seeds of H1 mean(candidate) - mean(baseline) < -{rule.margin:g}: t = "
            f"(diff + {rule.margin:g}) / its standard error; diff: mean {metric} - the baseline's"
        )
    else:
        how = f"one-sided one-sample t-test over seeds of H1 mean {metric} < {rule.threshold:g}; diff: mean - {rule.threshold:g}"
    notes = [f"{track.name} ({track.contest}) accepts: {rule.text()}{source}", how]
    if several:
        tested = sum(j.test is not None for j in judged)
        notes.append(
            f"{tested} groups judged at once: p (Holm) is Holm's step-down adjustment over those {tested} tests, "
            f"and the verdict reads it (p is each test alone)"
        )
    if not judged:
        notes.append(
            "no group to judge: "
            + ("name the baseline group with --baseline KEY=VALUE" if rule.rule == "improve_by" else "no group")
        )
    return notes
