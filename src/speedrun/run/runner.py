"""One job, end to end: open its record, run the pipeline (speedrun.run.job), close the record whatever happened.

The record is opened before anything can fail (row status ``running``) and closed whatever happens: ok,
failed (with the error and a traceback file), oom (out of GPU memory), diverged, or interrupted (Ctrl-C, SIGTERM
from a scheduler). In between, each phase writes its results to result.json and the row as soon as it ends, and
``phase`` says which one was running, so a run stopped late keeps what it measured.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedrun.config import config_from_tree
from speedrun.distributed import world as dist
from speedrun.errors import ConfigError, RunOutOfMemory
from speedrun.paths import results_db_path
from speedrun.plan.model_choice import arch_schema
from speedrun.records.atomic import remove_orphan_temps
from speedrun.records.identity import AUTO_RESUME_IGNORED, GPU_SHARED_ENV, config_identity
from speedrun.records.lock import RunDirBusy, RunDirLock
from speedrun.records.rundir import new_run_refusal, symlink_problem
from speedrun.records.store import ENDED, ResultsDB, empty_result, owner_keys, recorded_status
from speedrun.run.checkpoint import checkpoint_dir
from speedrun.run.job import Job
from speedrun.run.job_record import JobRecord, RunContext, write_error_file
from speedrun.run.oom import find_oom, oom_result
from speedrun.run.signals import sigterm_as_interrupt, stop_signals_deferred

if TYPE_CHECKING:
    from speedrun.run.resume import Resume

log = logging.getLogger("speedrun")


@contextlib.contextmanager
def standalone_logging(run_dir: Path) -> Iterator[None]:
    """What conf/config.yaml's hydra.job_logging gives `python -m run`, for a job run without Hydra: INFO and up to
    stdout and to <run dir>/run.log, each line "[HH:MM:SS] message". Ranks above 0 write no run.log (under Hydra
    they write theirs to a private dir, speedrun.distributed.launch.worker_argv). The handlers go when it ends."""
    root = logging.getLogger()
    fmt = logging.Formatter("[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout)]
    if os.environ.get("RANK", "0") == "0":
        run_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(run_dir / "run.log"))
    level = root.level
    root.setLevel(logging.INFO)
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    try:
        yield
    finally:
        for h in handlers:
            root.removeHandler(h)
            h.close()
        root.setLevel(level)


def config_tree_of(cfg: Any) -> dict[str, Any]:
    """The config as plain values (interpolations resolved, Enums as their names): a composed DictConfig's
    container, or a tree that is already plain (an exported train_gpt.py's), copied as it is."""
    if isinstance(cfg, dict):
        return json.loads(json.dumps(cfg))  # a copy: the caller's tree stays as it was
    from omegaconf import OmegaConf  # a Hydra-composed config; a re-run hands a plain dict and never imports it

    tree = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(tree, dict)
    return {str(k): v for k, v in tree.items()}


def run_job(cfg: Any, ctx: RunContext | None = None) -> dict[str, Any]:
    """One job from ``cfg``: a composed DictConfig (``python -m run``) or its plain tree (a re-run); the job reads
    the tree alone, so training never needs OmegaConf."""
    ctx = ctx or RunContext.from_hydra()
    config_tree = config_tree_of(cfg)
    world = dist.current()  # this process's rank in a run of several (rank 0 of 1 for a plain run)
    if world.rank > 0:  # the ranks share rank 0's run dir and row; theirs go to a private dir, removed at exit
        ctx = RunContext(Path(world.private_dir()), ctx.overrides, ctx.sweep, ctx.original_cwd)
        world.quiet()
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    # the results database is the one this command names, from where it was started (never the run dir's own)
    db = _results_db(config_tree, ctx) if world.rank == 0 else dist.NoRecords()
    resume, refusal = _find_resume(config_tree, ctx, db)
    if resume is not None:  # the original job's config, dir and row (speedrun.run.resume)
        config_tree = config_tree_of(resume.config)  # plain values: resume refused any interpolation in them
        # a rank > 0 keeps its private dir: rank 0 alone writes the run's files and row (and picks the checkpoint)
        run_dir = resume.run_dir if world.rank == 0 else ctx.run_dir
        ctx = RunContext(run_dir, resume.overrides, ctx.sweep or config_tree.get("sweep"), ctx.original_cwd)
    # The record opens from the composed config's top-level knobs (types already checked by Hydra), before the
    # schemas' own checks run, so a bad value still leaves a failed row.
    run_id = str(ctx.run_dir.resolve())
    lock, held, attempts = None, False, "resume_attempts"
    if world.rank == 0 and refusal is None:
        lock, refusal = own_run_dir(ctx.run_dir, db, run_id, config_tree, resume)
        held, attempts = isinstance(refusal, ConfigError), "refused_attempts"  # another run's dir
        if held:  # a refused command writes nothing into the dir it was refused: no log line, no record file
            _detach_file_logs(ctx.run_dir)
    elif refusal is not None:  # a refused resume of the run in this dir (auto-resume, or a resume= the resolver
        held = (ctx.run_dir / "result.json").exists()  # let through): recorded beside that run, never over it
    result = _opening_result(config_tree, ctx, run_id, resume)
    if world.rank == 0:
        for note in environment_notes():  # a variable left in the shell must never change a run unseen
            log.warning("%s", note)
    started = time.time()
    fresh = {"started_at": started, "overrides": " ".join(ctx.overrides), "config": config_tree}
    # a resumed run keeps its row's start, overrides and config, and counts its resumptions
    start = {"resumed_at": started, "resumed_from_step": resume.steps} if resume else fresh
    record = JobRecord(ctx, result, config_tree, db, run_id, resume, world)
    record.start_keys, record.fresh_start_keys, record.lock = start, fresh, lock
    if held:  # refused another run's dir: a row of its own (named under the dir), leaving that run's files and row
        record.holding, record.attempts_dirname = True, attempts
        record.writes_files = attempts != "refused_attempts"
    if resume is None and not held:  # a resume writes nothing into the original record until its restore
        _open_record(db, run_id, {**result, **start})
        record.start_heartbeat()
    world.on_stop = functools.partial(record.close_early, db, run_id)
    job = Job(record)
    try:
        with sigterm_as_interrupt():
            if refusal is not None:
                raise refusal
            job.run(config_from_tree(config_tree, arch_schema((config_tree.get("model") or {}).get("arch"))))
    except KeyboardInterrupt as e:
        result["status"] = "interrupted"
        result["error"] = f"interrupted ({e})" if str(e) else "interrupted (Ctrl-C or SIGTERM)"
        world.settle(result, e, ctx.run_dir)  # a peer rank's failure outranks the signal it caused here
        e.speedrun_job = record  # type: ignore[attr-defined]  # speedrun.main prints where the record went
        raise
    except BaseException as e:  # noqa: BLE001 - every failure is recorded, then re-raised
        oom_error = _record_failure(record, e, ctx.run_dir)
        if oom_error is not None:
            raise oom_error from e
        raise
    finally:
        with stop_signals_deferred():
            record.finish(db, started)
        _note_where_recorded(sys.exc_info()[1])
    if not record.recorded:  # the run itself went well, its record did not: that is a failed run
        raise RecordNotWritten(f"the run ended but its record could not be written: {record.record_note()}")
    return result


def _opening_result(tree: dict[str, Any], ctx: RunContext, run_id: str, resume: Resume | None) -> dict[str, Any]:
    """The record as the run starts: status running, what the composed config names, whose process it is."""
    result = empty_result()
    result.update(
        status="running",
        seed=tree["seed"],
        sweep=tree.get("sweep") or ctx.sweep,
        run_dir=run_id,
        name=tree["name"],
        hardware=str(tree["hardware"]["name"]),
        attn=str(tree["attn"]["name"]),
        precision=str(tree["precision"]["name"]),
        phase="setup",
        # the pool launcher runs hydra.launcher.jobs_per_gpu > 1 jobs on one GPU at once: speed and
        # memory are then not the card's alone
        gpu_shared=os.environ.get(GPU_SHARED_ENV) == "1",
        **owner_keys(),  # host, pid, heartbeat: a row whose process vanished reads lost (records.store)
    )
    if resume is not None and resume.code_change:
        result["resume_code_change"] = resume.code_change  # accepted with accept_code_change=true
    return result


def environment_notes(environ: dict[str, str] | None = None) -> list[str]:
    """One line per SPEEDRUN_* variable set in this process's environment that changes the run or its record."""
    from speedrun.run.hooks import START_GATE_ENV

    env = os.environ if environ is None else environ
    notes = []
    if env.get(GPU_SHARED_ENV) == "1":
        notes.append(
            f"{GPU_SHARED_ENV}=1 in the environment: this run is recorded as sharing its GPU (gpu_shared); a launcher "
            "running several jobs per GPU sets it, unset it otherwise"
        )
    if env.get(START_GATE_ENV):
        notes.append(
            f"{START_GATE_ENV}={env[START_GATE_ENV]} in the environment: timed training waits until that file exists "
            "(speedrun.bench sets it), unset it otherwise"
        )
    return notes


def _record_failure(record: JobRecord, e: BaseException, run_dir: Path) -> RunOutOfMemory | None:
    """Record the failure ``e`` in the job's result and tell the other ranks to stop; for running out of GPU
    memory (an outcome with its own status and fix, not a bug), the RunOutOfMemory to raise in its place."""
    result, world = record.result, record.world
    if not record.delegated and record.writes_files:  # a launching process keeps rank 0's error.txt
        write_error_file(record.error_dir(), traceback.format_exc())
    oom = find_oom(e)
    if oom is not None:
        result.update(oom_result(record.plan, result.get("phase"), oom, run_dir))
        world.settle(dict(result), e, run_dir)  # tell the other ranks to stop; this row keeps status oom
        oom_error = RunOutOfMemory(result["error"])
        oom_error.speedrun_job = record  # type: ignore[attr-defined]  # read by speedrun.main, as above
        return oom_error
    result["status"] = "failed"
    result["error"] = f"{type(e).__name__}: {e}"
    world.settle(result, e, run_dir)  # names the rank that failed first, and tells the others to stop
    e.speedrun_job = record  # type: ignore[attr-defined]  # read by speedrun.main, as above
    return None


class RecordNotWritten(OSError):
    """The results row or result.json of a run could not be written (speedrun.main: one line, exit status 1)."""


def own_run_dir(
    run_dir: Path, db: ResultsDB | dist.NoRecords, run_id: str, config_tree: Any, resume: Resume | None
) -> tuple[RunDirLock | None, Exception | None]:
    """(the lock this job holds on its run dir, a refusal or None). Refused: a dir another live process owns,
    and, for a job that does not resume it, a dir holding another run: a finished one, or one of another config
    (the same job started again, e.g. requeued before its first checkpoint, starts afresh). Owned: the temporary
    files killed writers left there are removed."""
    links = symlink_problem(run_dir)
    if links is not None:  # checked before the lock: a symlinked .owner.lock is never opened
        return None, ConfigError(links)
    if resume is None:
        problem = new_run_refusal(run_dir)
        if problem is not None:
            return None, ConfigError(problem)
    lock = RunDirLock(run_dir)
    try:
        warning = lock.acquire(parent=os.getppid())  # rank 0 shares its launching process's lock
    except (RunDirBusy, OSError) as e:  # busy; or a read-only dir, where the run cannot keep its record
        return None, e
    if warning:
        log.warning("%s", warning)
    if resume is None:
        refusal = _other_run_in(run_dir, db, run_id, config_tree)
        if refusal is not None:
            lock.release()
            return None, refusal
    for directory in (run_dir, checkpoint_dir(run_dir)):
        for path in remove_orphan_temps(directory):
            log.info("removed %s, left by a killed writer", path)
    return lock, None


def _other_run_in(run_dir: Path, db: ResultsDB | dist.NoRecords, run_id: str, config_tree: Any) -> Exception | None:
    """A refusal when ``run_dir`` holds a run this fresh job would overwrite (own_run_dir), else None."""
    status = recorded_status(run_dir)
    if status is None:
        return None  # no record there yet
    fix = f"give this run another dir (hydra.run.dir=...) or continue that one (resume={run_dir})"
    rows = db.rows("run_id = ?", (run_id,))
    if rows and rows[0].get("status") in ENDED:  # its result.json could not take the final status; the row did
        return ConfigError(
            f"{run_dir} holds a finished run (status {rows[0]['status']}), which is never written "
            "again; give this run another dir (hydra.run.dir=...)"
        )
    stored = rows[0].get("config") if rows else None
    if config_identity(stored, AUTO_RESUME_IGNORED) != config_identity(config_tree, AUTO_RESUME_IGNORED):
        return ConfigError(f"{run_dir} holds another run (status {status}, another config); {fix}")
    return None


def _detach_file_logs(run_dir: Path) -> None:
    """Stop the log files Hydra opened inside ``run_dir`` (its run.log): a refused job logs to the console only."""
    root, inside = logging.getLogger(), Path(run_dir).resolve()
    for handler in list(root.handlers):
        if not isinstance(handler, logging.FileHandler):
            continue
        folder = Path(os.path.realpath(os.path.dirname(handler.baseFilename)))  # the link itself, not its target
        if folder == inside or inside in folder.parents:
            root.removeHandler(handler)
            handler.close()


def _note_where_recorded(e: BaseException | None) -> None:
    """Swap the JobRecord an exception carries (set above) for the line saying where its record went, now that the
    row is final: speedrun.main prints the line, and the exception must stay picklable, since submitit pickles a
    failed job's exception to hand it back to the launcher (a JobRecord holds locks)."""
    job = getattr(e, "speedrun_job", None)
    if e is not None and job is not None:
        e.speedrun_record = job.record_note()  # type: ignore[attr-defined]
        del e.speedrun_job  # type: ignore[attr-defined]


def _open_record(db: ResultsDB | dist.NoRecords, run_id: str, row: dict[str, Any]) -> None:
    """The row that says `running`. A database that cannot be written stops the run here, before any work, with
    its path and the fix (a run whose record cannot be kept is not worth starting)."""
    import sqlite3

    try:
        for lost in db.mark_lost():
            log.warning("results row %s: its process ended without a word; marked lost", lost)
        db.upsert(run_id, row)
    except (sqlite3.Error, OSError) as e:
        raise ConfigError(
            f"the results database {db.path} cannot be written ({type(e).__name__}: {e}); fix its permissions, "
            f"move a corrupt file aside, or set results_db=<another path>"
        ) from e


def _results_db(tree: dict[str, Any], ctx: RunContext) -> ResultsDB:
    path = results_db_path(tree["results_db"], ctx.original_cwd)
    try:
        return ResultsDB(path)
    except OSError as e:  # its directory cannot be made
        raise ConfigError(
            f"the results database {path} cannot be created ({e}); set results_db=<a writable path>"
        ) from e


def _find_resume(
    tree: dict[str, Any], ctx: RunContext, db: ResultsDB | dist.NoRecords
) -> tuple[Resume | None, Exception | None]:
    """(the Resume this job does, or None; a refusal to raise once the record is open, or None)."""
    if not tree.get("resume") and not checkpoint_dir(ctx.run_dir).is_dir():
        return None, None  # nothing to continue (a re-run's fresh dir): its file need not carry training.resume
    from speedrun.run.resume import find_resume, finished_refusal, training_unfinished

    try:
        resume = find_resume(tree, ctx.overrides, ctx.run_dir, ctx.original_cwd)
    except ConfigError as e:
        return None, e
    if resume is not None:  # the row may say finished where result.json could not (its last write failed)
        rows = db.rows("run_id = ?", (str(resume.run_dir),))
        if rows and rows[0].get("status") in ENDED and not training_unfinished(rows[0]):
            return None, finished_refusal(str(tree.get("resume") or resume.run_dir), resume.run_dir, rows[0]["status"])
    return resume, None
