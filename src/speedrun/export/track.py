"""Which parameter-golf track a submission claims, by the rules in conf/track/ (speedrun.config.track).

A record (``pgolf_10min_16mb``: 8 x H100, 600 s of training, 600 s of evaluation, 16,000,000 bytes, the whole
validation split) is claimed only when every run was made under that track (``track=pgolf_10min_16mb``: refused at
compose where it could not comply), recorded ``track_ok``, and still meets every rule when checked here against
the shipped file's bytes; and the runs together carry the evidence a judge asks for (record_evidence): at least the
track's seeds (3), a tokenizer the track pins for their data, a result.json that its packed config and run.log
confirm (card, GPU count, data, tokenizer), and the acceptance test against the standing record passed (speedrun.
report.accept: the scored loss at least 0.005 nats below the record's published mean at p < 0.01). Anything else
goes to the non-record track, which keeps the byte cap and the whole validation split, with the reasons in
``track_reason``; ``--force`` never turns a failing run into a record claim. The track is spelled as the records
spell it (10min_16mb, non_record_16mb).
"""

from __future__ import annotations

import re
from typing import Any

from speedrun.config.track_rules import load_track
from speedrun.export.run_dirs import Run
from speedrun.records.rundir import read_text
from speedrun.report.accept import Judged, verdict, verdict_line
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


def spelled(folder: str | None) -> str | None:
    """A track as the records' submission.json spell it: the records/ folder without ``track_`` (10min_16mb)."""
    return None if folder is None else folder.removeprefix("track_")


def claim(
    runs: list[tuple[str, dict[str, Any], int]],
    wanted: str = RECORD_NAME,
    unverified: bool = False,
    evidence: list[str] | None = None,
) -> dict:
    """The track fields of submission.json for runs given as (label, result, artifact bytes as submitted):
    ``track`` (as the records spell it, 10min_16mb: the record track only when every run may claim it and the
    ``evidence`` holds; else non_record_16mb, or None when even its rules are missed), ``record_track`` (bool) and
    ``track_reason`` (why, in one line). ``wanted``: the track asked for (--track); ``unverified``: the shipped
    train_gpt.py was not shown to be the runs' own (--force); ``evidence``: why the runs together fail the claim
    (record_evidence: seeds, the acceptance test, the cross-checks), [] when they pass; None: not judged, which no
    record claim survives."""
    record, non_record = load_track(RECORD_NAME), load_track(NON_RECORD_NAME)
    if wanted == RECORD_NAME:
        problems = [f"{label}: {'; '.join(p)}" for label, r, size in runs if (p := record_problems(r, size))]
        if unverified:
            problems.append("its train_gpt.py is not verified as the file the run wrote (exported with --force)")
        problems += ["no evidence judged (seeds, significance)"] if evidence is None else evidence
        if not problems:
            return {
                "track": spelled(record.folder),
                "record_track": True,
                "track_reason": f"every run: {record.rules_text()}; {record.acceptance.text()}",
            }
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
            "track_reason": f"{why}; nor a {spelled(non_record.folder)} one: " + " | ".join(missed),
        }
    return {"track": spelled(non_record.folder), "record_track": False, "track_reason": why}


def record_evidence(runs: list[Run], judged: Judged | None) -> list[str]:
    """Why these runs together may not claim the record beyond each one's rules ([] when they may): fewer seeds than
    the track asks, data whose validation identity the track does not pin, a result.json whose claims its packed
    config or run.log contradict, and an acceptance test against the standing record that fails."""
    record = load_track(RECORD_NAME)
    out = []
    need = record.acceptance.min_seeds or 1
    if len(runs) < need:
        out.append(f"{len(runs)} seed(s): a record needs >= {need}, each meeting the rules (a p-value over them)")
    for data in sorted({str(run.result.get("data")) for run in runs}):
        if (why := record.unpinned(data)) is not None:
            out.append(why)
    for run in runs:
        out += [f"seed {run.seed}: {p}" for p in evidence_problems(run)]
    if judged is not None and len(runs) >= need:
        verdict_text = verdict(judged, record)
        if verdict_text != "accepted":
            out.append(f"the acceptance test: {verdict_line(judged, record)}")
    return out


_PLAN_HARDWARE = re.compile(
    r"^(?:\[[\d:]+\] )?\s*hardware\s{2,}(\S+)(?: \(emulated\))? on (.+?)(?:, memory cap .*)?$", re.M
)
_PLAN_RANKS = re.compile(r"^\s*ranks\s{2,}(\d+) = ", re.M)
_BLOCK_LINE = re.compile(r"^(\w+):\s+(.*)$", re.M)


def evidence_problems(run: Run) -> list[str]:
    """Where the run's result.json claims what its packed config (train_gpt.py's, else .hydra's) or its run.log (the
    plan it printed, the result block it ended with) contradict: the card, the GPU count, the data, the tokenizer, the
    track. A hand-edited result.json shows here; a run.log that is missing is itself a problem."""
    r, cfg = run.result, run.config
    out = []
    data = (cfg.get("data") or {}).get("name")
    if data is not None and r.get("data") != data:
        out.append(f"result.json says data={r.get('data')}, its packed config data={data}")
    track = (cfg.get("track") or {}).get("name")
    if r.get("track") is not None and r.get("track") != track:
        out.append(f"result.json says track={r.get('track')}, its packed config track={track}")
    dist = cfg.get("dist") or {}
    if isinstance(dist.get("nproc"), int) and isinstance(dist.get("nodes"), int):
        planned = dist["nproc"] * dist["nodes"]
        if int(r.get("world_size") or 1) != planned:
            out.append(f"result.json says {r.get('world_size')} process(es), its packed config {planned}")
    try:
        log = read_text(run.log)
    except (OSError, ValueError):
        return [*out, f"no readable {run.log.name} to check result.json against"]
    out += _log_problems(r, log)
    return out


def _log_problems(r: dict[str, Any], log: str) -> list[str]:
    out = []
    plan = _PLAN_HARDWARE.search(log)
    if plan is None:
        out.append("run.log prints no plan (its hardware line)")
    else:
        hardware, device = plan.group(1), plan.group(2).strip()
        if device != r.get("device_name") or hardware != r.get("hardware"):
            out.append(
                f"result.json says {r.get('hardware')} on {r.get('device_name')}, run.log's plan {hardware} on {device}"
            )
    ranks = _PLAN_RANKS.search(log)
    logged_world = int(ranks.group(1)) if ranks else 1
    if int(r.get("world_size") or 1) != logged_world:
        out.append(f"result.json says {r.get('world_size')} process(es), run.log's plan {logged_world}")
    tail = log[log.rfind("result:") :] if "result:" in log else ""
    block = {k: v.strip() for k, v in _BLOCK_LINE.findall(tail)}
    for key in ("data", "tokenizer_sha256", "world_size", "device_name", "eval_fingerprint", "status"):
        if key in block and block[key] != str(r.get(key)):
            out.append(f"result.json says {key}={r.get(key)}, run.log's result block {block[key]}")
    if not block:
        out.append("run.log ends with no result block")
    return out


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
