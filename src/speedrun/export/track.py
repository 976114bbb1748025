"""Which parameter-golf track a submission claims, by the rules in conf/track/ (speedrun.config.track).

A record (``pgolf_10min_16mb``: 8 x H100, 600 s of training, 600 s of evaluation, 16,000,000 bytes, the whole
validation split) is claimed only when every run was made under that track (``track=pgolf_10min_16mb``: refused at
compose where it could not comply), recorded ``track_ok``, and still meets every rule when checked here against
the shipped file's bytes. Anything else goes to the non-record track, which keeps the byte cap and the whole
validation split, with the reasons in ``track_reason``; ``--force`` never turns a failing run into a record claim.
"""

from __future__ import annotations

from typing import Any

from speedrun.config.track_rules import load_track
from speedrun.run.track_verdict import card_model_of

RECORD_NAME = "pgolf_10min_16mb"
NON_RECORD_NAME = "pgolf_non_record_16mb"
SPELLINGS = {
    RECORD_NAME: RECORD_NAME,
    "10min_16mb": RECORD_NAME,
    "track_10min_16mb": RECORD_NAME,
    NON_RECORD_NAME: NON_RECORD_NAME,
    "non_record_16mb": NON_RECORD_NAME,
    "track_non_record_16mb": NON_RECORD_NAME,
}
"""--track as speedrun names the track, or as parameter-golf's records/ folder does."""


def track_name(spelling: str) -> str:
    """--track's spelling -> the conf/track/ name; ValueError naming the choices for another."""
    if spelling not in SPELLINGS:
        raise ValueError(f"unknown track {spelling!r}; choose {RECORD_NAME} or {NON_RECORD_NAME}")
    return SPELLINGS[spelling]


def record_problems(result: dict[str, Any], artifact_bytes: int) -> list[str]:
    """Why one run may not claim the record ([] when it may); ``artifact_bytes`` is the artifact as submitted (the
    run's model + the shipped train_gpt.py)."""
    record = load_track(RECORD_NAME)
    out = []
    if result.get("track") != RECORD_NAME:
        out.append(
            f"made with track={result.get('track') or 'none'}, not track={RECORD_NAME} (whose checks at compose "
            "it did not pass)"
        )
    elif result.get("track_ok") is not True:
        out.append("its own record says track_ok false")
    return out + record.problems({**result, "artifact_bytes": artifact_bytes}, card_model_of)


def claim(runs: list[tuple[str, dict[str, Any], int]], wanted: str = RECORD_NAME, unverified: bool = False) -> dict:
    """The track fields of submission.json for runs given as (label, result, artifact bytes as submitted):
    ``track`` (parameter-golf's records/ folder: the record track only when every run may claim it; else the
    non-record one, or None when even its rules are missed), ``record_track`` (bool) and ``track_reason`` (why, in
    one line). ``wanted``: the track asked for (--track); ``unverified``: the shipped train_gpt.py was not shown to
    be the runs' own (--force)."""
    record, non_record = load_track(RECORD_NAME), load_track(NON_RECORD_NAME)
    if wanted == RECORD_NAME:
        problems = [f"{label}: {'; '.join(p)}" for label, r, size in runs if (p := record_problems(r, size))]
        if unverified:
            problems.append("its train_gpt.py is not verified as the file the run wrote (exported with --force)")
        if not problems:
            return {"track": record.folder, "record_track": True, "track_reason": f"every run: {record.rules_text()}"}
        why = "not a record-track submission: " + " | ".join(problems)
    else:
        why = f"not a record-track submission: --track {wanted} asked for"
    missed = [
        f"{label}: {'; '.join(p)}"
        for label, r, size in runs
        if (p := non_record.problems({**r, "artifact_bytes": size}))
    ]
    if missed:
        return {
            "track": None,
            "record_track": False,
            "track_reason": f"{why}; nor a {non_record.folder} one: " + " | ".join(missed),
        }
    return {"track": non_record.folder, "record_track": False, "track_reason": why}


def limits_table(runs: list[tuple[str, dict[str, Any], int]]) -> list[str]:
    """Markdown lines: each run's train and eval seconds and bytes against the record track's limits."""
    record = load_track(RECORD_NAME)
    lines = [
        f"| run | train s (limit {record.train_seconds:g}) | eval s (limit {record.eval_seconds:g}) | "
        f"eval s without TTT's compile | bytes (cap {record.artifact_cap_bytes:,}) |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, r, size in runs:
        lines.append(
            f"| {label} | {_against(r.get('train_seconds'), record.train_seconds)} | "
            f"{_against(r.get('eval_seconds'), record.eval_seconds)} | {_value(r.get('eval_seconds_warm'))} | "
            f"{size:,}{'' if record.artifact_cap_bytes is None or size <= record.artifact_cap_bytes else ' (over)'} |"
        )
    return lines


def _value(x: Any) -> str:
    return "?" if x is None else f"{float(x):.1f}"


def _against(x: Any, limit: float | None) -> str:
    if x is None or limit is None:
        return _value(x)
    return f"{float(x):.1f}" + ("" if float(x) <= limit else " (over)")
