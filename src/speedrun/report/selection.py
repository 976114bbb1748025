"""Which runs a report covers: rows of results.sqlite, narrowed by sweep (id, ``latest`` or a sweep dir, with the
earlier runs a resumed sweep reused), name, hardware profile and ``--where KEY=VALUE[,VALUE...]``."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from speedrun.report.manifest import MANIFEST
from speedrun.report.runs import Run, canon, read_rows


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
