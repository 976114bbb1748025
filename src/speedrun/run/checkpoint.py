"""Checkpoints: everything the training loop needs to continue bit for bit, written atomically into the run dir.

``<run dir>/checkpoints/step_<steps>.pt`` holds the model, the optimizers, the GradScaler, the weights' EMA (when
ema.decay is set; None otherwise), the data position, the RNG states and the loop's progress (TrainState: steps,
tokens, FLOPs, elapsed train seconds, stage index...);
``step_<steps>.json`` beside it holds what resume reads without loading tensors (the composed config, the
overrides, the Plan, the progress, the code fingerprint of the run and the sha256 of the .pt). Both are written to a
temporary name and renamed into place, the .pt first, so a checkpoint counts only once both exist; the oldest are
deleted beyond ``checkpoint.keep``. A .pt whose bytes no longer match its sha256 (a bit flip, a file cut short) is
skipped for the previous checkpoint, with one warning.

Loading uses ``torch.load(weights_only=True)``: the payload is tensors, numbers, strings, lists and dicts, and
nothing else is ever unpickled. torch is imported inside the functions that need it: the listing functions serve
resume's checks (and Hydra's resolvers, which run at every start).

Several ranks: one file, written by rank 0 (not torch.distributed.checkpoint). Nothing of the training state is
sharded: every rank holds the whole model (rank 0's weights broadcast at the start, then the same all-reduced
gradients), the whole of every optimizer's state (Adam's moments, and Muon's momentum buffers, which stay whole on
every rank: only its Newton-Schulz work is split, and all-gathered, World.split_newton_schulz), the same scaler and
EMA. So rank 0's copy is the state, and a single file is what a later run of any number of ranks reads; DCP would
add a directory of per-rank shards and a resharding step for state that has none. What does differ per rank (its
RNG states and, in principle, its data position) is gathered to rank 0 (``rank_state``) and kept under ``ranks``.
The ranks meet at the step boundary (periodic.LoopExtras.save): all gather, rank 0 writes and broadcasts the path,
so no rank goes on before the file is in place. On resume rank 0 picks the newest readable checkpoint and every
rank loads that file (``load_checkpoint_file``).

The data position is the global offset of the next step's span in the token stream (data.loader.TokenStream: each
step reads tokens_per_step consecutive tokens, of which each rank reads its slices), the same on every rank and the
same whatever the number of ranks. A step covers the same tokens on one rank with accumulation 4 as on two ranks
with accumulation 2, so a checkpoint resumed on any number of ranks that splits the step trains on the same global
batches, step for step (the gradient sums run in another order: equal to float rounding,
tests/training/test_checkpoint_ranks.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import re
from pathlib import Path
from typing import Any

from speedrun.records.atomic import atomic_write
from speedrun.records.identity import file_sha256

log = logging.getLogger("speedrun")

FORMAT = 1
DIRNAME = "checkpoints"
_NAME = re.compile(r"^step_(\d+)\.pt$")


class CheckpointFormatError(ValueError):
    """A checkpoint written by code of another format: refused, never skipped for an older one."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / DIRNAME


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (.pt with its .json), oldest first."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name)) and p.with_suffix(".json").exists()
    ]
    return [p for _, p in sorted(found)]


def latest_meta(run_dir: Path) -> dict[str, Any] | None:
    """The .json of the newest complete checkpoint (config, overrides, plan, progress) that reads as one, or None
    when there is no checkpoint. A newest .json cut short or malformed is skipped for the previous checkpoint with
    one warning, as a bad .pt is (load_checkpoint); ValueError naming the newest one's problem when none reads."""
    paths = list_checkpoints(run_dir)
    first: str | None = None
    for path in reversed(paths):
        try:
            return read_meta(path.with_suffix(".json"))
        except (OSError, ValueError) as e:
            first = first or f"{path.with_suffix('.json')}: {e}"
            log.warning("checkpoint %s unreadable (%s); trying an older one", path.with_suffix(".json"), e)
    if first is not None:
        raise ValueError(f"no checkpoint's .json is readable ({first})")
    return None


def read_meta(path: Path) -> dict[str, Any]:
    """One checkpoint .json, checked for what resume reads: an object with a config (object), steps (a count)
    and overrides (a list of strings); ValueError naming the first that is not."""
    meta = json.loads(path.read_text())
    if not isinstance(meta, dict):
        raise ValueError(f"holds a JSON {type(meta).__name__}, not an object")
    if not isinstance(meta.get("config"), dict):
        raise ValueError(f"its config is {type(meta.get('config')).__name__}, not an object")
    steps = meta.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"its steps is {steps!r}, not a count")
    overrides = meta.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ValueError(f"its overrides is {overrides!r}, not a list of strings")
    return meta


def _atomic(path: Path, write: Any) -> str:
    """Write ``path`` whole (records.atomic: temp, fsync, rename); returns the sha256 of the bytes written."""
    hashed: list[_Hashing] = []

    def hashing_write(f: Any) -> None:
        hashed.append(_Hashing(f))
        write(hashed[0])

    atomic_write(path, hashing_write)
    return hashed[0].sha256.hexdigest()


class _Hashing:
    """A binary file that hashes what goes through it (torch.save writes sequentially: no second read)."""

    def __init__(self, f: Any):
        self.f, self.sha256 = f, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint(run_dir: Path, payload: dict[str, Any], meta: dict[str, Any], keep: int) -> Path:
    """Write one checkpoint (payload -> .pt, meta and the .pt's sha256 -> .json) atomically and keep the newest
    ``keep``."""
    import torch

    d = checkpoint_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step_{int(payload['progress']['steps']):08d}.pt"
    meta = {**meta, "sha256": _atomic(path, lambda f: torch.save(payload, f))}
    _atomic(path.with_suffix(".json"), lambda f: f.write((json.dumps(meta, indent=1, default=str) + "\n").encode()))
    for old in list_checkpoints(run_dir)[:-keep]:
        old.with_suffix(".json").unlink(missing_ok=True)
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(run_dir: Path, map_location: Any = "cpu") -> dict[str, Any] | None:
    """The newest readable checkpoint's payload (an unreadable newest one is skipped with a warning), or None."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checksum(path)
            return load_checkpoint_file(path, map_location)
        except CheckpointFormatError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a file cut short on a full disk: fall back to the previous one
            log.warning("checkpoint %s unreadable (%s: %s); trying an older one", path, type(e).__name__, e)
    return None


class ChecksumMismatch(ValueError):
    """A checkpoint's .pt differs from the sha256 its .json recorded when it was written."""


def verify_checksum(path: Path) -> None:
    """Raise ChecksumMismatch unless ``path``'s bytes hash to the sha256 its .json recorded (checkpoints written
    before checksums were kept have none to check)."""
    expected = json.loads(path.with_suffix(".json").read_text()).get("sha256")
    if expected is not None and (found := file_sha256(path)) != expected:
        raise ChecksumMismatch(f"its bytes hash to {found[:16]}, written as {expected[:16]}")


def load_checkpoint_file(path: Path | str, map_location: Any = "cpu") -> dict[str, Any]:
    """One checkpoint's payload (ranks > 0 load the file rank 0 chose, so that every rank restores the same)."""
    import torch

    payload = torch.load(path, map_location=map_location, weights_only=True)
    if payload.get("format") != FORMAT:
        raise CheckpointFormatError(f"{path}: checkpoint format {payload.get('format')}, this code reads {FORMAT}")
    payload["path"] = str(path)
    return payload


# ---------------------------------------------------------------------------------------------------------
# what goes in, and back


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    np_state: Any = np.random.get_state()  # noqa: NPY002 - the global legacy RNG is what we save
    version, internal, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype("int64")), *np_state[2:]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        # a run resumed on fewer visible GPUs than it saved from restores the ones it has
        for i, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    # .cpu(): a checkpoint loaded with map_location=cuda (every rank of a multi-GPU resume) has its keys there
    np.random.set_state((name, keys.cpu().numpy().astype("uint32"), *rest))  # noqa: NPY002


def capture(
    model: Any, optimizers: list, scaler: Any, state: Any, ema: Any = None, ranks: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The payload of a checkpoint at a step boundary (state: train.TrainState; ema: the Stepper's WeightEMA or
    None; ranks: on several ranks, every rank's ``rank_state()`` in rank order, gathered to rank 0)."""
    if ranks is not None:
        check_positions(ranks)
    return {
        "format": FORMAT,
        "model": model.state_dict(),
        "optimizers": [o.state_dict() for o in optimizers],
        "scaler": scaler.state_dict() if scaler is not None else None,
        "ema": ema.state_dict() if ema is not None else None,
        "data": {"position": state.position},
        "rng": rng_state(),
        "progress": dataclasses.asdict(state),
        "ranks": None if ranks is None else by_rank(ranks),
    }


def rank_state(state: Any) -> dict[str, Any]:
    """What differs, or could, between the ranks of a run: each rank's RNG states and its data position."""
    return {"rng": rng_state(), "position": int(state.position)}


def by_rank(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The payload's ``ranks``: how many there were, and each one's RNG states and data position, in rank order."""
    return {"world_size": len(ranks), "rng": [r["rng"] for r in ranks], "positions": [r["position"] for r in ranks]}


def check_positions(ranks: list[dict[str, Any]]) -> None:
    """Every rank's stream stands at the same global position (data.loader.TokenStream: a step is one span of the
    stream that the ranks read slices of), which is what makes the checkpoint resumable on any number of ranks;
    a rank elsewhere is a bug, refused before it is written down."""
    positions = [r["position"] for r in ranks]
    if len(set(positions)) != 1:
        raise RuntimeError(f"the ranks' data positions differ at a step boundary: {positions}")


def rng_for_rank(payload: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """The RNG states rank ``rank`` of ``world_size`` restores: its own when the checkpoint has as many ranks,
    else those of rank ``rank % saved ranks`` (no rank's draws can be split or merged; training draws nothing
    from them today, so the step sequence does not depend on this)."""
    saved = payload.get("ranks")
    if not saved:
        return payload["rng"]
    if saved["world_size"] != world_size:
        log.info(
            "checkpoint of %d rank(s) resumed on %d: RNG states of rank %d",
            saved["world_size"],
            world_size,
            rank % saved["world_size"],
        )
    return saved["rng"][rank % saved["world_size"]]


def restore(
    payload: dict[str, Any],
    model: Any,
    optimizers: list,
    scaler: Any,
    state: Any,
    ema: Any = None,
    rank: int = 0,
    world_size: int = 1,
) -> None:
    """Load a payload into a freshly built model, its optimizers, scaler, EMA and a TrainState, in place (this
    process being rank ``rank`` of ``world_size``: any number of ranks that splits the step)."""
    model.load_state_dict(payload["model"])
    if ema is not None:
        if payload.get("ema") is None:  # resume refuses a plan whose ema differs first; this is the last guard
            raise ValueError("the run keeps a weight EMA (ema.decay) and this checkpoint has none")
        ema.load_state_dict(payload["ema"])
    if len(payload["optimizers"]) != len(optimizers):
        raise ValueError(f"checkpoint has {len(payload['optimizers'])} optimizers, the model {len(optimizers)}")
    for opt, saved in zip(optimizers, payload["optimizers"]):
        opt.load_state_dict(saved)
    if scaler is not None and payload["scaler"]:
        scaler.load_state_dict(payload["scaler"])
    progress = dict(payload["progress"])
    # compile_seconds and recompiles belong to the process that measures them
    progress.pop("compile_seconds", None)
    progress.pop("recompiles", None)
    for key, value in progress.items():
        if hasattr(state, key):
            setattr(state, key, value)
    state.position = int(payload["data"]["position"])
    state.budget_end = None
    set_rng_state(rng_for_rank(payload, rank, world_size))
