"""A sweep's manifest and resume identity: ``sweep.json`` in the sweep dir (every combination, whether it was
launched, reused by resume or not run, and how it ended), the ok runs a resumed sweep may reuse, and each job's
record as the summary reads it.

Resume identity: a combination is already done when results.sqlite holds a run with status ok whose composed
config equals this job's, ignoring the keys in ``SWEEP_REUSE_IGNORED`` (they do not change what trains), that ran on
the card the sweep runs on (``device_name``) and with the code the sweep runs (``code_fingerprint``; see
speedrun.records.identity). Same name, same overrides and the same conf/ defaults give the same config; the sweep id (a
new timestamped dir per invocation) plays no part.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from speedrun.records.identity import SWEEP_REUSE_IGNORED, config_identity
from speedrun.records.store import write_json
from speedrun.report.run_rows import UnreadableDatabase, read_rows

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
    if record.get("status") == "ok" and job.status not in (None, "running", "ok"):
        # the job failed (refused its dir, say) while the dir holds another process's ok record: this sweep's
        # summary counts its own job's return, never another run's numbers
        return {"status": job.status, "error": job.error}
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
