"""Which parameter-golf track a submission claims. Its README: a record must train in under 10 minutes on 8xH100,
its evaluation must also take no more than 10 minutes on 8xH100, and its artifact (code + compressed model) must fit
in 16,000,000 bytes; runs that miss the time or card limits go to the non-record (unlimited compute) track, which
keeps the 16,000,000-byte cap. A submission claims the record track only when every one of its runs meets every
rule; otherwise it names the non-record track and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Track:
    name: str
    """parameter-golf's records/ folder for it."""
    gpus: int | None
    """How many GPUs a run must have used (None: any)."""
    card: str | None
    """What every GPU's name must contain (None: any)."""
    train_seconds: float | None
    eval_seconds: float | None
    cap_bytes: int


RECORD = Track("track_10min_16mb", gpus=8, card="H100", train_seconds=600, eval_seconds=600, cap_bytes=16_000_000)
NON_RECORD = Track(
    "track_non_record_16mb", gpus=None, card=None, train_seconds=None, eval_seconds=None, cap_bytes=16_000_000
)
TRACKS = {t.name: t for t in (RECORD, NON_RECORD)}


def track_name(spelling: str) -> str:
    """A track as --track spells it (``10min_16mb`` or ``track_10min_16mb``) -> its TRACKS name; ValueError naming
    the choices for another."""
    name = spelling if spelling.startswith("track_") else f"track_{spelling}"
    if name not in TRACKS:
        raise ValueError(f"unknown track {spelling!r}; choose {' or '.join(TRACKS)}")
    return name


def eval_time(result: dict[str, Any]) -> float | None:
    """Seconds of evaluation to hold to the limit: eval_seconds, which runs from the end of training through the
    scores, the artifact's export and test-time training (so it bounds ttt_seconds too); the larger of the two, in
    case a record has only one."""
    times = [float(result[k]) for k in ("eval_seconds", "ttt_seconds") if result.get(k) is not None]
    return max(times) if times else None


def record_problems(result: dict[str, Any], artifact_bytes: int, track: Track = RECORD) -> list[str]:
    """Why one run does not meet ``track``'s rules ([] when it meets them all). ``artifact_bytes`` is the artifact as
    submitted (the run's model + the shipped train_gpt.py)."""
    out: list[str] = []
    if result.get("status") != "ok":
        out.append(f"status {result.get('status')}")
    partial = [k for k in ("eval_complete", "eval_complete_quant") if result.get(k) is False]
    if partial:
        out.append(f"its score is partial ({', '.join(partial)} false)")
    world = int(result.get("world_size") or 1)
    if track.gpus is not None and world != track.gpus:
        out.append(f"{world} GPU(s), not {track.gpus}")
    if track.card is not None:
        names = [str(n) for n in (result.get("gpu_names") or [result.get("device_name")])]
        other = sorted({n for n in names if track.card not in n})
        if other:
            out.append(f"ran on {', '.join(other)}, not {track.card}")
    if track.train_seconds is not None:
        train = result.get("train_seconds")
        if train is None:
            out.append("no train_seconds recorded")
        elif float(train) > track.train_seconds:
            out.append(f"trained {float(train):.1f} s, over {track.train_seconds:g} s")
    if track.eval_seconds is not None:
        seconds = eval_time(result)
        if seconds is None:
            out.append("no eval_seconds recorded")
        elif seconds > track.eval_seconds:
            out.append(f"evaluated in {seconds:.1f} s, over {track.eval_seconds:g} s")
    if artifact_bytes > track.cap_bytes:
        out.append(f"artifact {artifact_bytes:,} bytes, over {track.cap_bytes:,}")
    return out


def claim(runs: list[tuple[str, dict[str, Any], int]], wanted: str = RECORD.name, unverified: bool = False) -> dict:
    """The track fields of submission.json for runs given as (label, result, artifact bytes as submitted):
    ``track`` (the record track only when every run meets all its rules; else the non-record track, or None when
    even its byte cap is missed), ``record_track`` (bool) and ``track_reason`` (why, in one line). ``wanted`` is the
    track asked for (--track); ``unverified``: the shipped train_gpt.py was not shown to be the runs' (--force)."""
    if wanted == RECORD.name:
        problems = [f"{label}: {'; '.join(p)}" for label, r, size in runs if (p := record_problems(r, size))]
        if unverified:
            problems.append("its train_gpt.py is not verified as the file the run wrote (exported with --force)")
        if not problems:
            return {
                "track": RECORD.name,
                "record_track": True,
                "track_reason": f"every run: {RECORD.gpus}x{RECORD.card}, trained within {RECORD.train_seconds:g} s, "
                f"evaluated within {RECORD.eval_seconds:g} s, artifact within {RECORD.cap_bytes:,} bytes",
            }
        why = "not a record-track submission: " + " | ".join(problems)
    else:
        why = f"not a record-track submission: --track {wanted} asked for"
    over = [f"{label}: {size:,} bytes" for label, _, size in runs if size > NON_RECORD.cap_bytes]
    if over:
        return {
            "track": None,
            "record_track": False,
            "track_reason": f"{why}; nor a {NON_RECORD.name} one: over {NON_RECORD.cap_bytes:,} bytes "
            f"({', '.join(over)})",
        }
    return {"track": NON_RECORD.name, "record_track": False, "track_reason": why}
