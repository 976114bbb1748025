"""The entry point of a self-extracting train_gpt.py (speedrun.artifact.wrap): re-run the run it carries, without
Hydra, where speedrun is not installed.

    python train_gpt.py
    DATA_PATH=<shards dir> TOKENIZER_PATH=<tokenizer .model> SEED=1 torchrun --standalone --nproc_per_node=8 train_gpt.py

It refuses a torch of another major version than the run's, then takes the run's resolved config as it is, except:
the data (parameter-golf's DATA_PATH and TOKENIZER_PATH when set), the seed (SEED), the ranks (torchrun's), and the
record, which goes to ./runs/ (run dirs and results.sqlite) instead of the original machine's paths. The code it
counts is this file itself (artifact.code_file), so the re-run's artifact_code_bytes is the file's length. Then it
runs the job `python -m run` runs (speedrun.main with an explicit run dir) and prints the same result block.

Only the standard library is imported before the torch check, so a wrong environment fails in one line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import speedrun

FORMAT = 1
"""The payload layout this entry point reads (speedrun.artifact.wrap.FORMAT when the file was made)."""

PGOLF_DATA = "data/datasets/fineweb10B_sp{vocab}"
PGOLF_TOKENIZER = "data/tokenizers/fineweb_{vocab}_bpe.model"
"""Where parameter-golf's repository keeps its shards and tokenizers (its train_gpt.py's defaults), relative to the
directory a record is run from."""
GPT2_TOKENIZER = "gpt2"
"""speedrun.core.data.GPT2, data.tokenizer's name for GPT-2's vocabulary (not imported from there: that
module imports torch, which this one checks before importing)."""


class Refusal(SystemExit):
    """This file cannot re-run here; the message names the fix."""

    def __init__(self, message: str):
        super().__init__(f"error: {message}")


def main(meta: str | dict[str, Any], file: str) -> dict[str, Any]:
    """Re-run the run described by ``meta`` (the file's M) from the self-extracting ``file``."""
    meta = json.loads(meta) if isinstance(meta, str) else meta
    if meta.get("format") != FORMAT:
        raise Refusal(f"{file} has payload format {meta.get('format')}; this entry point reads format {FORMAT}")
    check_torch(meta.get("versions", {}).get("torch"), _installed_torch())
    if not meta.get("config"):
        raise Refusal(f"{file} carries no config (it was made only to be counted); export a finished run instead")
    tree = rerun_config(meta["config"], os.environ, Path(file).resolve(), Path.cwd())
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S") + f"-{time.time_ns() // 1000 % 1_000_000:06d}"
    run_dir = Path.cwd() / "runs" / f"{stamp}_{tree['name']}_seed{tree['seed']}"
    return speedrun.main(tree, run_dir=run_dir)  # the plain tree: no OmegaConf, no Hydra


def _installed_torch() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def check_torch(recorded: str | None, installed: str | None) -> None:
    """Refuse a torch whose major version differs from the run's: kernels, defaults and numerics change across
    majors, and the re-run would not be the run."""
    if recorded is None:
        return
    major = recorded.split(".")[0]
    want = f"pip install 'torch>={major},<{int(major) + 1}'"
    if installed is None:
        raise Refusal(f"this run needs torch {major}.x (it ran with torch {recorded}), which is not installed: {want}")
    if installed.split(".")[0] != major:
        raise Refusal(
            f"this run ran with torch {recorded} and this Python has torch {installed}, another major version; "
            f"install torch {major}.x to re-run it: {want}"
        )


def rerun_config(config: dict[str, Any], env: Mapping[str, str], file: Path, cwd: Path) -> dict[str, Any]:
    """The resolved config as the re-run takes it (module docstring): data, seed, ranks and record replaced."""
    tree = json.loads(json.dumps(config))  # a copy: the caller's stays as the file carries it
    tree["data"] = rerun_data(tree["data"], env, cwd)
    if env.get("SEED"):
        tree["seed"] = int(env["SEED"])
    tree["dist"] = rerun_dist(tree.get("dist", {}), env)
    tree.update(results_db=str(cwd / "runs" / "results.sqlite"), sweep=None, resume=None)
    tree.setdefault("artifact", {})
    tree["artifact"].update(code_rule="wrapped", code_file=str(file))
    return tree


def rerun_data(data: dict[str, Any], env: Mapping[str, str], cwd: Path) -> dict[str, Any]:
    """data.path and data.tokenizer for this machine: DATA_PATH and TOKENIZER_PATH when set (a tokenizer.model inside
    DATA_PATH will do for the second), else the run's own paths where they exist, else parameter-golf's layout under
    the current directory; a run on the embedded corpus (which the file does not carry) reads the dataset it was
    built into, in data.cache_dir."""
    from_env, tokenizer = env.get("DATA_PATH"), env.get("TOKENIZER_PATH")
    if from_env:
        if not tokenizer and (Path(from_env) / "tokenizer.model").is_file():
            tokenizer = str(Path(from_env) / "tokenizer.model")
        if not tokenizer and data.get("tokenizer") == GPT2_TOKENIZER:  # a name, not a file: it holds on any machine
            tokenizer = GPT2_TOKENIZER
        if not tokenizer:
            raise Refusal(f"DATA_PATH={from_env} needs TOKENIZER_PATH=<the SentencePiece .model of those shards>")
        if tokenizer != GPT2_TOKENIZER:
            tokenizer = str(Path(tokenizer).resolve())
        return {**data, "path": str(Path(from_env).resolve()), "tokenizer": tokenizer}
    if tokenizer:
        raise Refusal(f"TOKENIZER_PATH={tokenizer} needs DATA_PATH=<the directory of the shards it tokenized>")
    vocab = data["vocab_size"]
    if data.get("path") is not None:
        if Path(data["path"]).is_dir():
            return data
        shards, model = cwd / PGOLF_DATA.format(vocab=vocab), cwd / PGOLF_TOKENIZER.format(vocab=vocab)
        if shards.is_dir() and model.is_file():
            return {**data, "path": str(shards), "tokenizer": str(model)}
        return data  # the run fails before training, naming the missing directory and how to get it
    # here, not at the top: speedrun.data imports torch, and without torch this module must still load to say so
    from speedrun.data.layout import TOKENIZER_FILE, embedded_dir

    built = embedded_dir(Path(data["cache_dir"]), vocab)
    if (built / TOKENIZER_FILE).is_file():
        return {**data, "path": str(built), "tokenizer": str(built / TOKENIZER_FILE)}
    raise Refusal(
        f"this run trained on speedrun's embedded corpus, which the file does not carry, and {built} holds no built "
        f"copy: set DATA_PATH=<a dataset dir built from it, e.g. {built.name}/ copied from the machine that ran> "
        f"(TOKENIZER_PATH defaults to its {TOKENIZER_FILE}), or run `python -m run` once where speedrun is "
        "installed, which builds it there"
    )


def rerun_dist(dist: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Under torchrun its ranks are the run's (any count: tokens per step stay the run's); a plain `python` of a run
    that had several ranks is refused with the torchrun command, since speedrun's own launch needs its CLI."""
    world = int(env.get("WORLD_SIZE") or 1)
    if world > 1 or "RANK" in env:
        per_node = int(env.get("LOCAL_WORLD_SIZE") or world)
        return {**dist, "nproc": per_node, "nodes": max(1, world // per_node)}
    nproc, nodes = int(dist.get("nproc", 1)), int(dist.get("nodes", 1))
    if nproc * nodes > 1:
        raise Refusal(
            f"this run trained on {nproc * nodes} ranks ({nodes} node(s) x {nproc}): start it with "
            f"`torchrun --standalone --nproc_per_node={nproc} {sys.argv[0]}`"
        )
    return dist
