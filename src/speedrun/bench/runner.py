"""Run a check on this machine: every arm in one process, in passes, then one result file.

Order. A pass runs every seed of every arm; within a pass the arms alternate (A B, A B, ... over ``repeats``
passes), so drift in the machine (clocks, a neighbour's load) falls on both sides of a ratio. A check with
``parallel`` runs a pass's arms at once, each on its own GPUs (given in reverse order on every second pass).

Where things go. Each run gets ``<work>/<check>/<arm>/s<seed>_p<pass>/`` (speedrun's run dir, or the peer's working
directory) and its console output in ``.log`` beside it; earlier files of the same run are removed first, so the
paths ``--dry-run`` prints are the ones used. The result is
``benchmarks/results/<check>/<date>_<card>_<commit>.json``, written atomically (a temp file, then a rename).

The steps come from steps.py, whether this machine can run them from readiness.py, their processes from
execute.py; this module runs the passes and writes what they measured.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from speedrun.bench import fa4
from speedrun.bench import machine as hw
from speedrun.bench.execute import Outcome, execute, execute_stopped
from speedrun.bench.metrics import read_result, run_metrics
from speedrun.bench.parsers import PARSERS
from speedrun.bench.readiness import prepare_corpus, why_not
from speedrun.bench.resume import resume_metrics
from speedrun.bench.spec import Check, PeerArm, Ratio, RunArm, judge
from speedrun.bench.steps import Options, Step, arm_command, corpus_dir, peer_path, plan
from speedrun.records.atomic import atomic_write
from speedrun.records.identity import file_sha256
from speedrun.tables import BLOCK_KEYS

LOG_TAIL = 40
"""Lines of each run's console output kept in the result file."""


def _tail(path: Path, lines: int = LOG_TAIL) -> list[str]:
    """At most ``lines`` lines ending the log. A speedrun run's result block (its last BLOCK_KEYS lines, found by
    its first key) keeps its status line and the keys that hold a value, whatever the block's length, and the
    lines before it fill the rest: what the run printed last is what tells why it failed."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    first = f"{BLOCK_KEYS[0]}:"
    start = next((i for i in range(len(text) - 1, -1, -1) if text[i].startswith(first)), None)
    if start is None or len(text) - start > len(BLOCK_KEYS):
        return text[-lines:]
    block = [text[start]] + [line for line in text[start + 1 :] if line.split(":", 1)[-1].strip() != "None"]
    block = block if len(block) <= lines else [block[0], *block[len(block) - lines + 1 :]]
    before = text[max(0, start - (lines - len(block))) : start] if len(block) < lines else []
    return before + block


def collect(check: Check, step: Step, outcome: Outcome, train_tokens: int | None = None) -> dict[str, Any]:
    """One run's record: status, metrics, where its files are and the tail of its console output. A peer's
    ``epochs`` is the tokens its log says it trained on over the corpus's ``train_tokens`` (speedrun's runs record
    their own); ``startup_seconds`` is the runner's own clock (speedrun.bench.execute), the same for both kinds."""
    rc, seconds = outcome.rc, outcome.seconds
    record: dict[str, Any] = {
        "seed": step.seed,
        "pass": step.pass_index + 1,
        "exit_code": rc,
        "seconds": round(seconds, 1),
        "run_dir": str(step.run_dir),
        "log": str(step.log),
    }
    if step.gate is not None and (waited := _gate_wait(step.log)) is not None:
        record["start_gate_seconds"] = waited  # how long this run held its training back for the peers beside it
    if isinstance(step.arm, RunArm):
        result = read_result(step.run_dir)
        record["status"] = "timeout" if rc is None else (result or {}).get("status") or "no result.json"
        record["metrics"] = run_metrics(result or {}, check.metrics, step.run_dir)
        if result and result.get("error"):
            record["error"] = result["error"]
    else:
        text = step.log.read_text(errors="replace") if step.log.is_file() else ""
        parsed = PARSERS[step.arm.parser](text, step.env)
        if train_tokens and parsed.get("tokens") is not None:
            parsed["epochs"] = round(float(parsed["tokens"]) / train_tokens, 3)
        record["metrics"] = {k: parsed[k] for k in check.metrics if k in parsed}
        if rc is None:
            record["status"] = "timeout"
        elif rc != 0:
            record["status"] = f"exit {rc}"
        else:
            record["status"] = "ok" if "tokens_per_s" in parsed else "no metrics in the log"
    if "startup_seconds" in check.metrics and outcome.ready_s is not None:
        record["metrics"]["startup_seconds"] = round(outcome.ready_s, 1)
    record["log_tail"] = _tail(step.log)
    return record


def _gate_wait(log: Path) -> float | None:
    """The seconds a gated speedrun run says it waited at its start gate (speedrun.run.hooks)."""
    try:
        found = re.findall(r"start gate open after ([0-9.]+) s", log.read_text(errors="replace"))
    except OSError:
        return None
    return float(found[-1]) if found else None


def add_resume_metrics(check: Check, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Into each run of an arm stopped and resumed: its comparison with the uninterrupted arm's run of the same seed
    and pass (speedrun.bench.resume)."""
    for arm in check.arms:
        if not isinstance(arm, RunArm) or arm.compare_with is None:
            continue
        for record in runs[arm.name]:
            ref = next(
                (r for r in runs[arm.compare_with] if (r["seed"], r["pass"]) == (record["seed"], record["pass"])), None
            )
            if ref is None:
                continue
            found = resume_metrics(Path(ref["run_dir"]), Path(record["run_dir"]))
            record["metrics"].update({k: v for k, v in found.items() if k in check.metrics})


def mean_metrics(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Each metric's mean over an arm's ok runs (a non-number: its value when every run agrees, else the list)."""
    out: dict[str, Any] = {}
    ok = [r for r in runs if r["status"] == "ok"]
    for name in names:
        values = [r["metrics"].get(name) for r in ok if r["metrics"].get(name) is not None]
        if not values:
            out[name] = None
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[name] = sum(values) / len(values)
        elif all(isinstance(v, bool) for v in values):
            out[name] = sum(values) / len(values)  # the fraction of runs where it held (e.g. reached)
        else:
            out[name] = values[0] if all(v == values[0] for v in values) else values
    return out


def pass_ratios(check: Check, runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[float | None]]:
    """Each Ratio bar's ratio pass by pass (and seed by seed): the spread behind the mean's ratio."""
    out: dict[str, list[float | None]] = {}
    for bar in check.bars:
        if not isinstance(bar, Ratio):
            continue
        values: list[float | None] = []
        for a, b in zip(runs[bar.num], runs[bar.den]):
            x, y = a["metrics"].get(bar.metric), b["metrics"].get(bar.metric)
            ok = a["status"] == b["status"] == "ok" and isinstance(x, int | float) and isinstance(y, int | float)
            values.append(round(x / y, 4) if ok and y else None)
        out[bar.text] = values
    return out


def reproduce(check: Check, opts: Options, peers: dict[str, Path] | None = None) -> str:
    """The command line that reruns this check as it ran (its flags included)."""
    parts = ["python -m speedrun.bench", shlex.quote(check.name)]  # each word quoted: paths may hold anything
    for peer in check.peers:
        where = (peers or {}).get(peer, "<path>")
        parts.append(f"--peer {shlex.quote(f'{peer}={where}')}")
    needs_fa3 = any(isinstance(a, PeerArm) and a.needs_fa3 for a in check.arms)
    if needs_fa3 and opts.fa3_shim is not None and not fa4.is_shim(opts.fa3_shim / "flash_attn_interface.py"):
        parts.append(f"--fa3-shim {shlex.quote(str(opts.fa3_shim))}")  # FA4's is written again where installed
    if opts.repeats:
        parts.append(f"--repeats {opts.repeats}")
    parts += [f"--override {shlex.quote(o)}" for o in opts.overrides]
    if opts.timeout_s:
        parts.append(f"--timeout {opts.timeout_s:g}")
    return " ".join(parts)


def run_check(check: Check, opts: Options, say: Callable[[str], None] = print) -> tuple[int, Path | None]:
    """Run ``check`` here and write its result: (exit status, result file). 0 passed, 1 a bar failed or a run did
    not finish, 2 this machine cannot run it (one line says why; nothing is written)."""
    machine = hw.detect()
    reason = why_not(check, opts, machine)
    if reason is not None:
        say(reason)
        return 2, None
    failure = prepare_corpus(check, opts, say)
    if failure is not None:
        say(failure)
        return 1, None
    data_dir = corpus_dir(check, resolve_embedded=True)
    commit = hw.commit(opts.commit)
    started = datetime.now(timezone.utc)
    waves = plan(check, opts, machine, data_dir)
    say(f"{check.name} on {machine.card} at {commit.short}: {sum(map(len, waves))} runs")
    done = run_waves(check, waves, opts.timeout_s or check.timeout_s, say, hw.corpus_train_tokens(data_dir))
    add_resume_metrics(check, done.runs)
    result = result_record(check, opts, done, machine, commit, started, data_dir)
    path = opts.results / check.name / f"{result['date']}_{machine.slug}_{commit.short}.json"
    write_atomic(path, json.dumps(result, indent=1, default=str) + "\n")
    for b in result["bars"]:
        say(f"{b['bar']}: observed {_show(b['observed'])}: {'pass' if b['passed'] else 'FAIL'}")
    if not result["all_runs_ok"]:
        say("not every run finished ok: the check fails; each run's log tail is in the result file")
    say(f"{check.name}: {'passed' if result['passed'] else 'FAILED'}; result: {path}")
    return (0 if result["passed"] else 1), path


@dataclass
class Done:
    """What the passes left: each arm's run records in order, and the last step of each arm (its command)."""

    runs: dict[str, list[dict[str, Any]]]
    steps: dict[str, Step]


def run_waves(
    check: Check,
    waves: list[list[Step]],
    timeout: float,
    say: Callable[[str], None],
    train_tokens: int | None = None,
) -> Done:
    """Run every wave's steps (one after another, or at once for a ``parallel`` check) and collect their records."""
    done = Done({a.name: [] for a in check.arms}, {})
    for w, wave in enumerate(waves, 1):
        groups = [wave] if check.parallel else [[s] for s in wave]
        for group in groups:
            for step in group:
                say(f"[{_now()}] {w}/{len(waves)} {step.arm.name} seed {step.seed}: {step.shell()}")
            stopped = isinstance(group[0].arm, RunArm) and group[0].arm.stop_after_s is not None
            outcomes = [execute_stopped(group[0], timeout)] if stopped else execute(group, timeout)
            for step, outcome in zip(group, outcomes):
                record = collect(check, step, outcome, train_tokens)
                done.runs[step.arm.name].append(record)
                done.steps[step.arm.name] = step
                shown = ", ".join(f"{k} {_show(v)}" for k, v in record["metrics"].items() if v is not None)
                took = f"{record['status']} in {outcome.seconds:.0f} s"
                say(f"[{_now()}] {step.arm.name} seed {step.seed}: {took}; {shown}")
    return done


def result_record(
    check: Check,
    opts: Options,
    done: Done,
    machine: hw.Machine,
    commit: hw.Commit,
    started: datetime,
    data_dir: Path | None,
) -> dict[str, Any]:
    """The result file's content: where and what ran, each arm's runs and means, the ratios and the bars."""
    runs = done.runs
    means = {name: mean_metrics(rs, check.metrics) for name, rs in runs.items()}
    bars = []
    for bar in check.bars:
        observed, passed = judge(bar, means)
        bars.append({"bar": bar.text, "observed": observed, "passed": passed})
    every_run_ok = all(r["status"] == "ok" for rs in runs.values() for r in rs)
    peers = {a.peer: p for a in check.arms if isinstance(a, PeerArm) and (p := peer_path(a.peer, opts)) is not None}
    return {
        "check": check.name,
        "measures": check.measures,
        "date": started.strftime("%Y-%m-%d"),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine.describe(),
        "torch": hw.torch_version(),
        "python": sys.version.split()[0],
        "commit": commit.sha,
        "dirty": commit.dirty,
        "commit_source": commit.source,
        "command": reproduce(check, opts, peers),
        "overrides": list(opts.overrides),
        "repeats": opts.repeats or check.repeats,
        "seeds": list(check.seeds),
        "corpus": {
            "data": check.corpus.data,
            "path": str(data_dir) if data_dir else None,
            **(hw.corpus_fingerprint(data_dir) if data_dir else {}),
        },
        "peers": {name: {"path": str(p), "sha256": file_sha256(p)} for name, p in peers.items()},
        "fa3_stand_in": fa3_stand_in(check, opts),
        "arms": {
            arm.name: {
                "kind": "run" if isinstance(arm, RunArm) else "peer",
                "command": done.steps[arm.name].shell() if arm.name in done.steps else arm_command(check, arm),
                "metrics": means[arm.name],
                "runs": runs[arm.name],
            }
            for arm in check.arms
        },
        "ratios": pass_ratios(check, runs),
        "bars": bars,
        "all_runs_ok": every_run_ok,
        "passed": every_run_ok and all(b["passed"] for b in bars),
    }


def fa3_stand_in(check: Check, opts: Options) -> dict[str, str] | None:
    """The stand-in flash_attn_interface.py a peer ran on (--fa3-shim, or FA4's, speedrun.bench.fa4), with its
    sha256 and kind: a peer's numbers depend on it as much as on the peer's own script."""
    if opts.fa3_shim is None or not any(isinstance(a, PeerArm) and a.needs_fa3 for a in check.arms):
        return None
    path = opts.fa3_shim / "flash_attn_interface.py"
    if not path.is_file():
        return None
    kind = f"FlashAttention-4 {fa4.installed()}" if fa4.is_shim(path) else "the --fa3-shim stand-in"
    return {"path": str(path), "sha256": file_sha256(path), "kind": kind}


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temp file in the same folder and a rename: a reader never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)


def _now() -> str:
    return datetime.now().strftime("%H:%M:%S")


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.5g}"
    return str(value)
