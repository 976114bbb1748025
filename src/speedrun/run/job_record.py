"""The record of one job: its run-dir files, its results row and its logger, kept whatever happens.

The row is opened (status ``running``) before anything can fail and completed at the end; each phase writes its
keys to result.json and the row as it ends (``on_phase``), so a run stopped later keeps what it measured. A resume
writes nothing into the original run until its checkpoint is restored (``holding``): a resume that fails before
then leaves the finished or interrupted run exactly as it was and is recorded apart, under ``resume_attempts/``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedrun.distributed import world as dist
from speedrun.records.atomic import atomic_write_text
from speedrun.records.lock import RunDirLock
from speedrun.records.store import MetricsLog, ResultsDB, write_json
from speedrun.run.checkpoint import list_checkpoints
from speedrun.run.heartbeat import Heartbeat
from speedrun.run.loggers import RunLogger
from speedrun.tables import format_result_block

if TYPE_CHECKING:
    from speedrun.core.train import TrainState
    from speedrun.plan.types import Plan

log = logging.getLogger("speedrun")


class RunContext:
    """Where this job writes, and what Hydra knows about it (overrides, sweep)."""

    def __init__(self, run_dir: Path, overrides: list[str], sweep: str | None, original_cwd: Path):
        self.run_dir, self.overrides, self.sweep, self.original_cwd = run_dir, overrides, sweep, original_cwd

    @classmethod
    def from_hydra(cls) -> RunContext:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf

        hc = HydraConfig.get()
        sweep = None
        # A sweep job: MULTIRUN mode under Hydra's own launchers; the pool launcher runs each job as a RUN-mode
        # `python -m run` with hydra.sweep.dir and hydra.job.num set (not task overrides, so they stay clean).
        if hc.mode == RunMode.MULTIRUN or not OmegaConf.is_missing(hc.job, "num"):
            sweep = Path(hc.sweep.dir).name
        return cls(Path(hc.runtime.output_dir), list(hc.overrides.task), sweep, Path(hc.runtime.cwd))

    @classmethod
    def standalone(cls, run_dir: Path) -> RunContext:
        """A job run with no Hydra (speedrun.main(cfg, run_dir)): in ``run_dir``, with no command-line
        overrides and no sweep, relative paths taken from the current directory."""
        return cls(Path(run_dir), [], None, Path.cwd())


class JobRecord:
    """Where a job writes and what it has written; the pipeline (speedrun.run.job.Job) holds one and writes into it."""

    def __init__(
        self,
        ctx: RunContext,
        result: dict[str, Any],
        config_tree: Any,
        db: ResultsDB | dist.NoRecords | None = None,
        run_id: str | None = None,
        resume: Any = None,
        world: dist.RunWorld = dist.SINGLE_RUN,
    ):
        self.ctx, self.result, self.config_tree, self.resume, self.world = ctx, result, config_tree, resume, world
        self.db, self.run_id = db, run_id
        self.record_id: str | None = None
        """The row this job's record went to, once written (a resume refused before its restore: its own)."""
        self.delegated = False
        """True in a `python -m run dist.nproc=N` process that started the ranks: rank 0 records the run."""
        self.start_keys: dict[str, Any] = {}
        """Keys the row gets once, when the record opens (start time, overrides, config; or the resumption)."""
        self.fresh_start_keys: dict[str, Any] = {}
        """The keys a new row starts with (start time, overrides, config), for a resumed run with no row yet."""
        self.holding = resume is not None
        """A resume holds the original run's files and row until its checkpoint is restored (module docstring)."""
        self.prior_wall_seconds = _prior_wall_seconds(resume)
        """A resumed run's wall seconds before this process (its earlier parts, as their result.json says), so that
        wall_seconds covers the whole run, as train_seconds does (the report's overhead_s is their difference)."""
        self.metrics: MetricsLog | None = None
        self.logger: RunLogger | None = None
        self.plan: Plan | None = None
        self.state: TrainState | None = None
        self.training_keys: Callable[[], dict[str, Any]] | None = None
        """What training measured, as result keys: the pipeline's (speedrun.run.job.Job.training_keys)."""
        self.attempts_dirname = "resume_attempts"
        """Where a job that holds (a resume refused before its restore, or a job refused a dir another run owns)
        keeps its own record, inside the dir it was refused."""
        self.writes_files = True
        """False for a job refused a dir (another run's, a folder of other files): its record is its row alone,
        and nothing is written into that dir."""
        self.heartbeat: Heartbeat | None = None
        self.lock: RunDirLock | None = None
        """This job's ownership of its run dir (speedrun.records.lock), released when the record is final."""
        self._held_files: dict[str, str] = {}
        self._attempt_dir: Path | None = None
        self._closing = threading.Lock()
        self._db_warned = False
        self._result_file_failed = False
        self._finished = False

    def write_file(self, name: str, text: str) -> None:
        """A run-dir file, written atomically, or kept in memory while a resume holds the original run's files."""
        if self.holding:
            self._held_files[name] = text
        else:
            atomic_write_text(self.ctx.run_dir / name, text)

    def release(self, steps: int) -> None:
        """The checkpoint is restored: from here on the resumed job is the original run, continued."""
        self.holding = False
        self.metrics = MetricsLog(self.ctx.run_dir / "metrics.jsonl", after_step=steps)
        for name, text in self._held_files.items():
            self.write_file(name, text)
        # the step actually loaded: a corrupt newest checkpoint falls back to an older one
        self.start_keys["resumed_from_step"] = steps
        if self.db is not None and self.run_id is not None:
            if not self.db.rows("run_id = ?", (self.run_id,)):  # a run dir copied here: its row starts now
                self.start_keys.update(self.fresh_start_keys)
            self.db.upsert(self.run_id, {**self.result, **self.start_keys})
            self.start_heartbeat()

    def start_heartbeat(self) -> None:
        """Rank 0, once it writes the run's row: refresh the row's heartbeat and the lock file's until finish."""
        db, run_id, lock = self.db, self.run_id, self.lock
        if self.world.rank > 0 or db is None or run_id is None or self.heartbeat is not None:
            return

        def beat(now: float) -> None:
            if lock is not None:
                lock.touch()
            db.upsert(run_id, {"heartbeat_at": now})

        self.heartbeat = Heartbeat(beat).start()

    def error_dir(self) -> Path:
        """Where this job's error.txt and, for a resume refused before its restore, its record go."""
        if not self.holding:
            return self.ctx.run_dir
        if self._attempt_dir is None:
            self._attempt_dir = self.ctx.run_dir / self.attempts_dirname / time.strftime("%Y-%m-%d_%H-%M-%S")
        return self._attempt_dir

    def on_phase(self, phase: str, keys: dict[str, Any] | None = None) -> None:
        """A phase starts (no keys) or ends (its keys): record both at once in result.json and the row, so a run
        stopped later keeps them and says where it was. Only rank 0 holds the row."""
        self.result["phase"] = phase
        self.result.update(keys or {})
        if self.world.rank > 0 or self.holding:
            return
        write_json(self.ctx.run_dir / "result.json", self.result)
        if self.db is not None and self.run_id is not None:
            try:
                self.db.upsert(self.run_id, self.result)
            except Exception as e:  # noqa: BLE001 - result.json has it; the final write tries the row again
                if not self._db_warned:  # once: the final write says it again if it still fails
                    log.warning("could not update the results database %s: %s", getattr(self.db, "path", None), e)
                    self._db_warned = True

    def on_metrics(self, record: dict[str, Any]) -> None:
        if self.metrics is None:  # a resume's batch search, before its restore: not part of the run's curve
            return
        self.metrics.write(record)
        self.guard("log_metrics", record)

    def guard(self, method: str, *args: Any) -> None:
        """Call the run logger; a logger problem is a warning, never a failed run."""
        if self.logger is None:
            return
        try:
            getattr(self.logger, method)(*args)
        except Exception as e:  # noqa: BLE001
            log.warning("logger %s.%s failed: %s: %s", type(self.logger).__name__, method, type(e).__name__, e)

    def record_training(self) -> None:
        """The training keys of the result (``training_keys``, the pipeline's; a record without training has none)."""
        if self.training_keys is not None:
            self.result.update(self.training_keys())

    # -- always -------------------------------------------------------------------------------------------
    def close_early(self, db: ResultsDB | dist.NoRecords, run_id: str, status: str, error: str, tb: str) -> None:
        """Rank 0, from the dist guard's thread: a peer failed or a stop signal came while this rank may be stuck
        in a collective; close the row now, in case this process is killed before ``finish``."""
        with self._closing:
            if self._finished or self.holding:
                return
            db.upsert(run_id, {"status": status, "error": error, "finished_at": time.time()})
            if tb:
                write_error_file(self.ctx.run_dir, tb)

    def finish(self, db: ResultsDB | dist.NoRecords, started: float) -> None:
        """Write result.json and complete the database row, whatever happened."""
        with self._closing:
            self._finished = True
        if self.heartbeat is not None:
            self.heartbeat.stop()
        try:
            self._finish(db, started)
        finally:
            if self.lock is not None:
                self.lock.release()

    def _finish(self, db: ResultsDB | dist.NoRecords, started: float) -> None:
        if self.metrics:
            try:
                self.metrics.close()
            except OSError as e:  # its last line could not be flushed (a full disk): the row still gets written
                log.warning("could not close %s: %s", self.metrics.path, e)

        assert self.run_id is not None
        if self.delegated and _adopt_rank0_record(db, self.run_id, self.ctx.run_dir, self.result):
            self.record_id = self.run_id  # rank 0's row: what the launching process's last line points to
            log.info("result:\n%s", format_result_block(self.result))  # rank 0 recorded the run
            return
        if self.state is not None and self.result.get("steps") is None:
            try:  # interrupted or failed mid-training: keep what was measured
                self.record_training()
            except Exception as e:  # noqa: BLE001 - e.g. a broken CUDA context; the record must still be written
                log.warning("could not collect training metrics: %s: %s", type(e).__name__, e)
                self.result.update(steps=self.state.steps, tokens=self.state.tokens)
        finished = time.time()
        out_dir, run_id = self.ctx.run_dir, self.run_id
        # every part of a resumed run; a resume that never restored is a record of its own, with its own wall time
        prior = 0.0 if self.holding else self.prior_wall_seconds
        self.result["wall_seconds"] = round(prior + finished - started, 3)
        if self.plan is not None and self.plan.track.on and not self.holding:
            from speedrun.run.track_verdict import track_keys  # track= set, a Plan's choice

            try:
                self.result.update(track_keys(self.plan, self.result))
            except Exception as e:  # noqa: BLE001 - the record must still be written; the verdict says why not
                self.result.update(track_ok=False, track_problems=[f"the rules could not be checked: {e!r}"])
            if not self.result["track_ok"]:
                log.warning(
                    "track %s: not met: %s", self.plan.track.name, "; ".join(self.result["track_problems"] or [])
                )
        if self.holding:  # a resume that ended before its restore: its own record, the original untouched
            out_dir = self.error_dir()
            if self.writes_files:
                out_dir.mkdir(parents=True, exist_ok=True)
            run_id = str(out_dir.resolve())
            self.result.update(run_dir=run_id, resume_of=self.run_id)
            self.start_keys = {"started_at": started, "overrides": " ".join(self.ctx.overrides)}
        self.record_id = run_id
        # result.json, then the row, each whatever the other did: a run dir that cannot hold its record (a full or
        # read-only disk) fails the run, and the row says so
        try:
            if self.writes_files:
                out_dir.mkdir(parents=True, exist_ok=True)
                write_json(out_dir / "result.json", self.result)
        except OSError as e:
            log.error("could not write %s: %s", out_dir / "result.json", e)
            self._result_file_failed = True
            if self.result["status"] in ("ok", "running"):
                self.result.update(status="failed", error=f"result.json could not be written: {e}")
        row = {**self.result, "finished_at": finished, "plan": self.plan.to_dict() if self.plan else None}
        try:
            db.upsert(run_id, {**self.start_keys, **row} if self.holding else row)
        except Exception as e:  # noqa: BLE001 - the run ends saying so (speedrun.run.runner)
            log.error("could not update the results database %s: %s", getattr(db, "path", None), e)
            self.record_id = None
        if self._result_file_failed and self.writes_files:
            # once more, now with the row's final status: the failed write removed its temp file (a full disk may
            # have room for this small one), and a result.json left saying running would contradict the row
            try:
                write_json(out_dir / "result.json", self.result)
            except OSError:
                pass  # the row says failed and why
        self.guard("log_result", self.result)
        self.guard("finish", self.result["status"])
        # a run that never trained (refused, or stopped before its model was built) has no block to show: the
        # error and its row are one line (speedrun.main)
        trained = self.state is not None and not self.holding
        if self.world.info.launcher != "elastic" and trained:  # else the launching process prints it, last
            log.info("result:\n%s", format_result_block(self.result))
        self.world.shutdown(clean=self.result["status"] in ("ok", "diverged"))

    @property
    def recorded(self) -> bool:
        """Whether the run's row and result.json both hold its final record."""
        return self.record_id is not None and not self._result_file_failed

    def record_note(self) -> str:
        """Where the record of this run is, for the one line that ends a refused or stopped run."""
        if self.record_id is None:
            return f"no row: the results database could not be written; see {self.error_dir() / 'result.json'}"
        note = f"row {self.record_id} ({self.result['status']})"

        if self.result["status"] == "interrupted" and not self.holding and list_checkpoints(self.ctx.run_dir):
            note += f"; continue it with `python -m run resume={self.ctx.run_dir}`"
        return note


def write_error_file(directory: Path, text: str) -> None:
    """error.txt, the traceback of a failed run; a dir that cannot take it (a full disk) costs the file only."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / "error.txt", text)
    except OSError as e:
        log.warning("could not write %s: %s", directory / "error.txt", e)


def _prior_wall_seconds(resume: Any) -> float:
    """wall_seconds of the run being resumed, from its result.json (0 when it has none: killed before writing)."""
    if resume is None:
        return 0.0
    try:
        value = json.loads((Path(resume.run_dir) / "result.json").read_text()).get("wall_seconds")
    except (OSError, ValueError, AttributeError):
        return 0.0
    return float(value) if isinstance(value, (int, float)) else 0.0


def _adopt_rank0_record(db: Any, run_id: str, run_dir: Any, result: dict[str, Any]) -> bool:
    # only a process that launched the ranks delegates, and it imported the launcher to do so
    from speedrun.distributed.launch import adopt_rank0_record

    return adopt_rank0_record(db, run_id, run_dir, result)
