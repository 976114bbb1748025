"""One run as the report and the sweep summary see it: its result row, config, Plan and overrides, and how a key
is looked up in them; the override helpers both use to find what a set of runs varies; and the rows of
results.sqlite read so that one bad row costs that row, not the report.
"""

from __future__ import annotations

import json
import math
import shlex
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeGuard

from speedrun.records.store import effective_status
from speedrun.tables import display

OK = "ok"
LOST = "lost"
"""A ``running`` row whose process is gone (its pid vanished on this host, or its heartbeat stopped): it will never
finish, so it counts as a failure, not as a run still going."""
NOT_RUN = "not_run"
"""A sweep job that never started (fail-fast, interrupted): neither a result nor a failure."""

FOLDED_KEYS = ("seed",)
"""Override keys folded into one group (their runs are repeats of one combination)."""


def is_failure(status: Any) -> bool:
    """The one definition of a failure, for the report and the sweep summary: a run that started and did not end
    ok. ``diverged`` counts (its metrics are not a result to average), although a sweep's exit status forgives it."""
    return status not in (OK, NOT_RUN)


# ---------------------------------------------------------------------------------------------------------
# reading results.sqlite


class UnreadableDatabase(Exception):
    """A results database that cannot be read at all (not a SQLite file, no ``runs`` table, a damaged file): the
    message names the path and the fix, for one line on the console."""


class _NotText(bytes):
    """A TEXT value whose bytes are not UTF-8, kept as bytes so that its row can be named and skipped."""

    reason = ""


def _text(raw: bytes) -> str | bytes:
    # sqlite3's own decoding raises in the middle of fetching, which ends the whole query: decoding here lets
    # every other row through
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        value = _NotText(raw)
        value.reason = f"0x{raw[e.start]:02x} at byte {e.start}"
        return value


def _read_only_problem(e: sqlite3.OperationalError) -> bool:
    text = str(e).lower()
    return any(s in text for s in ("unable to open", "readonly", "read-only", "attempt to write"))


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """The database opened read-only (``mode=ro``: a WAL file beside it is still read), else as immutable (no lock,
    no -shm: a database on read-only media whose last writer closed it cleanly)."""
    from urllib.parse import quote

    uri = f"file:{quote(str(Path(path).resolve()))}"
    for flags in ("?mode=ro", "?mode=ro&immutable=1"):
        con = sqlite3.connect(uri + flags, uri=True, timeout=60.0)
        con.text_factory = _text
        try:
            con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            return con
        except sqlite3.OperationalError as e:
            con.close()
            if flags.endswith("immutable=1") or not _read_only_problem(e):
                raise
    raise AssertionError("unreachable")


def read_rows(path: Path, where: str = "1=1", params: tuple = ()) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of ``runs`` in the database at ``path`` that match ``where``, and one line per row that could not
    be read (a TEXT value that is not UTF-8), which is left out. Raises UnreadableDatabase when the file is not a
    SQLite database or has no ``runs`` table."""
    path = Path(path)
    if not path.exists():  # sqlite3.connect would create an empty file there
        raise UnreadableDatabase(f"no results database at {path}: run something first (python -m run)")
    con = sqlite3.connect(path, timeout=60.0)
    con.text_factory = _text
    try:
        try:
            try:
                cur = con.execute(f"SELECT rowid, * FROM runs WHERE {where}", params)
            except sqlite3.OperationalError as e:
                if not _read_only_problem(e):
                    raise
                # a WAL database on a read-only disk (its -shm cannot be made): read it without writing anything
                con.close()
                con = _connect_read_only(path)
                cur = con.execute(f"SELECT rowid, * FROM runs WHERE {where}", params)
            names = [d[0] for d in cur.description][1:]
            fetched = cur.fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" not in str(e):
                raise
            raise UnreadableDatabase(
                f"{path} has no runs table: it is not a speedrun results database; point --db at one "
                f"(outputs/results.sqlite by default)"
            ) from None
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
            raise UnreadableDatabase(
                f"{path} stayed locked by another process for 60 s ({e}); run the report again once the writer is done"
            ) from None
        raise UnreadableDatabase(
            f"{path} cannot be read as a SQLite database ({e}); point --db at a speedrun results database "
            f"(outputs/results.sqlite by default), or move this file aside and restore it from a backup"
        ) from None
    finally:
        con.close()
    rows, skipped = [], []
    for rowid, *values in fetched:
        bad = [(k, v) for k, v in zip(names, values) if isinstance(v, _NotText)]
        if not bad:
            rows.append(dict(zip(names, values)))
            continue
        run_id = dict(zip(names, values)).get("run_id")
        which = f"run {run_id}" if isinstance(run_id, str) else f"the row with rowid {rowid}"
        delete = shlex.quote(f"DELETE FROM runs WHERE rowid = {rowid}")
        skipped.append(
            f"warning: skipped {which} of {path}: its {bad[0][0]} is not UTF-8 text ({bad[0][1].reason}); fix "
            f"that value or delete the row: sqlite3 {shlex.quote(str(path))} {delete}"
        )
    return rows, skipped


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


def split_overrides(text: str | None) -> list[str]:
    """The ``overrides`` column of results.sqlite (space-joined) back to a list."""
    return [o for o in (text or "").split(" ") if o]


def varying_keys(override_sets: Sequence[dict[str, str]], folded: Sequence[str] = FOLDED_KEYS) -> list[str]:
    """Keys whose value differs across the sets (a key missing from some sets differs), in first-seen order."""
    keys: dict[str, None] = {}
    for d in override_sets:
        keys.update(dict.fromkeys(d))
    return [k for k in keys if k not in folded and len({d.get(k) for d in override_sets}) > 1]


# ---------------------------------------------------------------------------------------------------------
# runs


@dataclass
class Run:
    row: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, Any], overrides: Sequence[str] | None = None) -> Run:
        """A results row (database or result.json); ``overrides`` (a sweep job's own) replace the row's."""
        listed = split_overrides(row.get("overrides")) if overrides is None else overrides
        return cls(
            row=row, config=_json(row.get("config")), plan=_json(row.get("plan")), overrides=override_dict(listed)
        )

    def get(self, key: str) -> Any:
        """A key's value for this run: results column, else config (dotted), else Plan, else override text."""
        value = self.row.get(key)
        if value is not None and key not in ("config", "plan", "overrides"):
            return value
        if key == "model.name" and self.plan.get("model_name"):
            return self.plan["model_name"]
        # model=auto is resolved per device: the Plan holds the model that actually ran.
        for tree in (self.plan, self.config) if key.startswith("model.") else (self.config, self.plan):
            found, value = dotted(tree, key)
            if found:
                return value.get("name", json.dumps(value, sort_keys=True)) if isinstance(value, dict) else value
        return self.overrides.get(key)

    def asked(self, key: str) -> str:
        """The value this run's overrides asked for, as typed, else what ``get`` finds: a sweep's combinations
        are what was asked, also for jobs that never ran and so have no record."""
        return self.overrides[key] if key in self.overrides else display(self.get(key))

    def metric(self, key: str) -> Any:
        """A metric of the row; ``ttt_gain`` is derived: val_bpb_ttt_base - val_bpb_ttt (what TTT bought), and
        ``overhead_s``: wall_seconds - train_seconds (start-up, compilation, evaluation: what a job costs beyond
        its training budget)."""
        if key == "overhead_s":
            wall, train = self.row.get("wall_seconds"), self.row.get("train_seconds")
            return wall - train if _number(wall) and _number(train) else None
        if key == "ttt_gain":
            base, ttt = self.row.get("val_bpb_ttt_base"), self.row.get("val_bpb_ttt")
            if _number(base) and _number(ttt):
                return base - ttt
            return None
        return self.row.get(key)

    @cached_property
    def status(self) -> str:
        """The row's status, or ``lost`` for a ``running`` row whose process is gone (speedrun.records.store)."""
        return str(effective_status(self.row))

    @property
    def error(self) -> str:
        """The row's error; for a lost row that has none, what is known of its end."""
        error = self.row.get("error")
        if error or self.status != LOST:
            return str(error or "")
        beat = self.row.get("heartbeat_at")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(beat)) if _number(beat) else "unknown"
        return f"lost: pid {self.row.get('pid')} on {self.row.get('host')} ended without a word (last heartbeat {when})"

    @property
    def epochs(self) -> float | None:
        """Training tokens seen / training tokens available: ``epochs``, or ``data_epochs`` as earlier rows call
        it. Above 1 the run saw some of its training text again, and its val_bpb rewards memorising it."""
        for key in ("epochs", "data_epochs"):
            value = self.row.get(key)
            if _number(value):
                return float(value)
        return None


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _json(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def dotted(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of a dotted key (``optim.matrix_lr``) in a nested dict."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def canon(value: Any) -> str:
    """A value as a comparable string: 2 == 2.0 == "2", True == "true", None == "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{float(value):.12g}"
    text = str(value).strip()
    if text.lower() in ("none", "null", "~"):
        return "null"
    if text.lower() in ("true", "false"):
        return text.lower()
    try:
        number = float(text)
    except ValueError:
        return text
    # an id that happens to parse (a hex fingerprint of digits, or with an "e" that overflows) stays itself
    if not math.isfinite(number) or sum(c.isdigit() for c in text.split("e")[0].split("E")[0]) > 15:
        return text
    return f"{number:.12g}"
