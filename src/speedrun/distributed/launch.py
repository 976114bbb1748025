"""Starting the ranks of a run, and what a started rank must do differently before Hydra runs.

- ``python -m run dist.nproc=N``: this process resolves the Plan first (so a bad request, more GPUs than visible
  or a step that does not split, is refused before any rank starts), then runs N copies of ``python -m run``
  with the same overrides through torch's elastic launch API (what torchrun runs: rendezvous on a local TCP
  store, RANK/LOCAL_RANK/WORLD_SIZE per process, every rank stopped when one fails or a signal comes), all
  pointed at this run's directory. Rank 0 records the run there; this process then reports rank 0's record,
  and closes it when rank 0 could not (killed: what rank 0 recorded during the run is kept), naming a rank killed
  by a signal as the launcher saw it (``adopt_rank0_record``).
- ``worker_argv``: a rank > 0 started by torchrun runs Hydra too, which would create a second, per-rank run dir
  (the timestamp in its name differs by microseconds); run.py points it at a private directory instead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speedrun.config.quoting import hydra_quote
from speedrun.distributed.environment import LAUNCHED_ENV, RANK_DIR_ENV, set_process_env
from speedrun.plan import Plan
from speedrun.records.atomic import atomic_write_text
from speedrun.records.store import write_json

log = logging.getLogger("speedrun")

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


@dataclasses.dataclass(frozen=True)
class RankExit:
    """How a rank ended that did not end well: its exit code, or minus the signal that killed it."""

    rank: int
    exitcode: int
    timestamp: int = 0
    """When the launcher saw it, in whole seconds (torch's ProcessFailure)."""

    @property
    def killed_by(self) -> signal.Signals | None:
        try:
            return signal.Signals(-self.exitcode) if self.exitcode < 0 else None
        except ValueError:
            return None

    def describe(self) -> str:
        """One line: which rank died and how, with what usually does that."""
        if self.exitcode >= 0:
            return f"rank {self.rank} died (exit code {self.exitcode}) without recording an error; see run.log"
        sig = self.killed_by
        line = f"rank {self.rank} died (killed by signal {-self.exitcode}{f', {sig.name}' if sig else ''})"
        if sig == signal.SIGKILL:
            line += ": a kill -9, or the kernel's out-of-memory killer if `dmesg` names the process"
        return line


def first_exit(exits: list[RankExit]) -> RankExit:
    """The rank whose end ended the run. The launcher sees a failed rank within its poll and then stops the others
    (SIGTERM, later SIGKILL), recording them too; timestamps are whole seconds, so within one second a rank killed by
    a signal comes first (the others lost their connection to it and raised), then one that exited with an error,
    then one the launcher's own SIGTERM ended; then the order the launcher saw them in."""

    def kind(e: RankExit) -> int:
        return 2 if e.killed_by == signal.SIGTERM else 0 if e.exitcode < 0 else 1

    return min(enumerate(exits), key=lambda ie: (ie[1].timestamp, kind(ie[1]), ie[0]))[1]


class RanksFailed(RuntimeError):
    """Some ranks exited with an error or were killed (``first``: the one whose end ended the run)."""

    def __init__(self, first: RankExit, exits: list[RankExit]):
        codes = ", ".join(f"rank {e.rank} {e.exitcode}" for e in sorted(exits, key=lambda e: e.rank))
        super().__init__(f"{first.describe()}; exit codes: {codes}")
        self.first, self.exits = first, exits


_FAILED: dict[str, RankExit] = {}
"""Run dir -> the rank whose end ended its launch: launch_ranks notes it, adopt_rank0_record reads it (the runner
records the exception as text, and rank 0's record may blame the rank that only lost its connection)."""


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _quote(value: str) -> str:
    """A path as one quoted Hydra override value (speedrun.config.quoting)."""
    return hydra_quote(value)


def worker_argv(argv: list[str], environ: dict | None = None) -> list[str]:
    """argv for Hydra in this process: unchanged except in a rank > 0 of a torchrun/elastic launch, which gets a
    private run dir (removed at exit, see speedrun.distributed.world.RunWorld.private_dir) and no .hydra/ copy, so the only run dir is
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


def needs_launch(plan: Plan) -> bool:
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


def launch_ranks(plan: Plan, run_dir: Path, log: Callable[[str], None]) -> None:
    """Run plan.dist.nproc ranks of this job on this machine and wait for them. Raises KeyboardInterrupt when a
    signal stopped them (they recorded themselves as interrupted) and RanksFailed when any exited with an error."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    n = plan.dist.nproc
    args = rank_args(run_dir)
    set_process_env(nvls=plan.dist.nvls)  # inherited by the ranks
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
        exits = [RankExit(rank, f.exitcode, f.timestamp) for rank, f in e.failures.items()]  # in the order seen
        first = _FAILED[_key_of(run_dir)] = first_exit(exits)
        raise RanksFailed(first, exits) from None


def _key_of(run_dir: Path) -> str:
    return str(Path(run_dir).resolve())


def adopt_rank0_record(db: Any, run_id: str, run_dir: Path, result: dict[str, Any]) -> bool:
    """After the ranks ended: rank 0's record into ``result`` (True), or False when rank 0 wrote none (killed before
    its first result.json), for the caller to close the run with ``result``.

    What rank 0 recorded during the run is kept whatever ended it. A record rank 0 left open (it died) is closed
    here with the launching process's status and error, the steps rank 0 logged and rank 0's plan. A rank killed by
    a signal (kill -9, the OOM killer) is named as the launcher saw it, over the error rank 0 met when that rank
    vanished (a lost connection, or the launcher's SIGTERM)."""
    died = _FAILED.pop(_key_of(run_dir), None)
    if died is not None:
        result.update(status="failed", error=died.describe())
    rank0 = _read_json(run_dir / "result.json")
    if rank0 is None:
        return False
    rows = db.rows("run_id = ?", (run_id,))
    row = rows[0] if rows else {}
    closed: dict[str, Any] = {}
    if rank0.get("status") in (None, "running"):
        if row.get("status") not in (None, "running"):  # rank 0's guard closed the row, then rank 0 ended
            rank0.update(status=row["status"], error=row.get("error"))
        else:  # rank 0 died: its record, closed with what the launching process knows
            rank0.update(_last_step(run_dir, rank0), status=result["status"], error=result["error"])
            closed = {"finished_at": time.time(), "plan": _read_json(run_dir / "plan.json")}
    elif died is None or died.exitcode >= 0 or rank0.get("status") not in ("failed", "interrupted"):
        result.clear()
        result.update(rank0)
        return True  # rank 0's record as it wrote it
    if died is not None and died.exitcode < 0 and not str(rank0.get("error")).startswith(f"rank {died.rank}:"):
        rank0.update(status="failed", error=died.describe())
    try:  # each whatever the other did, as the runner writes a record; the console block still shows it
        if died is not None and rank0["error"] == died.describe():
            error_txt = run_dir / "error.txt"
            before = error_txt.read_text() if error_txt.is_file() else ""
            atomic_write_text(error_txt, died.describe() + (f"\nthen rank 0:\n{before}" if before else "\n"))
        write_json(run_dir / "result.json", rank0)
    except OSError as e:
        log.error("could not write %s: %s", run_dir / "result.json", e)
    try:
        db.upsert(run_id, {**rank0, **closed})
    except Exception as e:  # noqa: BLE001 - result.json holds the record
        log.error("could not update the results database %s: %s", getattr(db, "path", None), e)
    result.clear()
    result.update(rank0)
    return True


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _last_step(run_dir: Path, rank0: dict[str, Any]) -> dict[str, Any]:
    """steps and tokens of the last training step rank 0 logged in metrics.jsonl, when its record has none (they
    are recorded when training ends)."""
    if rank0.get("steps") is not None:
        return {}
    try:
        with open(run_dir / "metrics.jsonl", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - (64 << 10)))  # the last lines are enough
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:  # the first, cut line, or a last one half-written when rank 0 died
            continue
        if isinstance(record, dict) and "kind" not in record and "step" in record:
            return {"steps": record["step"], "tokens": record.get("tokens")}
    return {}
