"""Grouping and statistics, the one path for the report and the sweep summary: which keys make a group, the runs
of each group (its repeats), their failures and metrics, the baseline each group is tested against (Welch
t-test, speedrun.stats), which evaluation sets the runs were scored on, and the rank of each group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speedrun.report.run_rows import NOT_RUN, OK, Run, canon, is_failure, varying_keys
from speedrun.stats import Welch, finite, holm, mean, welch
from speedrun.tables import display

DEVICE_KEYS = ("hardware", "device_name")
"""Result columns added to the default group keys when they vary: a profile (hardware=h100) covers several cards
(an H100 and an H200 both run it), and runs on different cards are never repeats of one another."""

EVAL_KEY = "eval_fingerprint"
"""The result column naming the set of tokens a run was scored on (``eval_tokens`` counts them)."""


def default_group_keys(runs: Sequence[Run], by_value: bool = True) -> list[str]:
    """The override keys that vary among the runs (seeds folded) and the DEVICE_KEYS that vary, in front: runs
    that share these are repeats of one combination. ``by_value`` drops overrides whose effective values agree
    (the report groups by what ran); the sweep summary keeps every combination it asked for."""
    keys = [k for k in varying_keys([r.overrides for r in runs]) if "/" not in k and not k.startswith("hydra")]
    if by_value:
        keys = [k for k in keys if len({canon(r.get(k)) for r in runs}) > 1]
    # counted without nulls: a job that never ran (or failed before it saw a device) names no card
    device = [k for k in DEVICE_KEYS if len({canon(r.get(k)) for r in runs} - {"null"}) > 1 and k not in keys]
    return device + keys


@dataclass(eq=False)  # identity: a group is found in lists by itself, not by its fields
class Group:
    values: dict[str, str]
    runs: list[Run]
    welch: Welch | None = None
    baseline: Group | None = None
    is_baseline: bool = False
    untested: str = ""
    """Why a group with a baseline got no test (e.g. its runs and the baseline's were scored on other tokens)."""
    rank: str = ""
    p_holm: float | None = None
    """The Welch test's p after Holm's correction over every test of the same compare() (equal to p for one)."""

    @property
    def ok(self) -> list[Run]:
        return [r for r in self.runs if r.status == OK]

    @property
    def failures(self) -> int:
        return sum(is_failure(r.status) for r in self.runs)

    @property
    def not_run(self) -> int:
        return sum(r.status == NOT_RUN for r in self.runs)

    @property
    def seeds(self) -> str:
        return " ".join(str(r.row["seed"]) for r in self.ok if r.row.get("seed") is not None)

    def metric(self, key: str) -> list[float]:
        """The finite values of a metric over the ok runs."""
        return finite(r.metric(key) for r in self.ok)

    def fingerprints(self) -> list[str]:
        """The distinct known evaluation sets of the ok runs, in first-seen order."""
        return list(dict.fromkeys(str(r.row[EVAL_KEY]) for r in self.ok if r.row.get(EVAL_KEY) is not None))

    def count(self, key: str) -> int:
        """How many ok runs have a true ``key`` (e.g. gpu_shared)."""
        return sum(bool(r.row.get(key)) for r in self.ok)

    @property
    def epochs(self) -> float | None:
        """The most passes over its training data that an ok run of the group made (Run.epochs)."""
        seen = [e for e in (r.epochs for r in self.ok) if e is not None]
        return max(seen) if seen else None

    @property
    def repeated_data(self) -> bool:
        """An ok run of the group saw its training data more than once: its quality figures are marked."""
        return (self.epochs or 0.0) > 1.0

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())


def group_runs(runs: Sequence[Run], keys: Sequence[str], asked: bool = False) -> list[Group]:
    """Runs grouped by the values of ``keys`` (compared as canon strings), in first-seen order. ``asked`` takes
    each value from the run's overrides first (a sweep's combinations), else what the run's record says; the
    DEVICE_KEYS always say what ran (``hardware=auto`` asks for no card in particular)."""
    groups: dict[tuple, Group] = {}
    for r in runs:
        values = {k: (r.asked(k) if asked and k not in DEVICE_KEYS else display(r.get(k))) for k in keys}
        groups.setdefault(tuple(canon(v) for v in values.values()), Group(values, [])).runs.append(r)
    return list(groups.values())


# ---------------------------------------------------------------------------------------------------------
# evaluation sets


@dataclass
class EvalSets:
    """Which token sets the groups' ok runs were scored on. Means of val_bpb from different sets are not
    comparable, so groups are ranked only against groups of their own set and tested only against a baseline of
    the same set; a run with no fingerprint (recorded before it was kept) is unknown and let through."""

    fingerprints: list[str]
    """Distinct known fingerprints, first seen first."""
    mixed: list[Group]
    """Groups whose own runs span several sets: their means mix evaluations, so they are neither ranked nor tested."""
    unknown: int
    """Ok runs with no fingerprint."""
    total: int
    """Ok runs."""
    tokens: dict[str, str]
    """Fingerprint -> the eval_tokens its runs scored (for the messages)."""

    def block(self, g: Group) -> str | None:
        """The set a group is ranked within: its fingerprint; None for a group of unknown runs (then ranked with
        the only known set, or apart when there are several)."""
        fps = g.fingerprints()
        return fps[0] if len(fps) == 1 else None

    def messages(self, keys: Sequence[str], how: str) -> list[str]:
        """Lines that say what the sets mean for the table below them, and how to keep sets apart. ``how`` is the
        command the hints complete (e.g. ``python -m speedrun.report --sweep s1``)."""
        out = []
        if len(self.fingerprints) > 1:
            sets = ", ".join(f"{fp} ({self.tokens.get(fp) or '?'} tokens)" for fp in self.fingerprints)
            out.append(
                f"these runs were scored on {len(self.fingerprints)} different evaluation sets "
                f"(eval_fingerprint: {sets}); a val_bpb from one set is not comparable with another's, so "
                f"groups are ranked and t-tested only against groups of their own set"
            )
        if self.mixed:
            by = ",".join([*keys, EVAL_KEY] if EVAL_KEY not in keys else keys)
            out.append(
                f"not ranked, not tested: {len(self.mixed)} group(s) mix runs scored on different evaluation "
                f"sets ({'; '.join(g.label() or '(all)' for g in self.mixed)}). Keep the sets apart with "
                f"`{how} --group-by {by}`, or take one with `{how} --where {EVAL_KEY}={self.fingerprints[0]}`"
            )
        if self.unknown and self.fingerprints:
            out.append(
                f"warning: {self.unknown} of {self.total} ok run(s) have no eval_fingerprint (recorded before "
                f"it was kept): they are compared as if scored on the same tokens, which cannot be checked"
            )
        elif self.unknown:
            out.append(
                "warning: no run records an eval_fingerprint (recorded before it was kept): that they were "
                "scored on the same tokens cannot be checked"
            )
        return out


def eval_sets(groups: Sequence[Group]) -> EvalSets:
    ok = [r for g in groups for r in g.ok]
    fps = list(dict.fromkeys(fp for g in groups for fp in g.fingerprints()))
    tokens: dict[str, str] = {}
    for r in ok:
        if r.row.get(EVAL_KEY) is not None:
            seen = tokens.setdefault(str(r.row[EVAL_KEY]), display(r.row.get("eval_tokens")))
            if seen != display(r.row.get("eval_tokens")):  # should not happen: one set has one size
                tokens[str(r.row[EVAL_KEY])] = "several"
    return EvalSets(
        fingerprints=fps,
        mixed=[g for g in groups if len(g.fingerprints()) > 1],
        unknown=sum(r.row.get(EVAL_KEY) is None for r in ok),
        total=len(ok),
        tokens={k: v for k, v in tokens.items() if v != "null"},
    )


# ---------------------------------------------------------------------------------------------------------
# baselines and ranks


def compare(groups: list[Group], baseline: dict[str, str], metric: str, alternative: str = "less") -> None:
    """Pair each group with its baseline (same other keys, baseline keys set) and run the Welch test of H1
    ``alternative`` (speedrun.stats.ALTERNATIVES: "less", the group's mean is lower), unless the two were scored on
    different evaluation sets (then ``untested`` says so). With several tests, each p is also Holm-adjusted over
    them all (``p_holm``): testing k groups at alpha each would find a false win far more often than alpha."""
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
        if len(set(g.fingerprints()) | set(base.fingerprints())) > 1:
            g.untested = "other eval set"
            continue
        g.welch = welch(g.metric(metric), base.metric(metric), alternative)
    tested = [g for g in groups if g.welch is not None]
    for g, p in zip(tested, holm([g.welch.p for g in tested if g.welch is not None])):
        g.p_holm = p


def tested_count(groups: Sequence[Group]) -> int:
    """How many groups were tested against a baseline: above one, their p-values are Holm-adjusted."""
    return sum(g.welch is not None for g in groups)


def rank_groups(groups: Sequence[Group], metric: str, sets: EvalSets) -> list[Group]:
    """Groups sorted by mean ``metric`` (lower first) within each evaluation set, the sets in first-seen order,
    with ``rank`` numbered within the set. Groups that mix sets come last, unranked ("-"), and so do groups with no
    ``metric`` from an ok run (every run failed, diverged or was not run): a rank is earned by a result."""
    order: dict[str | None, int] = {fp: i for i, fp in enumerate(sets.fingerprints)}
    separate = len(sets.fingerprints) > 1  # one known set: the unknown runs are ranked with it

    def block(g: Group) -> str | None:
        return sets.block(g) if separate else None

    def unranked(g: Group) -> bool:
        return g in sets.mixed or not g.metric(metric)

    def key(g: Group) -> tuple:
        m = mean(g.metric(metric))
        # unknown-set groups (block None) after the known sets when there are several
        return (unranked(g), order.get(block(g), len(order)), m if m is not None else 0.0)

    ranked = sorted(groups, key=key)
    counters: dict[str | None, int] = {}
    for g in ranked:
        if unranked(g):
            g.rank = "-"
            continue
        counters[block(g)] = counters.get(block(g), 0) + 1
        g.rank = str(counters[block(g)])
    return ranked
