"""One job, end to end: compose -> resolve -> build -> train -> evaluate -> finalize -> record.

The record is opened before anything can fail (row status ``running``) and closed whatever happens: ok,
failed (with the error and a traceback file), oom (out of GPU memory), diverged, or interrupted (Ctrl-C, SIGTERM
from a scheduler). In between, each phase writes its results to result.json and the row as soon as it ends, and
``phase`` says which one was running, so a run stopped late keeps what it measured.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from speedrun.config import Config, to_config
from speedrun.distributed import world as dist
from speedrun.errors import RunOutOfMemory
from speedrun.paths import results_db_path
from speedrun.records.identity import GPU_SHARED_ENV
from speedrun.records.result_block import format_result_block
from speedrun.records.store import MetricsLog, ResultsDB, atomic_write_text, empty_result, write_json
from speedrun.run.loggers import RunLogger, make_logger
from speedrun.run.signals import sigterm_as_interrupt, stop_signals_deferred

log = logging.getLogger("speedrun")


class RunContext:
    """Where this job writes, and what Hydra knows about it (overrides, sweep)."""

    def __init__(self, run_dir: Path, overrides: list[str], sweep: str | None, original_cwd: Path):
        self.run_dir, self.overrides, self.sweep, self.original_cwd = run_dir, overrides, sweep, original_cwd

    @classmethod
    def from_hydra(cls) -> RunContext:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        sweep = None
        # A sweep job: MULTIRUN mode under Hydra's own launchers; the pool launcher runs each job as a RUN-mode
        # `python -m run` with hydra.sweep.dir and hydra.job.num set (not task overrides, so they stay clean).
        if hc.mode == RunMode.MULTIRUN or not OmegaConf.is_missing(hc.job, "num"):
            sweep = Path(hc.sweep.dir).name
        return cls(Path(hc.runtime.output_dir), list(hc.overrides.task), sweep, Path(hc.runtime.cwd))


def run_job(dict_cfg: DictConfig, ctx: RunContext | None = None) -> dict[str, Any]:
    ctx = ctx or RunContext.from_hydra()
    world = dist.current()  # this process's rank in a run of several (rank 0 of 1 for a plain run)
    if world.rank > 0:  # the ranks share rank 0's run dir and row; theirs go to a private dir, removed at exit
        ctx = RunContext(Path(world.private_dir()), ctx.overrides, ctx.sweep, ctx.original_cwd)
        world.quiet()
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    resume, refusal = _find_resume(dict_cfg, ctx)
    if resume is not None and world.world_size > 1:
        from speedrun.errors import ConfigError

        resume, refusal = (
            None,
            ConfigError(
                "resume=<run dir> continues a one-process run; runs of several ranks "
                "cannot resume yet (they write no checkpoints)"
            ),
        )
    if resume is not None:  # the original job's config, dir and row (speedrun.training.resume)
        dict_cfg = OmegaConf.create(resume.config)
        ctx = RunContext(resume.run_dir, resume.overrides, ctx.sweep or dict_cfg.sweep, resume.cwd)
    # The record opens from the composed config's top-level knobs (types already checked by Hydra), before the
    # schemas' own checks run, so a bad value still leaves a failed row.
    config_tree = OmegaConf.to_container(dict_cfg, resolve=True, enum_to_str=True)
    db = _results_db(dict_cfg, ctx) if world.rank == 0 else dist.NoRecords()
    run_id = str(ctx.run_dir.resolve())
    result = empty_result()
    result.update(
        status="running",
        seed=dict_cfg.seed,
        sweep=dict_cfg.sweep or ctx.sweep,
        run_dir=run_id,
        name=dict_cfg.name,
        hardware=str(dict_cfg.hardware.name),
        attn=str(dict_cfg.attn.name),
        precision=str(dict_cfg.precision.name),
        phase="setup",
        # the pool launcher runs hydra.launcher.jobs_per_gpu > 1 jobs on one GPU at once: speed and
        # memory are then not the card's alone
        gpu_shared=os.environ.get(GPU_SHARED_ENV) == "1",
    )
    started = time.time()
    start = {"started_at": started, "overrides": " ".join(ctx.overrides), "config": config_tree}
    # a resumed run keeps its row's start, overrides and config, and counts its resumptions
    start = {"resumed_at": started, "resumed_from_step": resume.steps} if resume else start
    job = Job(ctx, result, config_tree, db, run_id, resume, world)
    job.start_keys = start
    if resume is None:  # a resume writes nothing into the original record until its checkpoint is restored
        _open_record(db, run_id, {**result, **start})
    world.on_stop = functools.partial(job.close_early, db, run_id)
    try:
        with sigterm_as_interrupt():
            if refusal is not None:
                raise refusal
            job.run(to_config(dict_cfg))
    except KeyboardInterrupt as e:
        result["status"] = "interrupted"
        result["error"] = f"interrupted ({e})" if str(e) else "interrupted (Ctrl-C or SIGTERM)"
        world.settle(result, e, ctx.run_dir)  # a peer rank's failure outranks the signal it caused here
        e.speedrun_job = job  # type: ignore[attr-defined]  # speedrun.main prints where the record went
        raise
    except BaseException as e:  # noqa: BLE001 - every failure is recorded, then re-raised
        if not job.delegated:  # a launching process keeps rank 0's error.txt
            job.error_dir().mkdir(parents=True, exist_ok=True)
            (job.error_dir() / "error.txt").write_text(traceback.format_exc())
        from speedrun.run.oom import find_oom, oom_result

        oom = find_oom(e)
        if oom is not None:  # an outcome with its own status and fix, not a bug
            result.update(oom_result(job.plan, result.get("phase"), oom, ctx.run_dir))
            world.settle(dict(result), e, ctx.run_dir)  # tell the other ranks to stop; this row keeps status oom
            oom_error = RunOutOfMemory(result["error"])
            oom_error.speedrun_job = job  # type: ignore[attr-defined]
            raise oom_error from e
        result["status"] = "failed"
        result["error"] = f"{type(e).__name__}: {e}"
        world.settle(result, e, ctx.run_dir)  # names the rank that failed first, and tells the others to stop
        e.speedrun_job = job  # type: ignore[attr-defined]
        raise
    finally:
        with stop_signals_deferred():
            job.finish(db, started)
    return result


def _open_record(db: ResultsDB, run_id: str, row: dict[str, Any]) -> None:
    """The row that says `running`. A database that cannot be written stops the run here, before any work, with
    its path and the fix (a run whose record cannot be kept is not worth starting)."""
    import sqlite3

    try:
        db.upsert(run_id, row)
    except (sqlite3.Error, OSError) as e:
        from speedrun.errors import ConfigError

        raise ConfigError(
            f"the results database {db.path} cannot be written ({type(e).__name__}: {e}); fix its permissions, "
            f"move a corrupt file aside, or set results_db=<another path>"
        ) from e


def _results_db(dict_cfg: DictConfig, ctx: RunContext) -> ResultsDB:
    path = results_db_path(dict_cfg.results_db, ctx.original_cwd)
    try:
        return ResultsDB(path)
    except OSError as e:  # its directory cannot be made
        from speedrun.errors import ConfigError

        raise ConfigError(
            f"the results database {path} cannot be created ({e}); set results_db=<a writable path>"
        ) from e


def _find_resume(dict_cfg: DictConfig, ctx: RunContext) -> tuple[Any, Exception | None]:
    """(the Resume this job does, or None; a refusal to raise once the record is open, or None)."""
    from speedrun.errors import ConfigError
    from speedrun.training.resume import find_resume

    tree = OmegaConf.to_container(dict_cfg, resolve=True, enum_to_str=True)
    try:
        return find_resume(tree, ctx.overrides, ctx.run_dir, ctx.original_cwd), None  # type: ignore[arg-type]
    except ConfigError as e:
        return None, e


class Job:
    def __init__(
        self,
        ctx: RunContext,
        result: dict[str, Any],
        config_tree: Any,
        db: ResultsDB | None = None,
        run_id: str | None = None,
        resume: Any = None,
        world: dist.World = dist.SINGLE,
    ):
        self.ctx, self.result, self.config_tree, self.resume, self.world = ctx, result, config_tree, resume, world
        self.db, self.run_id = db, run_id
        self.record_id: str | None = None
        """The row this job's record went to, once written (a resume refused before its restore: its own)."""
        self.peak_memory = None
        self.delegated = False
        """True in a `python -m run dist.nproc=N` process that started the ranks: rank 0 records the run."""
        self._closing = threading.Lock()
        self._finished = False
        self.start_keys: dict[str, Any] = {}
        """Keys the row gets once, when the record opens (start time, overrides, config; or the resumption)."""
        self.holding = resume is not None
        """A resume writes nothing into the original run's files or row until its checkpoint is restored: a resume
        that fails or is stopped before then leaves the finished or interrupted run exactly as it was, and is
        recorded apart (``resume_attempts/``)."""
        self._held_files: dict[str, str] = {}
        self._attempt_dir: Path | None = None
        self.metrics: MetricsLog | None = None
        self.logger: RunLogger | None = None
        self.state = None
        self.plan = None
        self.model = None

    # -- the pipeline ---------------------------------------------------------------------------------
    def run(self, config: Config) -> None:
        """The whole pipeline. ``config`` is read by the resolver alone; everything after it reads the Plan."""
        from speedrun.hardware import profiles as hardware
        from speedrun.plan import plan_json, resolve
        from speedrun.records.store import capture_environment
        from speedrun.run.oom import start_history

        result = self.result
        plan = self.plan = resolve(config, hardware.detect(), cwd=self.ctx.original_cwd, world=self.world.info)
        del config
        log.info("plan:\n%s", _indent(plan.describe()))
        start_history(plan)  # hardware.memory_snapshot=true: allocations from the model build on
        self.write_file("plan.json", plan_json(plan) + "\n")
        from speedrun.distributed.launch import launch_ranks, needs_launch

        if needs_launch(plan):  # dist.nproc > 1 under `python -m run`: start the ranks; rank 0 records the run
            self.delegated = True
            launch_ranks(plan, self.ctx.run_dir, log.info)
            return
        self.world.init(plan)
        env = capture_environment(plan.device)
        self.write_file("env.json", json.dumps(env, indent=2, default=str) + "\n")
        result.update(
            hardware=plan.hardware,
            device_name=plan.device_name,
            emulated=plan.emulated,
            attn=plan.attn,
            attn_kernel=plan.attn_kernel,
            precision=plan.precision,
            git_sha=env["git_sha"],
            git_dirty=env["git_dirty"],
            code_fingerprint=env["code_fingerprint"],
            torch_version=env["torch_version"],
            model=plan.model_name,
            tokens_per_step=plan.tokens_per_step,
            seq_len=plan.model.seq_len,
            card=plan.card,
            memory_estimate_gb=plan.memory_estimate_gb,
        )
        result.update(self.world.describe(plan.device_name))  # world_size, nodes, each rank's GPU
        result.update(plan.kernel.result_keys())  # kernel_* settings that ran, so sweeps over kernel= group
        from speedrun.training.build import configure_torch

        configure_torch(plan)
        if self.world.rank == 0:  # one W&B run per run, not per rank
            self.logger = make_logger(plan.logger, self.ctx.run_dir, result["sweep"], plan.name)
        self._guard("start", self.config_tree, plan.to_dict())

        from speedrun.training.build import build_attention, build_data, build_model

        attention = build_attention(plan)
        data = build_data(plan, log.info)
        model, forward, eval_forward, optimizers = build_model(plan, attention, data.bos_id)
        self.world.prepare(model, optimizers)  # rank 0's initial weights everywhere; Muon's work split over ranks
        self.model = model
        result["params"] = model.num_params()
        log.info("model: %s parameters", f"{result['params']:,}")

        from speedrun.training.loop import Stepper, TrainState, train, warm_up
        from speedrun.training.peak_memory import PeakMemory

        self.state = state = TrainState()
        if self.resume is None:  # a resume opens its metrics (dropping steps after its checkpoint) once restored
            self.metrics = MetricsLog(self.ctx.run_dir / "metrics.jsonl")
        stepper = Stepper(model, forward, optimizers, plan, world=self.world)
        # each rank reads its own micro-batches of every step (data.loader.TokenStream)
        batches = functools.partial(data.train_batches, rank=self.world.rank, world_size=self.world.world_size)
        extras = None
        if (
            self.world.world_size == 1
        ):  # periodic validation, checkpoints, batch search: one process (plan refuses more)
            from speedrun.training.loop_setup import prepare_loop

            plan, extras = prepare_loop(self, stepper, eval_forward, data)
        self._on_phase("warmup")
        warm_up(stepper, batches, state, log.info)
        if extras is not None:
            state.compile_seconds += extras.warm()
        if plan.kernel.profile:  # untimed and undone, like warm-up: trace.json + top-kernels table in run.log
            from speedrun.kernels.profile import profile_steps

            result.update(profile_steps(stepper, batches, self.ctx.run_dir, log.info, plan.kernel.profile_steps))
        if extras is not None and self.resume:
            extras.restore(state, self.resume)
            self._release(state)
        from speedrun.kernels.compile import keeps_grads  # true exactly when training replays CUDA graphs

        self.peak_memory = PeakMemory(plan.device, graph_pools=keeps_grads(plan))
        self.peak_memory.start()  # peak_mem_mb covers timed training only
        self._on_phase("train")
        train(stepper, batches, state=state, log=log.info, on_metrics=self._on_metrics, extras=extras)
        if plan.compile:
            from speedrun.kernels.cache import cache_stats

            result.update(cache_stats())
        self._record_training(model)
        result["peak_mem_mb"] = self.world.max(result["peak_mem_mb"])  # the largest over the ranks
        self.result["data_epochs"] = round(state.tokens / data.train_tokens, 3)
        self._on_phase("train")  # training's keys are in the record before evaluation starts
        if self.result["data_epochs"] > 1 and self.world.rank == 0:  # once per run, not once per rank
            # the fix depends on the data: the embedded corpus has a bigger dataset to move to; shards of one's
            # own need more of them (or a smaller budget)
            fix = (
                "use a larger dataset, e.g. data=fineweb_sp1024, for comparable numbers"
                if plan.data.path is None
                else f"add train shards to {plan.data.path} (scripts/prepare_data.py) or train on fewer tokens"
            )
            log.warning(
                "training made %.1f passes over %s training tokens: val_bpb includes the effect of repeating data (%s)",
                self.result["data_epochs"],
                f"{data.train_tokens:,}",
                fix,
            )
        if state.diverged:
            result["status"] = "diverged"
            result["error"] = state.divergence
            result["diverged_step"] = state.diverged_step
            log.error(result["error"])
            return

        from speedrun.finishing.finalize import evaluate_and_export

        model.eval()  # no dropout here, but fp8 layers switch to their bf16 path for evaluation

        result.update(
            evaluate_and_export(
                plan, model, eval_forward, data, self.ctx.run_dir, log.info, on_phase=self._on_phase, world=self.world
            )
        )
        result.update(status="ok", phase="done")

    def write_file(self, name: str, text: str) -> None:
        """A run-dir file, written atomically, or kept in memory while a resume holds the original run's files."""
        if self.holding:
            self._held_files[name] = text
        else:
            atomic_write_text(self.ctx.run_dir / name, text)

    def _release(self, state: Any) -> None:
        """The checkpoint is restored: from here on the resumed job is the original run, continued."""
        self.holding = False
        self.metrics = MetricsLog(self.ctx.run_dir / "metrics.jsonl", after_step=state.steps)
        for name, text in self._held_files.items():
            self.write_file(name, text)
        if self.db is not None and self.run_id is not None:
            self.db.upsert(self.run_id, {**self.result, **self.start_keys})

    def error_dir(self) -> Path:
        """Where this job's error.txt and, for a resume refused before its restore, its record go."""
        if not self.holding:
            return self.ctx.run_dir
        if self._attempt_dir is None:
            self._attempt_dir = self.ctx.run_dir / "resume_attempts" / time.strftime("%Y-%m-%d_%H-%M-%S")
        return self._attempt_dir

    def _on_phase(self, phase: str, keys: dict[str, Any] | None = None) -> None:
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
                log.warning("could not update the results database %s: %s", self.db.path, e)

    def _on_metrics(self, record: dict[str, Any]) -> None:
        if self.metrics is None:  # a resume's batch search, before its restore: not part of the run's curve
            return
        self.metrics.write(record)
        self._guard("log_metrics", record)

    def _guard(self, method: str, *args: Any) -> None:
        """Call the run logger; a logger problem is a warning, never a failed run."""
        if self.logger is None:
            return
        try:
            getattr(self.logger, method)(*args)
        except Exception as e:  # noqa: BLE001
            log.warning("logger %s.%s failed: %s: %s", type(self.logger).__name__, method, type(e).__name__, e)

    def _record_training(self, model: Any) -> None:
        from speedrun.training.mfu import mfu_keys
        from speedrun.training.peak_memory import PeakMemory

        plan, state, result = self.plan, self.state, self.result
        assert plan is not None and state is not None
        tok_s = state.tokens / state.train_seconds if state.train_seconds > 0 else None
        result.update(
            steps=state.steps,
            tokens=state.tokens,
            train_seconds=round(state.train_seconds, 3),
            compile_seconds=round(state.compile_seconds, 3),
            train_loss=state.last_loss,
            stages=state.stages,
            recompiles=state.recompiles,
            tokens_per_s=round(tok_s, 1) if tok_s else None,
        )
        from speedrun.training.loop_setup import (
            loop_result,  # torch-heavy: imported when a run records, not with the runner
        )

        result.update(loop_result(plan, state))
        result.update(mfu_keys(plan, state.stages, state.steps, state.train_seconds))
        result.update((self.peak_memory or PeakMemory(plan.device)).read())

    # -- always -------------------------------------------------------------------------------------------
    def close_early(self, db: ResultsDB, run_id: str, status: str, error: str, tb: str) -> None:
        """Rank 0, from the dist guard's thread: a peer failed or a stop signal came while this rank may be stuck
        in a collective; close the row now, in case this process is killed before ``finish``."""
        with self._closing:
            if self._finished or self.holding:
                return
            db.upsert(run_id, {"status": status, "error": error, "finished_at": time.time()})
            if tb:
                (self.ctx.run_dir / "error.txt").write_text(tb)

    def finish(self, db: ResultsDB, started: float) -> None:
        """Write result.json and complete the database row, whatever happened."""
        with self._closing:
            self._finished = True
        if self.metrics:
            self.metrics.close()
        from speedrun.distributed.launch import adopt_rank0_record

        if self.delegated and adopt_rank0_record(db, self.run_id, self.ctx.run_dir, self.result):
            log.info("result:\n%s", format_result_block(self.result))  # rank 0 recorded the run
            return
        if self.state is not None and self.result.get("steps") is None:
            try:  # interrupted or failed mid-training: keep what was measured
                self._record_training(self.model)
            except Exception as e:  # noqa: BLE001 - e.g. a broken CUDA context; the record must still be written
                log.warning("could not collect training metrics: %s: %s", type(e).__name__, e)
                self.result.update(steps=self.state.steps, tokens=self.state.tokens)
        finished = time.time()
        self.result["wall_seconds"] = round(finished - started, 3)
        out_dir, run_id = self.ctx.run_dir, self.run_id
        if self.holding:  # a resume that ended before its restore: its own record, the original untouched
            out_dir = self.error_dir()
            out_dir.mkdir(parents=True, exist_ok=True)
            run_id = str(out_dir.resolve())
            self.result.update(run_dir=run_id, resume_of=self.run_id)
            self.start_keys = {"started_at": started, "overrides": " ".join(self.ctx.overrides)}
        self.record_id = run_id
        write_json(out_dir / "result.json", self.result)
        row = {**self.result, "finished_at": finished, "plan": self.plan.to_dict() if self.plan else None}
        try:
            db.upsert(run_id, {**self.start_keys, **row} if self.holding else row)
        except Exception as e:  # noqa: BLE001 - result.json already holds the record
            log.error("could not update the results database %s: %s", db.path, e)
            self.record_id = None
        self._guard("log_result", self.result)
        self._guard("finish", self.result["status"])
        # a run that never trained (refused, or stopped before its model was built) has no block to show: the
        # error and its row are one line (speedrun.main)
        trained = self.state is not None and not self.holding
        if self.world.info.launcher != "elastic" and trained:  # else the launching process prints it, last
            log.info("result:\n%s", format_result_block(self.result))
        self.world.shutdown(clean=self.result["status"] in ("ok", "diverged"))

    def record_note(self) -> str:
        """Where the record of this run is, for the one line that ends a refused or stopped run."""
        if self.record_id is None:
            return f"no row: the results database could not be written; see {self.error_dir() / 'result.json'}"
        note = f"row {self.record_id} ({self.result['status']})"
        from speedrun.training.checkpoint import list_checkpoints

        if self.result["status"] == "interrupted" and not self.holding and list_checkpoints(self.ctx.run_dir):
            note += f"; continue it with `python -m run resume={self.ctx.run_dir}`"
        return note


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
