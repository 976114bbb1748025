"""Sweeps: the summary written when a sweep ends.

A sweep dir (``outputs/multirun/<date>/<time>_<name>/``) holds one subdir per launched job, ``multirun.yaml``,
``sweep.json`` (the manifest: every combination, whether it was launched, reused by resume or not run, and
how it ended; speedrun.report.manifest) and, from the ``SweepSummary`` callback at the end, ``summary.md`` and
``summary.csv``: one row per combination with the seeds folded (n, mean and std of the metrics, failures), grouped,
counted and laid out by speedrun.report's grouping, the same as the report's leaderboard.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from speedrun.paths import results_db_path
from speedrun.records.atomic import atomic_write_text
from speedrun.report.groups import Group, default_group_keys, eval_sets, group_runs
from speedrun.report.leaderboard import (
    extra_columns,
    groups_csv,
    metrics_for,
    repeated_note,
    shared_note,
    table_rows,
)
from speedrun.report.manifest import MANIFEST, JobEntry, Manifest, job_result, jobs_from_dirs
from speedrun.report.run_rows import FOLDED_KEYS, Run, is_failure, override_dict
from speedrun.report.wandb_sweep import log_sweep_summary
from speedrun.run.signals import sweep_stop_signals
from speedrun.tables import first_line, format_table

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------
# the summary


@dataclass
class Summary:
    keys: list[str]
    """The swept keys (seeds folded), one column each, and the card when it varies."""
    fixed: dict[str, str]
    """Overrides every job shares."""
    groups: list[Group]
    """One per combination (speedrun.report.groups, so the report and the summary count alike)."""
    metrics: dict[str, str]
    extras: list[str]
    """Columns shown only when they say something (evaluation set, shared GPU)."""
    failures: list[tuple[JobEntry, dict[str, Any]]]
    notes: list[str] = field(default_factory=list)
    """Lines about comparability: several evaluation sets, runs that shared a GPU."""
    not_run: int = 0
    reused: int = 0
    reused_from: dict[str, int] = field(default_factory=dict)
    """Where the reused runs came from: {earlier sweep dir, or run dir for a single run: how many}."""
    rerun: dict[str, int] = field(default_factory=dict)
    """{why an earlier ok run was not reused: how many combinations ran again}."""


def summarize(jobs: Sequence[JobEntry], results: Sequence[dict[str, Any]], sweep: str = "<sweep id>") -> Summary:
    """Group the jobs by combination (their overrides as asked, seeds folded; the card too where it varies)."""
    runs = [Run.from_row(r, j.overrides) for j, r in zip(jobs, results)]
    keys = default_group_keys(runs, by_value=False)
    first = override_dict(jobs[0].overrides) if jobs else {}
    fixed = {k: v for k, v in first.items() if k not in keys and k not in FOLDED_KEYS}
    groups = group_runs(runs, keys, asked=True)
    sets = eval_sets(groups)
    reused = [j for j in jobs if j.state == "reused"]
    return Summary(
        keys=keys,
        fixed=fixed,
        groups=groups,
        metrics=metrics_for(groups),
        extras=extra_columns(groups, keys, sets),
        failures=[(j, r) for j, r in zip(jobs, results) if is_failure(r.get("status"))],
        notes=sets.messages(keys, f"python -m speedrun.report --sweep {sweep}") + shared_note(groups),
        not_run=sum(r.get("status") == "not_run" for r in results),
        reused=len(reused),
        reused_from=dict(Counter(_source(j.run_dir) for j in reused if j.run_dir)),
        rerun=dict(Counter(j.note for j in jobs if j.note)),
    )


def _source(run_dir: str) -> str:
    """The sweep dir a reused run belongs to, or the run dir itself for a run outside a sweep."""
    parent = Path(run_dir).parent
    return str(parent) if (parent / MANIFEST).exists() or (parent / "multirun.yaml").exists() else str(run_dir)


def summary_table(s: Summary) -> str:
    """The table and its footnotes (speedrun.report.leaderboard.repeated_note)."""
    return "\n".join([format_table(*table_rows(s.groups, s.keys, s.metrics, s.extras)), *repeated_note(s.groups)])


def resume_lines(s: Summary) -> list[str]:
    """How many runs resume reused and from where, and which combinations ran again although done elsewhere."""
    lines = []
    if s.reused:
        lines.append(
            f"reused by resume: {s.reused} run(s), from "
            + "; ".join(f"{src} ({n})" for src, n in sorted(s.reused_from.items()))
        )
    lines += [f"ran again, not reused: {n} combination(s) whose earlier ok run {why}" for why, n in s.rerun.items()]
    return lines


def summary_markdown(s: Summary, manifest: Manifest | None, sweep_dir: Path) -> str:
    title = manifest.sweep if manifest else Path(sweep_dir).name
    lines = [f"# Sweep {title}", "", f"- dir: `{sweep_dir}`"]
    if s.fixed:
        lines.append("- fixed overrides: " + " ".join(f"`{k}={v}`" for k, v in s.fixed.items()))
    n_jobs = sum(len(g.ok) + g.failures for g in s.groups)
    lines.append(
        f"- runs: {n_jobs} ({s.reused} reused from earlier runs by resume), failures: {len(s.failures)}"
        + (f", not run: {s.not_run} (fail-fast or interrupted)" if s.not_run else "")
    )
    lines += [f"- {line}" for line in resume_lines(s) + s.notes]
    lines.append("- cells: mean ± sample std over the ok runs (seeds folded); n counts ok runs")
    lines += ["", summary_table(s), ""]
    if s.failures:
        lines += ["## Failures", ""]
        lines.append(
            format_table(
                ["overrides", "status", "error", "dir"],
                [
                    [" ".join(j.overrides), r.get("status"), first_line(r.get("error")), j.run_dir or ""]
                    for j, r in s.failures
                ],
            )
        )
        lines.append("")
    return "\n".join(lines)


def summary_csv(s: Summary) -> str:
    return groups_csv(s.groups, s.keys, list(s.metrics), s.extras)


def write_summary(sweep_dir: Path, db_path: Path | None = None) -> Summary | None:
    """Write summary.md and summary.csv into a sweep dir; returns the Summary (None if there are no jobs)."""
    sweep_dir = Path(sweep_dir)
    manifest = Manifest.load(sweep_dir)
    jobs = manifest.jobs if manifest else jobs_from_dirs(sweep_dir)
    if not jobs:
        return None
    results = [job_result(j, db_path) for j in jobs]
    s = summarize(jobs, results, manifest.sweep if manifest else sweep_dir.name)
    atomic_write_text(sweep_dir / "summary.md", summary_markdown(s, manifest, sweep_dir))
    atomic_write_text(sweep_dir / "summary.csv", summary_csv(s))
    return s


# ---------------------------------------------------------------------------------------------------------
# the Hydra callback

try:
    from hydra.experimental.callback import Callback
except ImportError:  # hydra is a dependency; this only keeps `import speedrun.report.sweep` light in odd setups
    Callback = object  # type: ignore[misc,assignment]  # a plain base class in place of hydra's


class SweepSummary(Callback):
    """At the end of a multirun: summary.md and summary.csv in the sweep dir, the same table on the console.

    With ``exit_nonzero_on_failure`` (the default) the process then exits with status 1 when any job failed, was
    interrupted or was not run, so scripts see it; the summary is written first. A diverged run is a result (it
    shows under failures in the summary) and does not change the exit status. A sweep stopped by Ctrl-C or SIGTERM
    exits with the shell's status for that signal (130, 143), as a single run does; after a second one the console
    gets one line instead of the table.
    """

    def __init__(self, exit_nonzero_on_failure: bool = True) -> None:
        self.exit_nonzero_on_failure = exit_nonzero_on_failure

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        db = results_db_path(config.get("results_db"))
        if not db.is_absolute():
            db = Path(str(config.hydra.runtime.cwd)) / db
        s = write_summary(sweep_dir, db)
        signals = _stop_signals()  # read after the summary is written: a second Ctrl-C may come while it is
        manifest = Manifest.load(sweep_dir)
        interrupted = bool(signals) or (manifest is not None and manifest.stopped == "interrupted")
        exit_code = 128 + (signals[0] if signals else int(signal.SIGINT))
        if s is None:
            print(f"sweep {sweep_dir}: no jobs", flush=True)
            if interrupted:
                sys.exit(exit_code)
            return
        if len(signals) > 1:  # asked twice to stop: one line, not the table
            counts = Counter(r.status for g in s.groups for r in g.runs)
            order = sorted(counts, key=lambda status: (status != "ok", status == "not_run"))  # ok first, not run last
            outcome = ", ".join(f"{counts[status]} {status.replace('_', ' ')}" for status in order)
            print(
                f"sweep interrupted ({_signal_name(signals[0])} twice): {outcome}; what each job did: "
                f"{sweep_dir / 'summary.md'}; the same command with hydra.sweeper.resume=true runs the rest",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(exit_code)
        text = "\n".join([*resume_lines(s), *s.notes, summary_table(s)])
        print(f"\nsweep summary ({sweep_dir}):\n{text}", flush=True)
        for job, r in s.failures:
            print(
                f"failed: {' '.join(job.overrides)}: {r.get('status')}: {first_line(r.get('error'))}"
                f"{'  (' + job.run_dir + ')' if job.run_dir else ''}",
                flush=True,
            )
        if s.not_run:
            print(f"not run: {s.not_run} job(s) (fail-fast or interrupted)", flush=True)
        print(f"summary: {sweep_dir / 'summary.md'}", flush=True)
        if str(OmegaConf.select(config, "logger.name", default="")) == "wandb":
            log_sweep_summary(sweep_dir, sweep_dir.name, config.logger, summary_csv(s), s.groups)
        if interrupted:
            sys.stdout.flush()
            sys.exit(exit_code)
        crashed = [r for _, r in s.failures if r.get("status") != "diverged"]  # a divergence is a result
        if self.exit_nonzero_on_failure and (crashed or s.not_run):
            sys.stdout.flush()
            sys.exit(1)


def _stop_signals() -> list[int]:
    """The stop signals the pool launcher of this process received (none with another launcher)."""
    return sweep_stop_signals()


def _signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
