"""What a result was measured on: the card (from nvidia-smi), the framework, the code and the corpus.

Nothing here imports torch: ``--list``, ``--dry-run`` and ``--render`` stay quick, and the card is read the way
a person would read it (nvidia-smi), not through a CUDA context the runs would then share.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from speedrun.hardware.cards import card_for

REPO = Path(__file__).resolve().parents[3]
"""The repository root (src/speedrun/bench/ is three levels down): runs start here, relative paths resolve here."""


@dataclass(frozen=True)
class Gpu:
    name: str
    """As nvidia-smi prints it, e.g. ``NVIDIA H100 80GB HBM3``."""
    memory_mib: int | None
    """Total memory in MiB."""
    driver: str | None
    """The driver version."""


@dataclass(frozen=True)
class Machine:
    """The machine a check runs on."""

    gpus: tuple[Gpu, ...]
    """Every GPU nvidia-smi lists (those CUDA_VISIBLE_DEVICES names, when it is set); () without one."""
    cpu: str
    """The processor, for a CPU check."""

    @property
    def card(self) -> str:
        """The card's name as speedrun's card table knows it (``H100 SXM``), else nvidia-smi's; ``cpu``."""
        if not self.gpus:
            return "cpu"
        known = card_for(self.gpus[0].name)
        return known.name if known is not None else self.gpus[0].name

    @property
    def slug(self) -> str:
        """The card in a file name: ``h100-sxm``, ``h200-sxm``, ``cpu``."""
        return re.sub(r"[^a-z0-9]+", "-", self.card.lower()).strip("-") or "gpu"

    def has(self, family: str) -> bool:
        """Whether this machine's card is of ``family`` (``H100``, ``cpu``): a word of the GPU's name."""
        if family == "cpu":
            return not self.gpus
        return bool(self.gpus) and re.search(rf"\b{re.escape(family.lower())}\b", self.gpus[0].name.lower()) is not None

    def describe(self) -> dict[str, object]:
        return {
            "card": self.card,
            "slug": self.slug,
            "gpu_count": len(self.gpus),
            "gpus": [asdict(g) for g in self.gpus],
            "cpu": self.cpu,
        }


def detect() -> Machine:
    """The GPUs nvidia-smi lists (none without nvidia-smi or a driver), restricted to CUDA_VISIBLE_DEVICES."""
    gpus: list[Gpu] = []
    if shutil.which("nvidia-smi"):
        query = "--query-gpu=index,uuid,name,memory.total,driver_version"
        try:
            out = subprocess.run(
                ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        wanted = None if visible is None else {v.strip() for v in visible.split(",") if v.strip()}
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 5:
                continue
            index, uuid, name, memory, driver = parts
            if wanted is not None and index not in wanted and uuid not in wanted:
                continue
            gpus.append(Gpu(name=name, memory_mib=int(memory) if memory.isdigit() else None, driver=driver or None))
    return Machine(gpus=tuple(gpus), cpu=_cpu_name())


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_version() -> str | None:
    """The installed torch's version, read from its metadata (no import: CUDA stays untouched)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Commit:
    sha: str | None
    """The commit the code was at; None when neither git nor ``--commit`` says."""
    dirty: bool | None
    """Whether src/, conf/ or scripts/ differ from it (untracked files count); None when unknown."""
    source: str
    """``git`` or ``--commit`` (a copy of the tree without its .git)."""

    @property
    def short(self) -> str:
        if self.sha is None:
            return "nocommit"
        return self.sha[:9] + ("-dirty" if self.dirty else "")


def commit(given: str | None = None) -> Commit:
    """The code's commit: ``given`` (from ``--commit SHA`` or ``SHA-dirty``) or git's HEAD and working tree."""
    if given:
        sha, _, flag = given.partition("-")
        return Commit(sha=sha, dirty=flag == "dirty" if flag else None, source="--commit")
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "src", "conf", "scripts"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return Commit(sha=None, dirty=None, source="git")
    return Commit(sha=sha or None, dirty=bool(status.strip()), source="git")


def corpus_train_tokens(path: Path | None) -> int | None:
    """The training tokens a corpus holds (``train.tokens`` of the dataset.json speedrun's builds write); None
    without one."""
    try:
        info = json.loads((path / "dataset.json").read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    train = info.get("train") if isinstance(info, dict) else None
    tokens = train.get("tokens") if isinstance(train, dict) else None
    return int(tokens) if isinstance(tokens, (int, float)) and tokens > 0 else None


def corpus_fingerprint(path: Path) -> dict[str, object]:
    """Which data a run read: dataset.json's ``fingerprint`` (speedrun's builds record one), else the sha256 of
    the directory's file names and sizes (parameter-golf's shards come without a manifest)."""
    manifest = path / "dataset.json"
    if manifest.is_file():
        try:
            info = json.loads(manifest.read_text())
        except (OSError, ValueError):
            info = {}
        if isinstance(info, dict) and info.get("fingerprint"):
            return {"fingerprint": str(info["fingerprint"]), "source": "dataset.json"}
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else []
    digest = hashlib.sha256()
    for p in files:
        digest.update(f"{p.name}\t{p.stat().st_size}\n".encode())
    return {"fingerprint": digest.hexdigest()[:16], "source": f"sha256 of {len(files)} file names and sizes"}
