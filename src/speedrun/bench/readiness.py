"""Whether this machine can run a check (one line saying why not and what would let it), and building the check's
corpus when its directory holds no shards yet."""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from speedrun.bench import machine as hw
from speedrun.bench.spec import Check, PeerArm
from speedrun.bench.steps import Options, peer_path

COMMAND_SOURCES = {"pyminify": "pip install python-minifier, or put the folder holding it on PATH"}
"""How to get a command a peer's script runs."""


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
                f"installed here, nor is FlashAttention-4 (flash-attn-4, which the bench would run it on); install one, or pass "
                f"--fa3-shim DIR (a folder holding a stand-in flash_attn_interface.py)"
            )
        absent = [m for m in arm.needs_modules if not importable(m)]
        if absent:
            return (
                f"{check.name}: {arm.peer}'s script imports {', '.join(absent)}, which {opts.python} cannot import; "
                f"pip install {' '.join(absent)}"
            )
        missing = [c for c in arm.needs_commands if shutil.which(c) is None]
        if missing:
            how = "; ".join(f"{c}: {COMMAND_SOURCES.get(c, 'install it')}" for c in missing)
            return f"{check.name}: {arm.peer}'s script runs {', '.join(missing)}, not on PATH here ({how})"
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


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


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
