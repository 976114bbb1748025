"""Starting the ranks of a run, and what a started rank must do differently before Hydra runs.

- ``python -m run dist.nproc=N``: this process resolves the Plan first (so a bad request, more GPUs than visible
  or a step that does not split, is refused before any rank starts), then runs N copies of ``python -m run``
  with the same overrides through torch's elastic launch API (what torchrun runs: rendezvous on a local TCP
  store, RANK/LOCAL_RANK/WORLD_SIZE per process, every rank stopped when one fails or a signal comes), all
  pointed at this run's directory. Rank 0 records the run there; this process then reports rank 0's record,
  and closes the row itself only when rank 0 could not (killed before it wrote).
- ``worker_argv``: a rank > 0 started by torchrun runs Hydra too, which would create a second, per-rank run dir
  (the timestamp in its name differs by microseconds); run.py points it at a private directory instead.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speedrun.distributed.world import LAUNCHED_ENV, RANK_DIR_ENV, set_process_env

_DROPPED = (
    "hydra.run.",
    "hydra.output_subdir",
    "hydra.mode",
    "hydra/launcher",
    "hydra.launcher",
    "hydra/sweeper",
    "hydra.sweeper",
)
"""The launching process's Hydra overrides that its ranks must not get (the run dir is set anew, sweeps stay
with the sweep)."""


class RanksFailed(RuntimeError):
    """Some ranks exited with an error (rank 0's record says which and why)."""


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _quote(value: str) -> str:
    """A path as one quoted Hydra override value (the grammar reserves characters a path may hold)."""
    if "'" in value or "\\" in value or "${" in value:
        raise ValueError(f"cannot pass {value!r} to the ranks: quotes, backslashes and '${{' are not supported")
    return f"'{value}'"


def worker_argv(argv: list[str], environ: dict | None = None) -> list[str]:
    """argv for Hydra in this process: unchanged except in a rank > 0 of a torchrun/elastic launch, which gets a
    private run dir (removed at exit, see dist.World.private_dir) and no .hydra/ copy, so the only run dir is
    rank 0's. A sweep inside a rank is refused: every rank would run the whole sweep."""
    env = os.environ if environ is None else environ
    if int(env.get("WORLD_SIZE") or 1) <= 1 or "RANK" not in env:
        return argv
    if any(a in ("-m", "--multirun") for a in argv[1:]):
        raise SystemExit(
            "error: a sweep (-m) cannot run inside torchrun; sweep with `python -m run -m dist.nproc=N "
            "...` (the pool gives each job N GPUs) or hydra/launcher=slurm"
        )
    if int(env["RANK"]) == 0:
        return argv
    private = tempfile.mkdtemp(prefix=f"speedrun-rank{env['RANK']}-")
    env[RANK_DIR_ENV] = private
    kept = [a for a in argv[1:] if _key(a) not in ("hydra.run.dir", "hydra.output_subdir")]
    return [argv[0], *kept, f"hydra.run.dir={_quote(private)}", "hydra.output_subdir=null"]


def needs_launch(plan: Any) -> bool:
    """This process was asked for several ranks and none exists yet: it starts them (and trains nothing)."""
    return plan.dist.launch == "self"


def _entry() -> list[str]:
    """How this process was started, to start the ranks the same way (`-m run`, or the script's path)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return ["-m", spec.name] if spec is not None and spec.name else [sys.argv[0]]


def rank_args(run_dir: Path) -> list[str]:
    """The ranks' command line after the interpreter: this job's task overrides and job-level Hydra overrides,
    this run's directory (no second .hydra/ copy: this process wrote it)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    hydra = [o for o in hc.overrides.hydra if not _key(o).startswith(_DROPPED)]
    if hc.mode == RunMode.MULTIRUN:  # a job of Hydra's in-process launcher: the ranks record its sweep id
        hydra += [f"hydra.sweep.dir={_quote(str(hc.sweep.dir))}", f"hydra.job.num={hc.job.num}"]
    return [*_entry(), *hc.overrides.task, *hydra, f"hydra.run.dir={_quote(str(run_dir))}", "hydra.output_subdir=null"]


def launch_ranks(plan: Any, run_dir: Path, log: Callable[[str], None]) -> None:
    """Run plan.dist.nproc ranks of this job on this machine and wait for them. Raises KeyboardInterrupt when a
    signal stopped them (they recorded themselves as interrupted) and RanksFailed when any exited with an error."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    n = plan.dist.nproc
    args = rank_args(run_dir)
    set_process_env()  # inherited by the ranks
    os.environ[LAUNCHED_ENV] = "1"
    # as torchrun does, but a share of the cores rather than 1: CPU ranks (gloo) still get their threads
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=n,
        run_id=f"speedrun-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    log(
        f"starting {n} ranks on this machine (torch elastic launch, {plan.dist.backend}): "
        f"{sys.executable} {' '.join(args)}"
    )
    try:
        elastic_launch(config, sys.executable)(*args)
    except SignalException as e:
        raise KeyboardInterrupt(f"signal {e.sigval}") from None
    except ChildFailedError as e:
        codes = ", ".join(f"rank {r}: exit code {f.exitcode}" for r, f in sorted(e.failures.items()))
        raise RanksFailed(f"ranks failed ({codes}); see the run's error and run.log") from None


def adopt_rank0_record(db: Any, run_id: str, run_dir: Path, result: dict[str, Any]) -> bool:
    """After the ranks ended: rank 0's record into ``result`` (True), or False when rank 0 left the run open
    (killed before it could write), for the caller to close it. A row rank 0's guard closed without result.json
    gets its result.json here."""
    try:
        rank0 = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        rank0 = None
    if isinstance(rank0, dict) and rank0.get("status") not in (None, "running"):
        result.clear()
        result.update(rank0)
        return True
    rows = db.rows("run_id = ?", (run_id,))
    if rows and rows[0].get("status") not in (None, "running"):
        from speedrun.records.store import write_json

        result.update(status=rows[0]["status"], error=rows[0].get("error"))
        write_json(run_dir / "result.json", result)
        return True
    return False
