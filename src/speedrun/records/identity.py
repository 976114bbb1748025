"""What a result depends on besides its config: the card that computed it and the code that ran.

Resume (the sweeper) reuses an earlier ok run only when both match the sweeping process's: the same
``current_device_name()`` (the ``device_name`` a run records) and the same ``code_fingerprint(REPO_ROOT)`` (the
``code_fingerprint`` a run records), so a sweep moved to another card or a code edit makes the jobs run again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from speedrun.hardware.profiles import detect

DEVICE_NAME_ENV = "SPEEDRUN_DEVICE_NAME"
"""Overrides ``current_device_name()``: for a sweep launched where its jobs do not run (a SLURM login node, whose
own device says nothing about the compute nodes'), and for tests that pretend to be on another card."""

GPU_SHARED_ENV = "SPEEDRUN_GPU_SHARED"
"""Set to 1 by the pool launcher for a job that shares its GPU with others (hydra.launcher.jobs_per_gpu > 1); the
run records ``gpu_shared``, since its speed and memory are then not the card's alone."""

SWEEP_REUSE_IGNORED = ("sweep", "objective", "logger", "results_db", "checkpoint", "resume", "accept_code_change")
"""Top-level keys a sweep's resume ignores when it looks for an earlier ok run to stand in for a job: they change
none of a finished run's numbers (how often it was checkpointed, or that it was resumed from one, included)."""

AUTO_RESUME_IGNORED = ("sweep", "objective", "logger", "results_db", "resume", "accept_code_change")
"""Top-level keys auto-resume ignores when it decides that a checkpoint in the run dir is this job's own (a SLURM
job requeued into its dir). Unlike a sweep's reuse it keeps ``checkpoint``: the continued job goes on
checkpointing as the original did, so other checkpoint settings make another job."""

CODE_DIRS = ("src", "conf")
"""What a run's code is: everything under these (the package, the entry point, the Hydra config tree)."""

FALLBACK_SUFFIXES = (".py", ".yaml")
"""Without git: the files of these kinds under CODE_DIRS."""


def config_identity(config: Any, ignore: tuple[str, ...]) -> str | None:
    """A canonical string for a composed config (a dict, or its JSON text as the results row keeps it) without
    the top-level keys in ``ignore``; None for something that is not a config. Two configs that compare equal here
    train the same way."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return None
    if not isinstance(config, dict):
        return None
    return json.dumps({k: v for k, v in config.items() if k not in ignore}, sort_keys=True, default=str)


def current_device_name() -> str:
    """The card a job launched from here runs on, named as runs record it (``device_name``): CUDA device 0
    (``torch.cuda.get_device_name(0)``) when there is one, else the CPU's model name; ``$SPEEDRUN_DEVICE_NAME``
    when set."""
    override = os.environ.get(DEVICE_NAME_ENV, "").strip()
    return override or _detected_device_name()


@functools.lru_cache(maxsize=1)
def _detected_device_name() -> str:
    # Asked in a child process: touching CUDA here would leave the sweeping process holding a context (hundreds of
    # MB) on GPU 0 for the whole sweep, beside the jobs the pool runs there.
    package_parent = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)}
    code = "from speedrun.hardware.profiles import detect; print(detect().name)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        lines = out.stdout.strip().splitlines()
        if out.returncode == 0 and lines:
            return lines[-1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return detect().name  # the child could not run: ask here rather than not at all


def gpu_identity(device: str) -> dict[str, Any]:
    """Which physical card this process computes on: ``gpu_uuid`` (as nvidia-smi prints it, ``GPU-...``) and the
    ``cuda_visible_devices`` it was given (the pool launcher's GPU index). Cards of one model differ in speed (clocks,
    power, cooling), so runs of one sweep on a slower card can be told apart (``--group-by ablate,gpu_uuid``).
    None on CPU, or where torch cannot say."""
    return {
        "gpu_uuid": gpu_uuid() if device == "cuda" else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def gpu_uuid() -> str | None:
    """The UUID of this process's current CUDA device, ``GPU-`` prefixed as nvidia-smi prints it; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    except (AttributeError, RuntimeError):  # a torch without the field, or a device that cannot be queried
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks (checkpoints, peers' scripts: files of any size)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def code_fingerprint(root: Path) -> str:
    """16 hex digits hashing the path and contents of every source file under ``root``/src and ``root``/conf, as
    they are in the working tree (uncommitted edits count): the files git lists as tracked or untracked-but-not-
    ignored (``git ls-files -co --exclude-standard``), or, where git is unavailable, every *.py and *.yaml."""
    root = Path(root)
    files = _git_files(root) or _walked_files(root)
    h = hashlib.sha256()
    for rel in sorted(set(files)):
        try:
            data = (root / rel).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue  # tracked but deleted in the working tree: the run does not have it either
        # the length keeps file boundaries unambiguous (no two file sets hash the same by shifting bytes)
        h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]


def _git_files(root: Path) -> list[str] | None:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *CODE_DIRS],
            cwd=root,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:  # not a git checkout
        return None
    return [p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _walked_files(root: Path) -> list[str]:
    files = []
    for top in CODE_DIRS:
        for path in (root / top).rglob("*"):
            if path.suffix in FALLBACK_SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
                files.append(path.relative_to(root).as_posix())
    return files
