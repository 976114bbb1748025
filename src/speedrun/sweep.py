"""Sweeps: the manifest a sweep leaves in its dir, resume identity, and the summary written when it ends.

A sweep dir (``outputs/multirun/<date>/<time>_<name>/``) holds one subdir per launched job, ``multirun.yaml``,
``sweep.json`` (the manifest: every combination, whether it was launched, reused by resume or not run, and
how it ended) and, from the ``SweepSummary`` callback at the end, ``summary.md`` and ``summary.csv``: one row per
combination with the seeds folded (n, mean and std of the metrics, failures).

Resume identity: a combination is already done when results.sqlite holds a run with status ok whose composed
config equals this job's, ignoring the keys in ``RESUME_IGNORED`` (they do not change what trains). Same name,
same overrides and the same conf/ defaults give the same config; the sweep id (a new timestamped dir per
invocation) plays no part.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from .paths import results_db_path
from .stats import finite, mean, std

log = logging.getLogger(__name__)

MANIFEST = "sweep.json"
RESUME_IGNORED = ("sweep", "logger", "results_db")
"""Top-level config keys that do not change what a run computes, so resume ignores them."""

SUMMARY_METRICS: dict[str, str] = {
    "val_bpb": "{:.4f}",
    "val_bpb_quant": "{:.4f}",
    "tokens_per_s": "{:,.0f}",
    "mfu": "{:.4f}",
    "peak_mem_mb": "{:,.0f}",
    "artifact_bytes": "{:,.0f}",
}
"""The metrics a summary folds over seeds, with their display format."""

FOLDED_KEYS = ("seed",)
"""Override keys folded into one row (their runs are repeats of one combination)."""


# ---------------------------------------------------------------------------------------------------------
# overrides


def override_key(override: str) -> str:
    """``+model.x=1`` -> ``model.x``; ``hydra/launcher=pool`` -> ``hydra/launcher``."""
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def override_dict(overrides: Iterable[str]) -> dict[str, str]:
    """Overrides as {key: value as typed}; deletions (``~key``) map to ``~``."""
    out = {}
    for o in overrides:
        key = override_key(o)
        out[key] = "~" if o.startswith("~") else o.split("=", 1)[1] if "=" in o else ""
    return out


def split_overrides(text: Optional[str]) -> list[str]:
    """The ``overrides`` column of results.sqlite (space-joined) back to a list."""
    return [o for o in (text or "").split(" ") if o]


def varying_keys(override_sets: Sequence[dict[str, str]], folded: Sequence[str] = FOLDED_KEYS) -> list[str]:
    """Keys whose value differs across the sets (a key missing from some sets differs), in first-seen order."""
    keys: dict[str, None] = {}
    for d in override_sets:
        keys.update(dict.fromkeys(d))
    out = []
    for k in keys:
        if k in folded:
            continue
        if len({d.get(k) for d in override_sets}) > 1:
            out.append(k)
    return out


# ---------------------------------------------------------------------------------------------------------
# resume identity


def config_identity(config: Any) -> Optional[str]:
    """A canonical string for a task config (dict or JSON text) without the keys resume ignores."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return None
    if not isinstance(config, dict):
        return None
    kept = {k: v for k, v in config.items() if k not in RESUME_IGNORED}
    return json.dumps(kept, sort_keys=True, default=str)


def completed_runs(db_path: Path, name: Optional[str] = None) -> dict[str, dict[str, Any]]:
    """{config identity: latest ok row} for the runs in results.sqlite (of ``name`` only, if given)."""
    from .records import ResultsDB

    done: dict[str, dict[str, Any]] = {}
    try:
        db = ResultsDB(db_path)
        rows = db.rows("status = 'ok'") if name is None else db.rows("status = 'ok' AND name = ?", (name,))
    except Exception as e:  # noqa: BLE001 - an unreadable database means nothing to skip, said aloud
        log.warning("resume: cannot read %s (%s); every combination will run", db_path, e)
        return done
    for row in sorted(rows, key=lambda r: r.get("started_at") or 0.0):
        ident = config_identity(row.get("config"))
        if ident is not None:
            done[ident] = row
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
    num: Optional[int] = None
    """hydra.job.num of the launched job (its subdir)."""
    run_dir: Optional[str] = None
    status: Optional[str] = None
    error: Optional[str] = None


@dataclass
class Manifest:
    sweep: str
    sweep_dir: str
    name: str
    resume: bool = False
    fail_fast: bool = False
    started_at: float = field(default_factory=time.time)
    finished_at: Optional[float] = None
    jobs: list[JobEntry] = field(default_factory=list)

    def save(self) -> None:
        from .records import write_json

        write_json(Path(self.sweep_dir) / MANIFEST, {**self.__dict__, "jobs": [j.__dict__ for j in self.jobs]})

    @classmethod
    def load(cls, sweep_dir: Path) -> Optional["Manifest"]:
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
    for i, d in enumerate(sorted(subdirs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit()
                                                         else 0, p.name))):
        overrides = [str(o) for o in OmegaConf.load(d / ".hydra" / "overrides.yaml")]
        entries.append(JobEntry(index=i, overrides=overrides, state="launched", run_dir=str(d.resolve()),
                                num=int(d.name) if d.name.isdigit() else None))
    return entries


def job_result(job: JobEntry, db_path: Optional[Path] = None) -> dict[str, Any]:
    """The record of one job: its result.json, else its database row, else what the launcher said."""
    if job.state == "not_run":
        return {"status": "not_run", "error": job.error}
    if job.run_dir:
        path = Path(job.run_dir) / "result.json"
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass
        if db_path is not None:
            from .records import ResultsDB

            rows = ResultsDB(db_path).rows("run_id = ?", (str(Path(job.run_dir).resolve()),))
            if rows:
                return rows[0]
    return {"status": job.status or "failed", "error": job.error or "no result.json: the job did not start"}


# ---------------------------------------------------------------------------------------------------------
# the summary


@dataclass
class Summary:
    keys: list[str]
    """The swept keys (seeds folded), one column each."""
    fixed: dict[str, str]
    """Overrides every job shares."""
    rows: list[dict[str, Any]]
    """One per combination: key values, n, failures, seeds, <metric>_mean, <metric>_std."""
    failures: list[tuple[JobEntry, dict[str, Any]]]
    not_run: int = 0
    reused: int = 0


def summarize(jobs: Sequence[JobEntry], results: Sequence[dict[str, Any]]) -> Summary:
    sets = [override_dict(j.overrides) for j in jobs]
    keys = varying_keys(sets)
    fixed = {k: v for k, v in (sets[0].items() if sets else []) if k not in keys and k not in FOLDED_KEYS}
    groups: dict[tuple, list[int]] = {}
    for i, d in enumerate(sets):
        groups.setdefault(tuple(d.get(k, "") for k in keys), []).append(i)
    rows = []
    for values, members in groups.items():
        ok = [results[i] for i in members if results[i].get("status") == "ok"]
        failed = [i for i in members if results[i].get("status") not in ("ok", "not_run")]
        row: dict[str, Any] = dict(zip(keys, values))
        row.update(n=len(ok), failures=len(failed),
                   not_run=sum(results[i].get("status") == "not_run" for i in members),
                   seeds=" ".join(str(r.get("seed")) for r in ok if r.get("seed") is not None))
        for metric in SUMMARY_METRICS:
            xs = finite(r.get(metric) for r in ok)
            row[f"{metric}_mean"], row[f"{metric}_std"] = mean(xs), std(xs)
        rows.append(row)
    failures = [(jobs[i], results[i]) for i in range(len(jobs)) if results[i].get("status") not in ("ok", "not_run")]
    return Summary(keys=keys, fixed=fixed, rows=rows, failures=failures,
                   not_run=sum(r.get("status") == "not_run" for r in results),
                   reused=sum(j.state == "reused" for j in jobs))


def fmt_number(value: Any, spec: str = "{:.4g}") -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value != value:
        return "nan"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def mean_std_cell(m: Optional[float], s: Optional[float], spec: str) -> str:
    if m is None:
        return ""
    return fmt_number(m, spec) + (f" ± {fmt_number(s, spec)}" if s is not None else "")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table padded to aligned columns, readable as plain text on a console too."""
    cells = [[str(h) for h in headers]] + [[("" if c is None else str(c)).replace("|", "\\|") for c in r]
                                           for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def summary_table(s: Summary) -> str:
    counts = ["n", "failures"] + (["not_run"] if s.not_run else [])
    headers = (s.keys or ["combination"]) + counts + list(SUMMARY_METRICS)
    body = []
    for row in s.rows:
        cells = [row[k] for k in s.keys] if s.keys else ["(all)"]
        cells += [row[c] for c in counts]
        cells += [mean_std_cell(row[f"{m}_mean"], row[f"{m}_std"], spec) for m, spec in SUMMARY_METRICS.items()]
        body.append(cells)
    return format_table(headers, body)


def summary_markdown(s: Summary, manifest: Optional[Manifest], sweep_dir: Path) -> str:
    title = manifest.sweep if manifest else Path(sweep_dir).name
    lines = [f"# Sweep {title}", "", f"- dir: `{sweep_dir}`"]
    if s.fixed:
        lines.append("- fixed overrides: " + " ".join(f"`{k}={v}`" for k, v in s.fixed.items()))
    n_jobs = sum(r["n"] + r["failures"] for r in s.rows)
    lines.append(f"- runs: {n_jobs} ({s.reused} reused from earlier runs by resume), failures: {len(s.failures)}"
                 + (f", not run: {s.not_run} (fail-fast or interrupted)" if s.not_run else ""))
    lines.append("- cells: mean ± sample std over the ok runs (seeds folded); n counts ok runs")
    lines += ["", summary_table(s), ""]
    if s.failures:
        lines += ["## Failures", ""]
        lines.append(format_table(
            ["overrides", "status", "error", "dir"],
            [[" ".join(j.overrides), r.get("status"), _first_line(r.get("error")), j.run_dir or ""]
             for j, r in s.failures]))
        lines.append("")
    return "\n".join(lines)


def summary_csv(s: Summary) -> str:
    buf = io.StringIO()
    cols = (s.keys or ["combination"]) + ["n", "failures", "not_run", "seeds"]
    for m in SUMMARY_METRICS:
        cols += [f"{m}_mean", f"{m}_std"]
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in s.rows:
        w.writerow(row if s.keys else {**row, "combination": "(all)"})
    return buf.getvalue()


def _first_line(text: Any, limit: int = 160) -> str:
    line = str(text or "").strip().splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def write_summary(sweep_dir: Path, db_path: Optional[Path] = None) -> Optional[Summary]:
    """Write summary.md and summary.csv into a sweep dir; returns the Summary (None if there are no jobs)."""
    sweep_dir = Path(sweep_dir)
    manifest = Manifest.load(sweep_dir)
    jobs = manifest.jobs if manifest else jobs_from_dirs(sweep_dir)
    if not jobs:
        return None
    results = [job_result(j, db_path) for j in jobs]
    s = summarize(jobs, results)
    from .records import atomic_write_text

    atomic_write_text(sweep_dir / "summary.md", summary_markdown(s, manifest, sweep_dir))
    atomic_write_text(sweep_dir / "summary.csv", summary_csv(s))
    return s


# ---------------------------------------------------------------------------------------------------------
# the Hydra callback

try:
    from hydra.experimental.callback import Callback
except ImportError:  # hydra is a dependency; this only keeps `import speedrun.sweep` light in odd setups
    Callback = object  # type: ignore[misc,assignment]


class SweepSummary(Callback):  # type: ignore[misc,valid-type]
    """At the end of a multirun: summary.md and summary.csv in the sweep dir, the same table on the console.

    With ``exit_nonzero_on_failure`` (the default) the process then exits with status 1 when any job failed, was
    interrupted or was not run, so scripts see it; the summary is written first. A diverged run is a result (it
    shows under failures in the summary) and does not change the exit status.
    """

    def __init__(self, exit_nonzero_on_failure: bool = True) -> None:
        self.exit_nonzero_on_failure = exit_nonzero_on_failure

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        db = results_db_path(config.get("results_db"))
        if not db.is_absolute():
            db = Path(str(config.hydra.runtime.cwd)) / db
        s = write_summary(sweep_dir, db)
        if s is None:
            print(f"sweep {sweep_dir}: no jobs", flush=True)
            return
        text = summary_table(s)
        print(f"\nsweep summary ({sweep_dir}):\n{text}", flush=True)
        for job, r in s.failures:
            print(f"failed: {' '.join(job.overrides)}: {r.get('status')}: {_first_line(r.get('error'))}"
                  f"{'  (' + job.run_dir + ')' if job.run_dir else ''}", flush=True)
        if s.not_run:
            print(f"not run: {s.not_run} job(s) (fail-fast or interrupted)", flush=True)
        print(f"summary: {sweep_dir / 'summary.md'}", flush=True)
        crashed = [r for _, r in s.failures if r.get("status") != "diverged"]  # a divergence is a result
        if self.exit_nonzero_on_failure and (crashed or s.not_run):
            sys.stdout.flush()
            sys.exit(1)
