"""Run a check on this machine: every arm in one process, in passes, then one result file.

Order. A pass runs every seed of every arm; within a pass the arms alternate (A B, A B, ... over ``repeats``
passes), so drift in the machine (clocks, a neighbour's load) falls on both sides of a ratio. A check with
``parallel`` runs a pass's arms at once, each on its own GPUs.

Where things go. Each run gets ``<work>/<check>/<arm>/s<seed>_p<pass>/`` (speedrun's run dir, or the peer's working
directory) and its console output in ``.log`` beside it; earlier files of the same run are removed first, so the
paths ``--dry-run`` prints are the ones used. The result is
``benchmarks/results/<check>/<date>_<card>_<commit>.json``, written atomically (a temp file, then a rename).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from speedrun.bench import machine as hw
from speedrun.bench.metrics import read_result, run_metrics
from speedrun.bench.parsers import PARSERS
from speedrun.bench.resume import resume_metrics
from speedrun.bench.spec import Arm, Check, PeerArm, Ratio, RunArm, judge
from speedrun.records.identity import file_sha256

LOG_TAIL = 40
"""Lines of each run's console output kept in the result file."""
PEERS_DIR = hw.REPO / "peers"
"""Where a peer's script is looked for when ``--peer`` does not name it: peers/<peer>/train_gpt.py (git-ignored)."""


@dataclass(frozen=True)
class Options:
    """How this call runs a check (the CLI's flags)."""

    peers: dict[str, Path] = field(default_factory=dict)
    """Peer scripts by name (``--peer NAME=PATH``)."""
    fa3_shim: Path | None = None
    """A folder holding a stand-in ``flash_attn_interface`` module, put first on a peer's PYTHONPATH."""
    work: Path = hw.REPO / "outputs" / "bench"
    """Where runs write (git-ignored)."""
    results: Path = hw.REPO / "benchmarks" / "results"
    """Where result files go."""
    repeats: int | None = None
    """Passes instead of the check's own ``repeats``."""
    overrides: tuple[str, ...] = ()
    """Extra ``python -m run`` overrides for every speedrun arm (recorded: a result with any is not the check's
    own measurement)."""
    timeout_s: float | None = None
    """Seconds per run instead of the check's own."""
    commit: str | None = None
    """The code's commit for a copy of the tree without .git (SHA, or SHA-dirty)."""
    python: str = sys.executable
    """The interpreter every run starts with."""


@dataclass(frozen=True)
class Step:
    """One run of one arm: what ``--dry-run`` prints and the runner starts."""

    arm: Arm
    seed: int
    pass_index: int
    argv: tuple[str, ...]
    env: dict[str, str]
    """Variables set on top of the inherited environment."""
    cwd: Path
    run_dir: Path
    log: Path
    resume_argv: tuple[str, ...] = ()
    """For an arm stopped and resumed: the command that resumes it, after SIGTERM."""

    def shell(self, argv: tuple[str, ...] | None = None) -> str:
        """The step (or its resume, ``argv``) as one shell line, environment first, to copy and run by hand."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cd = f"cd {shlex.quote(str(self.cwd))} && " if self.cwd != hw.REPO else ""
        return f"{cd}{env + ' ' if env else ''}{' '.join(shlex.quote(a) for a in (argv or self.argv))}"


# ---------------------------------------------------------------------------------------------------- planning


def peer_path(peer: str, opts: Options) -> Path | None:
    """The script for ``peer``: ``--peer`` first, else peers/<peer>/train_gpt.py when it exists."""
    if peer in opts.peers:
        return opts.peers[peer]
    default = PEERS_DIR / peer / "train_gpt.py"
    return default if default.is_file() else None


def corpus_dir(check: Check, resolve_embedded: bool) -> Path | None:
    """The corpus's directory: its declared path from the repository root, or for the embedded corpus the cache
    dir speedrun builds it in (built here when ``resolve_embedded``, which imports torch)."""
    if check.corpus.path is not None:
        return hw.REPO / check.corpus.path
    if not resolve_embedded:
        return None
    from speedrun.data.prepare import ensure_embedded_dataset

    return ensure_embedded_dataset(Path("~/.cache/speedrun"), check.corpus.vocab_size).directory


def gpu_ids(machine: hw.Machine) -> list[str]:
    """The device ids runs may be given, in CUDA_VISIBLE_DEVICES's terms."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    return [str(i) for i in range(len(machine.gpus))]


def plan(check: Check, opts: Options, machine: hw.Machine, data_dir: Path | None = None) -> list[list[Step]]:
    """The runs, as waves: the steps of one wave run one after another, or at once for a ``parallel`` check."""
    ids = gpu_ids(machine)
    repeats = opts.repeats or check.repeats
    root = opts.work / check.name
    waves: list[list[Step]] = []
    for p in range(repeats):
        for seed in check.seeds:
            wave, offset = [], 0
            for arm in check.arms:
                devices = ids[offset : offset + arm.gpus] if check.cards != ("cpu",) else []
                if check.parallel:
                    offset += arm.gpus
                run_dir = root / arm.name / f"s{seed}_p{p + 1}"
                wave.append(_step(check, opts, arm, seed, p, run_dir, devices, data_dir))
            waves.append(wave)
    return waves


def _step(
    check: Check,
    opts: Options,
    arm: Arm,
    seed: int,
    p: int,
    run_dir: Path,
    devices: list[str],
    data_dir: Path | None,
) -> Step:
    env = {"PYTHONUNBUFFERED": "1"}
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    log = run_dir.with_name(run_dir.name + ".log")
    if isinstance(arm, RunArm):
        argv = (
            opts.python,
            "-m",
            "run",
            *arm.overrides,
            *check.corpus.overrides(),
            *opts.overrides,
            f"seed={seed}",
            f"name=bench_{check.name}_{arm.name}",
            f"hydra.run.dir={run_dir}",
            f"results_db={opts.work / check.name / 'results.sqlite'}",
        )
        resume = (opts.python, "-m", "run", f"resume={run_dir}") if arm.stop_after_s else ()
        return Step(arm, seed, p, argv, env, hw.REPO, run_dir, log, resume)
    script = peer_path(arm.peer, opts)
    script_arg = str(script.resolve()) if script else f"<{arm.peer}: --peer {arm.peer}=PATH>"
    fill = {
        "data_path": str(data_dir) if data_dir else "<corpus dir>",
        "tokenizer": str(hw.REPO / check.corpus.tokenizer) if check.corpus.tokenizer else "<tokenizer>",
        "vocab_size": str(check.corpus.vocab_size),
        "seed": str(seed),
        "run_dir": str(run_dir),
    }
    env.update({k: v.format(**fill) for k, v in arm.env.items()})
    if arm.needs_fa3 and opts.fa3_shim is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(opts.fa3_shim.resolve()), os.environ.get("PYTHONPATH")) if p
        )
    if arm.gpus > 1:
        argv = (opts.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={arm.gpus}", script_arg)
    else:
        argv = (opts.python, script_arg)
    return Step(arm, seed, p, argv, env, run_dir, run_dir, log)


# ---------------------------------------------------------------------------------------------------- can it run


def why_not(check: Check, opts: Options, machine: hw.Machine) -> str | None:
    """One line saying why this machine cannot run the check and what would let it, or None when it can."""
    if check.cards == ("cpu",):
        if machine.gpus:
            return f"{check.name} is a CPU check and this machine has {machine.card}; run it on a machine without a GPU"
    else:
        if not machine.gpus:
            return f"{check.name} needs {check.card_text} and this machine has no GPU (nvidia-smi lists none)"
        if check.cards and not any(machine.has(c) for c in check.cards):
            return f"{check.name} needs {check.card_text} and this machine has {machine.card}"
        if len(machine.gpus) < check.gpus:
            return f"{check.name} needs {check.gpus} GPUs and {len(machine.gpus)} are visible here"
    if hw.torch_version() is None:
        return f"{check.name}: torch is not installed in {opts.python}; pip install -e '.[dev]'"
    for arm in check.arms:
        if not isinstance(arm, PeerArm):
            continue
        script = peer_path(arm.peer, opts)
        if script is None:
            return (
                f"{check.name} needs {arm.peer}'s script ({arm.source}); pass --peer {arm.peer}=/path/to/train_gpt.py "
                f"or put it at peers/{arm.peer}/train_gpt.py"
            )
        if not script.is_file():
            return f"{check.name}: --peer {arm.peer}={script} is not a file; give the path of {arm.source}"
        if arm.needs_fa3 and opts.fa3_shim is None and importlib.util.find_spec("flash_attn_interface") is None:
            return (
                f"{check.name}: {arm.peer}'s script imports FlashAttention-3 (flash_attn_interface), which is not "
                f"installed here; install it or pass --fa3-shim DIR (a folder holding a stand-in flash_attn_interface.py)"
            )
    corpus = check.corpus
    if corpus.path is not None and not _has_shards(hw.REPO / corpus.path):
        if not corpus.prepare:
            return (
                f"{check.name} trains on {corpus.data} and {corpus.path} holds no shards; {corpus.how or 'prepare it'}"
            )
        missing = [p for p in corpus.inputs if not (hw.REPO / p).exists()]
        if missing:
            return f"{check.name}: building {corpus.path} needs {', '.join(missing)}; {corpus.how}"
    return None


def _has_shards(path: Path) -> bool:
    return path.is_dir() and any(path.glob("fineweb_train_*.bin")) and any(path.glob("fineweb_val_*.bin"))


def prepare_corpus(check: Check, opts: Options, say: Callable[[str], None]) -> str | None:
    """Build the corpus with its ``prepare`` command when its directory holds no shards; an error line or None."""
    corpus = check.corpus
    if corpus.path is None or _has_shards(hw.REPO / corpus.path):
        return None
    argv = list(corpus.prepare)
    if argv and argv[0] == "python":  # the interpreter the runs use (not `--source python`, a word of the command)
        argv[0] = opts.python
    log = opts.work / check.name / "prepare.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"preparing {corpus.data}: {' '.join(shlex.quote(a) for a in argv)}")
    with open(log, "w") as f:
        rc = subprocess.run(argv, cwd=hw.REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not _has_shards(hw.REPO / corpus.path):
        return f"{check.name}: preparing {corpus.data} failed (exit {rc}); see {log}"
    return None


# ---------------------------------------------------------------------------------------------------- running


def _execute(steps: Sequence[Step], timeout_s: float) -> list[tuple[int | None, float]]:
    """Start ``steps`` at once and wait for all: (exit code or None for a timeout, seconds) for each."""
    started = []
    for step in steps:
        if step.run_dir.exists():
            shutil.rmtree(step.run_dir)
        step.log.unlink(missing_ok=True)
        step.run_dir.mkdir(parents=True)
        f = open(step.log, "w")  # noqa: SIM115 - closed below, after the process ends
        # a session of its own: a timeout stops the run's whole process group (torchrun's ranks included)
        proc = subprocess.Popen(
            step.argv,
            cwd=step.cwd,
            env={**os.environ, **step.env},
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append((proc, f, time.monotonic()))
    out: list[tuple[int | None, float]] = []
    try:
        for proc, f, t0 in started:
            left = max(1.0, timeout_s - (time.monotonic() - t0))
            try:
                rc: int | None = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                _stop(proc)
                rc = None
            f.close()
            out.append((rc, time.monotonic() - t0))
    except BaseException:
        # Ctrl-C reaches this process only (each run has a session of its own): stop the runs before leaving, or
        # they would train on with nobody to read them
        for proc, f, _ in started:
            _stop(proc)
            f.close()
        raise
    return out


def _execute_stopped(step: Step, timeout_s: float) -> tuple[int | None, float]:
    """The run, SIGTERM ``stop_after_s`` seconds after its console says ``warm-up done``, then its resume: the
    resume's exit code (None for a timeout) and the seconds of both parts."""
    assert isinstance(step.arm, RunArm) and step.arm.stop_after_s is not None
    t0 = time.monotonic()
    if step.run_dir.exists():
        shutil.rmtree(step.run_dir)
    step.run_dir.mkdir(parents=True)
    with open(step.log, "w") as f:
        proc = subprocess.Popen(
            step.argv, cwd=step.cwd, env={**os.environ, **step.env}, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        warm = None
        try:
            while proc.poll() is None and time.monotonic() - t0 < timeout_s:
                if warm is None and "warm-up done" in step.log.read_text(errors="replace"):
                    warm = time.monotonic()
                if warm is not None and time.monotonic() - warm >= step.arm.stop_after_s:
                    # the launcher only, as a scheduler's SIGTERM reaches a job: it passes the signal to its ranks
                    os.kill(proc.pid, signal.SIGTERM)
                    break
                time.sleep(1.0)
            proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            _stop(proc)
            return None, time.monotonic() - t0
        except BaseException:
            _stop(proc)
            raise
    with open(step.log, "a") as f:
        f.write(f"\n[speedrun.bench] stopped with SIGTERM; resuming: {step.shell(step.resume_argv)}\n")
        f.flush()
        proc = subprocess.Popen(
            step.resume_argv, cwd=step.cwd, env={**os.environ, **step.env}, stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc = None
        except BaseException:
            _stop(proc)
            raise
    return rc, time.monotonic() - t0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the run's process group (speedrun records an interrupted row), SIGKILL 30 s later."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int = LOG_TAIL) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def collect(check: Check, step: Step, rc: int | None, seconds: float) -> dict[str, Any]:
    """One run's record: status, metrics, where its files are and the tail of its console output."""
    record: dict[str, Any] = {
        "seed": step.seed,
        "pass": step.pass_index + 1,
        "exit_code": rc,
        "seconds": round(seconds, 1),
        "run_dir": str(step.run_dir),
        "log": str(step.log),
    }
    if isinstance(step.arm, RunArm):
        result = read_result(step.run_dir)
        record["status"] = "timeout" if rc is None else (result or {}).get("status") or "no result.json"
        record["metrics"] = run_metrics(result or {}, check.metrics)
        if result and result.get("error"):
            record["error"] = result["error"]
    else:
        text = step.log.read_text(errors="replace") if step.log.is_file() else ""
        parsed = PARSERS[step.arm.parser](text, step.env)
        record["metrics"] = {k: parsed[k] for k in check.metrics if k in parsed}
        if rc is None:
            record["status"] = "timeout"
        elif rc != 0:
            record["status"] = f"exit {rc}"
        else:
            record["status"] = "ok" if "tokens_per_s" in parsed else "no metrics in the log"
    record["log_tail"] = _tail(step.log)
    return record


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


def arm_command(check: Check, arm: Arm) -> str:
    """What an arm runs, without the per-run parts (seed, run dir): the docs' reproduction line for it."""
    if isinstance(arm, RunArm):
        return " ".join(["python -m run", *arm.overrides, *check.corpus.overrides()])
    env = " ".join(f"{k}={v}" for k, v in arm.env.items())
    launch = "python" if arm.gpus == 1 else f"torchrun --standalone --nproc_per_node={arm.gpus}"
    return f"{env} {launch} <{arm.peer}: {arm.source}>"


def reproduce(check: Check, opts: Options, peers: dict[str, Path] | None = None) -> str:
    """The command line that reruns this check as it ran (its flags included)."""
    parts = ["python -m speedrun.bench", check.name]
    for peer in check.peers:
        parts.append(f"--peer {peer}={(peers or {}).get(peer, '<path>')}")
    if any(isinstance(a, PeerArm) and a.needs_fa3 for a in check.arms) and opts.fa3_shim is not None:
        parts.append(f"--fa3-shim {opts.fa3_shim}")
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
    timeout = opts.timeout_s or check.timeout_s
    runs: dict[str, list[dict[str, Any]]] = {a.name: [] for a in check.arms}
    steps_by_arm: dict[str, Step] = {}
    waves = plan(check, opts, machine, data_dir)
    say(f"{check.name} on {machine.card} at {commit.short}: {sum(map(len, waves))} runs")
    for w, wave in enumerate(waves, 1):
        groups = [wave] if check.parallel else [[s] for s in wave]
        for group in groups:
            for step in group:
                say(f"[{_now()}] {w}/{len(waves)} {step.arm.name} seed {step.seed}: {step.shell()}")
            stopped = isinstance(group[0].arm, RunArm) and group[0].arm.stop_after_s is not None
            outcomes = [_execute_stopped(group[0], timeout)] if stopped else _execute(group, timeout)
            for step, (rc, seconds) in zip(group, outcomes):
                record = collect(check, step, rc, seconds)
                runs[step.arm.name].append(record)
                steps_by_arm[step.arm.name] = step
                shown = ", ".join(f"{k} {_show(v)}" for k, v in record["metrics"].items() if v is not None)
                say(f"[{_now()}] {step.arm.name} seed {step.seed}: {record['status']} in {seconds:.0f} s; {shown}")
    add_resume_metrics(check, runs)
    means = {name: mean_metrics(rs, check.metrics) for name, rs in runs.items()}
    bars = []
    for bar in check.bars:
        observed, passed = judge(bar, means)
        bars.append({"bar": bar.text, "observed": observed, "passed": passed})
    every_run_ok = all(r["status"] == "ok" for rs in runs.values() for r in rs)
    passed = every_run_ok and all(b["passed"] for b in bars)
    peers = {a.peer: p for a in check.arms if isinstance(a, PeerArm) and (p := peer_path(a.peer, opts)) is not None}
    result = {
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
        "arms": {
            arm.name: {
                "kind": "run" if isinstance(arm, RunArm) else "peer",
                "command": steps_by_arm[arm.name].shell() if arm.name in steps_by_arm else arm_command(check, arm),
                "metrics": means[arm.name],
                "runs": runs[arm.name],
            }
            for arm in check.arms
        },
        "ratios": pass_ratios(check, runs),
        "bars": bars,
        "all_runs_ok": every_run_ok,
        "passed": passed,
    }
    path = opts.results / check.name / f"{result['date']}_{machine.slug}_{commit.short}.json"
    write_atomic(path, json.dumps(result, indent=1, default=str) + "\n")
    for b in bars:
        say(f"{b['bar']}: observed {_show(b['observed'])}: {'pass' if b['passed'] else 'FAIL'}")
    if not every_run_ok:
        say("not every run finished ok: the check fails; each run's log tail is in the result file")
    say(f"{check.name}: {'passed' if passed else 'FAILED'}; result: {path}")
    return (0 if passed else 1), path


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temp file in the same folder and a rename: a reader never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _now() -> str:
    return datetime.now().strftime("%H:%M:%S")


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.5g}"
    return str(value)
