"""Sweeps: the manifest a sweep leaves in its dir, resume identity, and the summary written when it ends.

A sweep dir (``outputs/multirun/<date>/<time>_<name>/``) holds one subdir per launched job, ``multirun.yaml``,
``sweep.json`` (the manifest: every combination, whether it was launched, reused by resume or not run, and
how it ended) and, from the ``SweepSummary`` callback at the end, ``summary.md`` and ``summary.csv``: one row per
combination with the seeds folded (n, mean and std of the metrics, failures), grouped, counted and laid out by
speedrun.report's grouping, the same as the report's leaderboard.

Resume identity: a combination is already done when results.sqlite holds a run with status ok whose composed
config equals this job's, ignoring the keys in ``SWEEP_REUSE_IGNORED`` (they do not change what trains), that ran on
the card the sweep runs on (``device_name``) and with the code the sweep runs (``code_fingerprint``; see
speedrun.records.identity). Same name, same overrides and the same conf/ defaults give the same config; the sweep id (a
new timestamped dir per invocation) plays no part.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from speedrun.paths import results_db_path
from speedrun.records.identity import SWEEP_REUSE_IGNORED, config_identity
from speedrun.report.groups import Group, default_group_keys, eval_sets, group_runs
from speedrun.report.leaderboard import (
    extra_columns,
    groups_csv,
    metrics_for,
    repeated_note,
    shared_note,
    table_rows,
)
from speedrun.report.runs import FOLDED_KEYS, Run, UnreadableDatabase, is_failure, override_dict, read_rows
from speedrun.tables import first_line, format_table

log = logging.getLogger(__name__)

MANIFEST = "sweep.json"


# ---------------------------------------------------------------------------------------------------------
# resume identity


def reuse_refusal(row: dict[str, Any], device_name: str | None, code: str | None) -> str | None:
    """Why an ok run may not stand in for a job that would run on ``device_name`` with code ``code`` (None: it
    may). A run on another card measured another card; a run of other code measured other code. A run recorded
    before runs kept their code_fingerprint is let through (its code cannot be checked; the sweeper says so)."""
    if device_name is not None and row.get("device_name") != device_name:
        return f"ran on another card ({row.get('device_name') or 'unknown'})"
    if code is not None and row.get("resume_code_change"):  # part of it was trained by other code
        return f"was resumed onto other code ({row['resume_code_change']})"
    if code is not None and row.get("code_fingerprint") not in (None, code):
        return f"ran other code (code_fingerprint {row.get('code_fingerprint')}, here {code})"
    return None


@dataclass
class Completed:
    reusable: dict[str, dict[str, Any]]
    """{config identity: the latest ok row that may be reused}."""
    refused: dict[str, str]
    """{config identity: why its latest ok row may not be reused}, for identities with no reusable row."""


def completed_runs(
    db_path: Path, name: str | None = None, device_name: str | None = None, code: str | None = None
) -> Completed:
    """The ok runs in results.sqlite (of ``name`` only, if given) by config identity; with ``device_name`` and
    ``code`` only those on that card and of that code are reusable (see ``reuse_refusal``)."""
    done = Completed({}, {})
    if not Path(db_path).exists():
        return done
    try:
        if name is None:
            rows, skipped = read_rows(db_path, "status = 'ok'")
        else:
            rows, skipped = read_rows(db_path, "status = 'ok' AND name = ?", (name,))
    except Exception as e:  # noqa: BLE001 - an unreadable database means nothing to skip, said aloud
        log.warning("resume: cannot read %s (%s); every combination will run", db_path, e)
        return done
    for line in skipped:  # a row that cannot be read cannot be reused: its combination runs again
        log.warning("resume: %s", line.removeprefix("warning: "))
    for row in sorted(rows, key=lambda r: r.get("started_at") or 0.0):
        ident = config_identity(row.get("config"), SWEEP_REUSE_IGNORED)
        if ident is None:
            continue
        why = reuse_refusal(row, device_name, code)
        if why is None:
            done.reusable[ident] = row
        else:
            done.refused[ident] = why
    done.refused = {k: v for k, v in done.refused.items() if k not in done.reusable}
    return done


# ---------------------------------------------------------------------------------------------------------
# the manifest


@dataclass
class JobEntry:
    index: int
    """Position of the combination in the sweep (stable across resumed invocations of the same sweep)."""
    overrides: list[str]
    state: str = "pending"
    """pending, launched, reused (done ok by an earlier run; resume), not_run (fail-fast or interrupted)."""
    num: int | None = None
    """hydra.job.num of the launched job (its subdir)."""
    run_dir: str | None = None
    status: str | None = None
    error: str | None = None
    note: str | None = None
    """Why resume did not reuse an earlier ok run of this combination (another card, other code)."""


@dataclass
class Manifest:
    sweep: str
    sweep_dir: str
    name: str
    resume: bool = False
    fail_fast: bool = False
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    device_name: str | None = None
    """With resume: the card the jobs run on, which a reused run must have run on."""
    code_fingerprint: str | None = None
    """The code the jobs run (speedrun.records.identity.code_fingerprint), which a reused run must have run."""
    resume_across_code: bool = False
    """Resume reused runs of other code too."""
    stopped: str | None = None
    """Why the sweep stopped before its last job: fail_fast, or interrupted (Ctrl-C, SIGTERM); None: it did not."""
    jobs: list[JobEntry] = field(default_factory=list)

    def save(self) -> None:
        from speedrun.records.store import write_json

        write_json(Path(self.sweep_dir) / MANIFEST, {**self.__dict__, "jobs": [j.__dict__ for j in self.jobs]})

    @classmethod
    def load(cls, sweep_dir: Path) -> Manifest | None:
        path = Path(sweep_dir) / MANIFEST
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        jobs = [JobEntry(**j) for j in data.pop("jobs", [])]
        return cls(**data, jobs=jobs)


def jobs_from_dirs(sweep_dir: Path) -> list[JobEntry]:
    """For a sweep without a manifest (another sweeper): one entry per job subdir with a .hydra/overrides.yaml."""
    from omegaconf import OmegaConf

    entries = []
    subdirs = [p.parent.parent for p in Path(sweep_dir).glob("*/.hydra/overrides.yaml")]
    for i, d in enumerate(
        sorted(subdirs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))
    ):
        overrides = [str(o) for o in OmegaConf.load(d / ".hydra" / "overrides.yaml")]
        entries.append(
            JobEntry(
                index=i,
                overrides=overrides,
                state="launched",
                run_dir=str(d.resolve()),
                num=int(d.name) if d.name.isdigit() else None,
            )
        )
    return entries


def job_result(job: JobEntry, db_path: Path | None = None) -> dict[str, Any]:
    """The record of one job: its result.json, else its database row, else what the launcher said."""
    if job.state == "not_run":
        return {"status": "not_run", "error": job.error}
    record = _job_record(Path(job.run_dir), db_path) if job.run_dir else None
    if record is None:
        return {"status": job.status or "failed", "error": job.error or "no result.json: the job did not start"}
    if record.get("status") == "running" and job.status not in (None, "running"):
        # a job the launcher saw end whose record still says running was killed before it could record itself (a
        # second Ctrl-C, SIGKILL): the launcher's word on how it ended is the true one
        return {**record, "status": job.status, "error": job.error}
    return record


def _job_record(run_dir: Path, db_path: Path | None) -> dict[str, Any] | None:
    path = run_dir / "result.json"
    if path.exists():
        try:
            result = json.loads(path.read_text())
        except ValueError:
            result = None
        if isinstance(result, dict):
            return result
    if db_path is not None and Path(db_path).exists():
        try:
            rows, _ = read_rows(db_path, "run_id = ?", (str(run_dir.resolve()),))
        except UnreadableDatabase:
            return None  # what the launcher saw stands in
        if rows:
            return rows[0]
    return None


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
    from speedrun.records.store import atomic_write_text

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
            from speedrun.report.wandb_sweep import log_sweep_summary

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
    try:
        from hydra_plugins.speedrun_plugins.pool_launcher import stop_signals
    except ImportError:
        return []
    return stop_signals()


def _signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
