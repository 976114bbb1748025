"""``python -m speedrun.report --accept pgolf``: would a contest accept each group, by its own statistics.

The rule and its numbers are the track's (conf/track/<name>.yaml, ``acceptance``; speedrun.config.track), never
repeated here. parameter-golf (``improve_by``): a submission is scored on its ``scored_loss`` (TTT's loss when TTT
scored every token, else the quantized artifact's; never the float model's val_loss), and a record must beat the
standing record's mean by at least ``margin`` nats at p < ``p_value``, over ``min_seeds`` seeds. As the records do,
the candidate's seeds are tested against the standing record's *published* mean by a one-sided one-sample t-test of
H1 mean < record - margin; the record is the best merged one of the candidate's data (conf/track/records/), or the one
``--record`` names (a folder, a PR, or its numbers). Where ``--baseline`` names a group whose seeds are in the
database, the test is the margin-shifted one-sided Welch test against them instead. No correction for several
candidates unless ``--holm`` asks (the contest applies none). modded-nanogpt (``below``): the mean must be under
``threshold`` at p < ``p_value`` (a one-sample t-test; its time-to-target view is ``--target``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from speedrun.config.track import SCORED_LOSS, TrackConfig, scored_keys
from speedrun.config.track_rules import PublishedRecord, find_record, load_track, standing_record
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


@dataclass(frozen=True)
class Reference:
    """The published numbers a candidate is tested against: a merged record's, or the ones given on the command
    line."""

    label: str
    val_loss: float | None
    """Mean nats per token (None: not published; then its val_bpb is converted with the candidate's own ratio)."""
    val_bpb: float | None = None
    std: float | None = None
    n: int | None = None
    data: str | None = None
    """The data setting it was scored on (None: not known, e.g. numbers given by hand)."""
    source: str = ""
    short: str = ""
    """The table's name for it (PR #N)."""

    @classmethod
    def published(cls, r: PublishedRecord, track: str) -> Reference:
        return cls(
            label=r.label(),
            val_loss=r.val_loss,
            val_bpb=r.val_bpb,
            std=r.val_loss_std,
            n=r.n,
            data=r.data,
            source=f"conf/track/records/{track}.yaml ({r.date})",
            short=f"PR #{r.pr}" if r.pr else r.folder,
        )


def parse_record(track: TrackConfig, text: str) -> Reference:
    """--record: a merged record of the track's table (its folder, or its PR as 1855 or #1855), or the standing
    record's numbers as ``val_loss=MEAN[,std=S,n=N,val_bpb=B]``; ValueError naming the form for anything else."""
    if "=" not in text:
        return Reference.published(find_record(str(track.name), text), str(track.name))
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in ("val_loss", "std", "n", "val_bpb"):
            raise ValueError(
                f"--record {text}: {part!r} is not val_loss=, std=, n= or val_bpb=; e.g. val_loss=2.3220,n=3"
            )
        fields[key.strip()] = value.strip()
    try:
        numbers = {k: float(v) for k, v in fields.items()}
    except ValueError:
        raise ValueError(f"--record {text}: every value must be a number, e.g. val_loss=2.3220,std=0.002,n=3") from None
    if "val_loss" not in numbers:
        raise ValueError(f"--record {text}: give the record's mean loss in nats, val_loss=MEAN")
    n = numbers.get("n")
    return Reference(
        label="--record",
        val_loss=numbers["val_loss"],
        val_bpb=numbers.get("val_bpb"),
        std=numbers.get("std"),
        n=None if n is None else int(n),
        source="given on the command line",
        short="--record",
    )


@dataclass
class Judged:
    """One candidate group under the rule."""

    group: Group
    values: list[float]
    """The judged loss of each ok run (the track's metric), nats."""
    base: list[float]
    """The baseline's values (Welch against --baseline); empty otherwise."""
    test: Welch | Below | None
    bpbs: list[float] | None = None
    """The runs' bpb beside ``values`` (None where some run lacks one)."""
    loss_key: str = ""
    """Which result key(s) the values came from: val_loss_ttt, val_loss_quant, or both."""
    reference: Reference | None = None
    """The published record tested against (one-sample); None for Welch against a baseline and for ``below``."""
    reference_loss: float | None = None
    """The record's mean nats as tested (its published val_loss, or its val_bpb converted: ``converted``)."""
    converted: bool = False
    base_bpbs: list[float] | None = None
    p_holm: float | None = None
    untested: str = ""

    @property
    def diff(self) -> float | None:
        """mean - the record's (or baseline's) mean, nats; mean - threshold for ``below``."""
        if isinstance(self.test, Below) and self.reference is None:
            return self.test.delta
        ref = self.reference_loss if self.reference is not None else mean(self.base)
        m = mean(self.values)
        return None if m is None or ref is None else m - ref

    @property
    def diff_bpb(self) -> float | None:
        m = mean(self.bpbs) if self.bpbs else None
        ref = self.reference.val_bpb if self.reference is not None else (mean(self.base_bpbs or []))
        return None if m is None or ref is None else m - ref

    @property
    def how(self) -> str:
        if isinstance(self.test, Welch):
            return "Welch t-test against the baseline's seeds"
        return "one-sample t-test"


def scored_values(g: Group, metric: str) -> tuple[list[float], list[float] | None, str]:
    """(losses, bpbs or None, the keys they came from) of a group's ok runs for the track's metric."""
    if metric != SCORED_LOSS:
        bpb_key = metric.replace("val_loss", "val_bpb")
        losses = g.metric(metric)
        bpbs = g.metric(bpb_key)
        return losses, (bpbs if len(bpbs) == len(losses) else None), metric
    losses, bpbs, keys = [], [], []
    for run in g.ok:
        pair = scored_keys(run.row)
        if pair is None:
            continue
        losses.append(float(run.row[pair[0]]))
        bpb = run.row.get(pair[1])
        bpbs.append(float(bpb) if isinstance(bpb, (int, float)) and math.isfinite(bpb) else math.nan)
        keys.append(pair[0])
    good_bpbs = None if any(math.isnan(b) for b in bpbs) else bpbs
    return losses, good_bpbs, "+".join(dict.fromkeys(keys)) or "none"


def judge(
    track: TrackConfig, groups: Sequence[Group], record: Reference | None = None, correct: bool = False
) -> list[Judged]:
    """The candidates and their tests. improve_by: each group that is not a baseline, against its --baseline group
    (Welch) where compare() paired one, else against ``record`` or the standing record of its data (one-sample);
    below: every group that is not a baseline. ``correct``: Holm-adjust the p-values over every test made."""
    rule, metric = track.acceptance, str(track.acceptance.metric)
    out = []
    for g in groups:
        if g.is_baseline:
            continue
        values, bpbs, key = scored_values(g, metric)
        if rule.rule == "below":
            out.append(Judged(g, values, [], ttest_below(values, float(rule.threshold or 0.0)), bpbs, key))
            continue
        margin = float(rule.margin or 0.0)
        if g.baseline is not None:
            base, base_bpbs, _ = scored_values(g.baseline, metric)
            j = Judged(g, values, base, None, bpbs, key, base_bpbs=base_bpbs, untested=g.untested)
            if not g.untested:
                j.test = welch([v + margin for v in values], base, "less")
            out.append(j)
            continue
        out.append(_against_record(track, g, values, bpbs, key, record))
    if correct:
        tested = [j for j in out if j.test is not None]
        for j, p in zip(tested, holm([j.test.p for j in tested if j.test is not None])):
            j.p_holm = p
    return out


def _against_record(
    track: TrackConfig, g: Group, values: list[float], bpbs: list[float] | None, key: str, record: Reference | None
) -> Judged:
    data = sorted({str(r.row.get("data")) for r in g.ok})
    ref = record
    if ref is None:
        found = standing_record(str(track.name), data[0]) if len(data) == 1 else None
        if found is None:
            why = (
                f"no merged record of data={', '.join(data) or '?'} in conf/track/records/{track.name}.yaml: give "
                "the standing record with --record FOLDER|PR|val_loss=MEAN"
            )
            return Judged(g, values, [], None, bpbs, key, untested=why)
        ref = Reference.published(found, str(track.name))
    j = Judged(g, values, [], None, bpbs, key, reference=ref)
    if ref.data is not None and data != [ref.data]:
        j.untested = (
            f"{ref.label} was scored on data={ref.data}, these runs on data={', '.join(data)}: nats per token do "
            "not compare across tokenizers; name a record of the same data with --record"
        )
        return j
    j.reference_loss = ref.val_loss
    if ref.val_loss is None and ref.val_bpb is not None and bpbs:
        # one tokenizer and validation set: nats / bpb is their fixed ln 2 x bytes / tokens, the runs' own
        j.reference_loss, j.converted = ref.val_bpb * (mean([v / b for v, b in zip(values, bpbs)]) or 0.0), True
    if j.reference_loss is None:
        j.untested = f"{ref.label} publishes no val_loss and these runs no bpb to convert its val_bpb with"
        return j
    j.test = ttest_below(values, j.reference_loss - float(track.acceptance.margin or 0.0))
    return j


def verdict(j: Judged, track: TrackConfig) -> str:
    """accepted / not accepted, or what is missing to test."""
    if j.untested:
        return f"not tested: {j.untested}"
    if j.test is None:
        sides = [("candidate", j.values)] + ([("baseline", j.base)] if j.group.baseline is not None else [])
        short = [f"{who} has {len(xs)}" for who, xs in sides if len(xs) < MIN_SEEDS]
        more = ", ".join(f"{MIN_SEEDS - len(xs)} more for the {who}" for who, xs in sides if len(xs) < MIN_SEEDS)
        return (
            f"too few seeds: {', '.join(short)} ok run(s) with {track.acceptance.metric}; the test needs >= "
            f"{MIN_SEEDS} per group (run {more})"
        )
    p = j.p_holm if j.p_holm is not None else j.test.p
    if p >= float(track.acceptance.p_value or 0.0):
        return "not accepted"
    seeds = track.acceptance.min_seeds
    if seeds and len(j.values) < seeds:
        return f"not accepted: {len(j.values)} seeds, the track asks >= {seeds} (p would pass)"
    return "accepted"


def verdict_line(j: Judged, track: TrackConfig) -> str:
    """One line a judge can sign: the verdict, the loss judged, the delta in nats and bpb against what, p and n."""
    label = j.group.label() or "all runs"
    head = f"{label}: {verdict(j, track)}"
    if j.test is None or (track.acceptance.rule == "below" and j.reference is None):
        if j.test is None:
            return head
        return (
            f"{head}; {j.loss_key} mean {mean(j.values):.5f} vs threshold {track.acceptance.threshold:g}: "
            f"{j.test.delta:+.5f} nats, p={fmt_p(j.test.p)}, n={len(j.values)} (one-sample t-test)"
        )
    against = (
        j.reference.label
        if j.reference is not None
        else f"baseline {j.group.baseline.label() if j.group.baseline else ''}"
    )
    bpb = f" ({j.diff_bpb:+.5f} bpb)" if j.diff_bpb is not None else ""
    holm_p = f", Holm-adjusted {fmt_p(j.p_holm)}" if j.p_holm is not None else ""
    converted = " (its val_bpb in nats by these runs' ratio)" if j.converted else ""
    return (
        f"{head}; {j.loss_key} mean {mean(j.values):.5f} vs {against} {_ref_mean(j):.5f}{converted}: "
        f"{j.diff:+.5f} nats{bpb}, margin {track.acceptance.margin:g}, p={fmt_p(j.test.p)}{holm_p}, "
        f"n={len(j.values)} ({j.how})"
    )


def _ref_mean(j: Judged) -> float:
    ref = j.reference_loss if j.reference is not None else mean(j.base)
    return math.nan if ref is None else ref


def accept_table(
    track: TrackConfig, judged: Sequence[Judged], keys: Sequence[str]
) -> tuple[list[str], list[str], list[list[str]]]:
    """Notes, headers and rows of the --accept section."""
    rule = track.acceptance
    several = any(j.p_holm is not None for j in judged)
    improve = rule.rule == "improve_by"
    headers = [*keys, "n", "loss"]
    headers += (
        ["mean", "against", "mean_ref", "diff", "diff_bpb", "margin"] if improve else ["mean", "threshold", "diff"]
    )
    headers += ["t", "df", "p", *(["p (Holm)"] if several else []), "verdict"]
    rows = []
    for j in judged:
        t = j.test
        cells = [j.group.values[k] for k in keys] + [str(len(j.values)), j.loss_key]
        if improve:
            against = j.reference.short if j.reference is not None else ("baseline" if j.group.baseline else "")
            cells += [fmt_number(mean(j.values), "{:.5f}"), against, fmt_number(_ref_or_none(j), "{:.5f}")]
            cells += [fmt_number(j.diff, "{:+.5f}"), fmt_number(j.diff_bpb, "{:+.5f}"), f"-{rule.margin:g}"]
        else:
            cells += [fmt_number(mean(j.values), "{:.4f}"), f"{rule.threshold:g}", fmt_number(j.diff, "{:+.4f}")]
        cells += [f"{t.t:.3f}", f"{t.df:.1f}", fmt_p(t.p)] if t else ["", "", ""]
        cells += [fmt_p(j.p_holm) if j.p_holm is not None else ""] if several else []
        rows.append([*cells, verdict(j, track)])
    return accept_notes(track, judged, several), headers, rows


def _ref_or_none(j: Judged) -> float | None:
    value = _ref_mean(j)
    return None if math.isnan(value) else value


def accept_notes(track: TrackConfig, judged: Sequence[Judged], several: bool) -> list[str]:
    rule, metric = track.acceptance, track.acceptance.metric
    source = f" (source: {', '.join(track.sources)})" if track.sources else ""
    what = (
        f"{metric}: TTT's loss when it scored every token, else the quantized artifact's (what a submission is "
        "scored on), nats per token"
        if metric == SCORED_LOSS
        else f"{metric}, nats per token"
    )
    notes = [f"{track.name} ({track.contest}) accepts: {rule.text()}{source}", f"judged: {what}"]
    if rule.rule == "improve_by":
        notes.append(
            f"one-sample: one-sided t-test over seeds of H1 mean < the record's published mean - {rule.margin:g}; "
            f"Welch (a --baseline group): of H1 mean - mean(baseline) < -{rule.margin:g}; diff: mean - the record's"
        )
        refs = {j.reference.label: j.reference for j in judged if j.reference is not None}
        for ref in refs.values():
            spread = f", std {ref.std:g}" if ref.std is not None else ""
            seeds = f", n {ref.n}" if ref.n is not None else ""
            loss = f"val_loss {ref.val_loss:g}" if ref.val_loss is not None else "no val_loss published"
            bpb = f", val_bpb {ref.val_bpb:g}" if ref.val_bpb is not None else ""
            notes.append(f"record {ref.label}: {loss}{bpb}{spread}{seeds} ({ref.source})")
    else:
        notes.append(f"one-sided one-sample t-test over seeds of H1 mean {metric} < {rule.threshold:g}")
    if several:
        tested = sum(j.test is not None for j in judged)
        notes.append(
            f"{tested} groups judged at once, --holm: p (Holm) is Holm's step-down adjustment over those {tested} "
            "tests, and the verdict reads it (p is each test alone)"
        )
    if not judged:
        notes.append("no group to judge")
    return notes


def judge_results(track: TrackConfig, results: Sequence[dict], record: Reference | None = None) -> Judged:
    """The acceptance test of one set of seeds given as result dicts (the export's runs), against ``record`` or the
    standing record of their data."""
    from speedrun.report.run_rows import Run

    group = Group(values={}, runs=[Run.from_row(dict(r)) for r in results])
    values, bpbs, key = scored_values(group, str(track.acceptance.metric))
    return _against_record(track, group, values, bpbs, key, record)
