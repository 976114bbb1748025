"""What a check runs: one step per arm, seed and pass (the command, its environment, its run dir and log), grouped
in waves, and the options of the call that runs them."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from speedrun.bench import machine as hw
from speedrun.bench.parsers import READY_LINES
from speedrun.bench.spec import Arm, Check, PeerArm, RunArm
from speedrun.run.hooks import READY_LINE, START_GATE_ENV

RUN_READY = rf"^\[[0-9:]+\] {READY_LINE}$"
"""speedrun's console line once its warm-up (and GPTQ's reserve, a profile, a restore) is done, right before its
start gate and its timed training."""

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
    ready: str | None = None
    """A regex for the log line that says timed training has begun (its first sighting gives ``startup_seconds``)."""
    gate: Path | None = None
    """A speedrun run's start gate (speedrun.run.hooks): created when every peer run of its wave has begun
    training."""

    def shell(self, argv: tuple[str, ...] | None = None) -> str:
        """The step (or its resume, ``argv``) as one shell line, environment first, to copy and run by hand."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cd = f"cd {shlex.quote(str(self.cwd))} && " if self.cwd != hw.REPO else ""
        return f"{cd}{env + ' ' if env else ''}{' '.join(shlex.quote(a) for a in (argv or self.argv))}"


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
    # here, not at the top: speedrun.data imports torch, and --list, --dry-run and the refusals run without it
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
            devices = _devices(check, ids, swapped=p % 2 == 1)
            wave = []
            for arm in check.arms:
                run_dir = root / arm.name / f"s{seed}_p{p + 1}"
                wave.append(_step(check, opts, arm, seed, p, run_dir, devices[arm.name], data_dir))
            waves.append(_gated(check, wave, root / f"start_gate_s{seed}_p{p + 1}"))
    return waves


def _gated(check: Check, wave: list[Step], gate: Path) -> list[Step]:
    """A parallel wave of speedrun and peer runs: the speedrun runs wait at ``gate`` after their warm-up, so that
    they train while the peers train, not while a peer's (longer) compile still loads the host."""
    if not check.parallel or not any(isinstance(s.arm, PeerArm) for s in wave):
        return wave
    for s in wave:
        if isinstance(s.arm, PeerArm) and s.ready is None:
            raise ValueError(
                f"check {check.name}: parser {s.arm.parser!r} names no first training-step line, so the speedrun "
                "arms beside it cannot wait for it: add one to speedrun.bench.parsers.READY_LINES"
            )
        if isinstance(s.arm, RunArm) and s.arm.stop_after_s is not None:
            raise ValueError(
                f"check {check.name}: arm {s.arm.name} is stopped and resumed, which a start gate cannot hold"
            )
    return [
        replace(s, env={**s.env, START_GATE_ENV: str(gate)}, gate=gate) if isinstance(s.arm, RunArm) else s
        for s in wave
    ]


def _devices(check: Check, ids: list[str], swapped: bool) -> dict[str, list[str]]:
    """{arm: its device ids}. A parallel check gives each arm GPUs of its own, in the arms' order, and in reverse
    order on every second pass, so that a card's difference from its neighbour shows up in both arms alike."""
    if check.cards == ("cpu",):
        return {arm.name: [] for arm in check.arms}
    if not check.parallel:
        return {arm.name: ids[: arm.gpus] for arm in check.arms}
    out, offset = {}, 0
    for arm in reversed(check.arms) if swapped else check.arms:
        out[arm.name] = ids[offset : offset + arm.gpus]
        offset += arm.gpus
    return out


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
        return Step(arm, seed, p, argv, env, hw.REPO, run_dir, log, resume, RUN_READY)
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
    return Step(arm, seed, p, argv, env, run_dir, run_dir, log, ready=READY_LINES.get(arm.parser))


def arm_command(check: Check, arm: Arm) -> str:
    """What an arm runs, without the per-run parts (seed, run dir): the docs' reproduction line for it."""
    if isinstance(arm, RunArm):
        return " ".join(["python -m run", *(shlex.quote(o) for o in [*arm.overrides, *check.corpus.overrides()])])
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in arm.env.items())
    launch = "python" if arm.gpus == 1 else f"torchrun --standalone --nproc_per_node={arm.gpus}"
    return f"{env} {launch} <{arm.peer}: {arm.source}>"
