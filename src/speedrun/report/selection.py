"""Which runs a report covers: rows of results.sqlite, narrowed by sweep (id, ``latest`` or a sweep dir, with the
earlier runs a resumed sweep reused), name, hardware profile and ``--where KEY=VALUE[,VALUE...]``."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from speedrun.records.store import CONTRACT_TYPES
from speedrun.report.manifest import MANIFEST
from speedrun.report.run_rows import Run, canon, read_rows

DERIVED = ("overhead_s", "ttt_gain")
"""Metrics Run.metric derives from two result keys rather than reads."""


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments as a dict; ``--baseline`` also splits on commas (``a=1,b=2``)."""
    out = {}
    for item in items:
        for part in item.split(",") if what == "--baseline" else [item]:
            if "=" not in part:
                raise SystemExit(f"{what} {part!r}: expected KEY=VALUE")
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def load_runs(
    db: Path,
    sweeps: Sequence[str] = (),
    name: str | None = None,
    hardware: str | None = None,
    where: dict[str, str] | None = None,
) -> list[Run]:
    """The selected runs, oldest first. A ``where`` value may be a comma list; values compare as canon strings.
    A row that cannot be read is left out with one warning line on stderr; a file that is no results database
    raises UnreadableDatabase."""
    if not db.exists():
        raise SystemExit(f"no results database at {db}: run something first (python -m run)")
    rows, skipped = read_rows(db)
    for line in skipped:
        print(line, file=sys.stderr)
    runs = [Run.from_row(r) for r in rows]
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


def _select_sweeps(runs: list[Run], sweeps: Sequence[str], multirun: Path | None = None) -> list[Run]:
    """Runs of the named sweeps: an id, ``latest``, or a sweep dir. A sweep that resumed also takes the
    earlier runs its manifest (sweep.json) reused, even when it ran no job itself. ``multirun`` is where
    sweep dirs live (outputs/multirun beside the database), searched for manifests by id."""
    manifests = {p.parent.name: p.parent for p in multirun.glob(f"*/*/{MANIFEST}")} if multirun else {}
    ids, dirs = set(), []
    for s in sweeps:
        if s == "latest":
            started = {r.row["sweep"]: r.row.get("started_at") or 0.0 for r in runs if r.row.get("sweep")}
            for sweep_id, d in manifests.items():
                started[sweep_id] = max(started.get(sweep_id, 0.0), _manifest_started(d / MANIFEST))
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


def _manifest_started(path: Path) -> float:
    try:
        return float(json.loads(path.read_text()).get("started_at") or 0.0)
    except (OSError, ValueError, TypeError):
        return 0.0


NOT_METRICS = ("rowid", "pid", "started_at", "heartbeat_at", "seed", "emulated")
"""Numeric columns that identify a run rather than measure it: listed as metrics they would bury the ones that do."""


def numeric_keys(runs: Sequence[Run]) -> list[str]:
    """The keys --metric can rank by: the result contract's REAL and INTEGER keys, every other key that holds a
    number in some selected run, and the DERIVED ones, sorted. A key holding only 0 and 1 is a flag (the database
    stores true as 1: reached, gpu_shared, ...), not a measure."""
    schema = {k for k, kind in CONTRACT_TYPES.items() if kind in ("REAL", "INTEGER") and k not in NOT_METRICS}
    values: dict[str, set[object]] = {}
    for r in runs:
        for k, v in r.row.items():
            if isinstance(v, (int, float)) and k not in NOT_METRICS:
                values.setdefault(k, set()).add(v)
    seen = {k for k, vs in values.items() if not vs <= {0, 1} or any(isinstance(v, float) for v in vs)}
    return sorted(schema | seen | set(DERIVED))


def check_metric(metric: str, runs: Sequence[Run]) -> str | None:
    """Why ``metric`` cannot rank these runs (not a numeric key of theirs), naming the ones that can; None if it
    can."""
    keys = numeric_keys(runs)
    if metric in keys:
        return None
    held = {type(r.row[metric]).__name__ for r in runs if r.row.get(metric) is not None}
    if not held:
        why = "is no result key of these runs"
    elif held <= {"int", "float"}:
        why = "is a flag or an identifier of a run, not a measure"
    else:
        why = f"holds {' and '.join(sorted(held))} values, not numbers"
    return f"--metric {metric}: {why}; the numeric keys: {', '.join(keys)}"
