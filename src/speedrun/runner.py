"""One job, end to end: compose -> resolve -> build -> train -> evaluate -> finalize -> record.

The record is opened before anything can fail (row status ``running``) and closed whatever happens: ok,
failed (with the error and a traceback file), diverged, or interrupted (Ctrl-C, SIGTERM from a scheduler).
"""
from __future__ import annotations

import functools
import logging
import math
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from . import dist
from .config import Config, to_config
from .loggers import RunLogger, make_logger
from .paths import results_db_path
from .records import MetricsLog, ResultsDB, empty_result, write_json
from .signals import sigterm_as_interrupt, stop_signals_deferred

log = logging.getLogger("speedrun")


class RunContext:
    """Where this job writes, and what Hydra knows about it (overrides, sweep)."""

    def __init__(self, run_dir: Path, overrides: list[str], sweep: Optional[str], original_cwd: Path):
        self.run_dir, self.overrides, self.sweep, self.original_cwd = run_dir, overrides, sweep, original_cwd

    @classmethod
    def from_hydra(cls) -> "RunContext":
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        sweep = None
        # A sweep job: MULTIRUN mode under Hydra's own launchers; the pool launcher runs each job as a RUN-mode
        # `python -m run` with hydra.sweep.dir and hydra.job.num set (not task overrides, so they stay clean).
        if hc.mode == RunMode.MULTIRUN or not OmegaConf.is_missing(hc.job, "num"):
            sweep = Path(hc.sweep.dir).name
        return cls(Path(hc.runtime.output_dir), list(hc.overrides.task), sweep, Path(hc.runtime.cwd))


def run_job(dict_cfg: DictConfig, ctx: Optional[RunContext] = None) -> dict[str, Any]:
    ctx = ctx or RunContext.from_hydra()
    world = dist.current()  # this process's rank in a run of several (rank 0 of 1 for a plain run)
    if world.rank > 0:  # the ranks share rank 0's run dir and row; theirs go to a private dir, removed at exit
        ctx = RunContext(Path(world.private_dir()), ctx.overrides, ctx.sweep, ctx.original_cwd)
        world.quiet()
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    # The record opens from the composed config's top-level knobs (types already checked by Hydra), before the
    # schemas' own checks run, so a bad value still leaves a failed row.
    config_tree = OmegaConf.to_container(dict_cfg, resolve=True, enum_to_str=True)
    db = ResultsDB(results_db_path(dict_cfg.results_db, ctx.original_cwd)) if world.rank == 0 else dist.NoRecords()
    run_id = str(ctx.run_dir.resolve())
    result = empty_result()
    result.update(status="running", seed=dict_cfg.seed, sweep=dict_cfg.sweep or ctx.sweep, run_dir=run_id,
                  name=dict_cfg.name, hardware=str(dict_cfg.hardware.name), attn=str(dict_cfg.attn.name),
                  precision=str(dict_cfg.precision.name))
    started = time.time()
    db.upsert(run_id, {**result, "started_at": started, "overrides": " ".join(ctx.overrides), "config": config_tree})
    job = Job(ctx, result, config_tree, world)
    world.on_stop = functools.partial(job.close_early, db, run_id)
    try:
        with sigterm_as_interrupt():
            job.run(to_config(dict_cfg))
    except KeyboardInterrupt as e:
        result["status"] = "interrupted"
        result["error"] = "interrupted (Ctrl-C or SIGTERM)"
        world.settle(result, e, ctx.run_dir)  # a peer rank's failure outranks the signal it caused here
        raise
    except BaseException as e:  # noqa: BLE001 - every failure is recorded, then re-raised
        result["status"] = "failed"
        result["error"] = f"{type(e).__name__}: {e}"
        if not job.delegated:  # a launching process keeps rank 0's error.txt
            (ctx.run_dir / "error.txt").write_text(traceback.format_exc())
        world.settle(result, e, ctx.run_dir)  # names the rank that failed first, and tells the others to stop
        raise
    finally:
        with stop_signals_deferred():
            job.finish(db, run_id, started)
    return result


class Job:
    def __init__(self, ctx: RunContext, result: dict[str, Any], config_tree: Any, world: dist.World = dist.SINGLE):
        self.ctx, self.result, self.config_tree, self.world = ctx, result, config_tree, world
        self.delegated = False
        """True in a `python -m run dist.nproc=N` process that started the ranks: rank 0 records the run."""
        self._closing = threading.Lock()
        self._finished = False
        self.metrics: Optional[MetricsLog] = None
        self.logger: Optional[RunLogger] = None
        self.state = None
        self.plan = None
        self.model = None

    # -- the pipeline ---------------------------------------------------------------------------------
    def run(self, config: Config) -> None:
        """The whole pipeline. ``config`` is read by the resolver alone; everything after it reads the Plan."""
        import torch

        from . import hardware
        from .plan import plan_json, resolve
        from .records import capture_environment

        result = self.result
        plan = self.plan = resolve(config, hardware.detect(), cwd=self.ctx.original_cwd, world=self.world.info)
        del config
        log.info("plan:\n%s", _indent(plan.describe()))
        (self.ctx.run_dir / "plan.json").write_text(plan_json(plan) + "\n")
        from .launch import launch_ranks, needs_launch

        if needs_launch(plan):  # dist.nproc > 1 under `python -m run`: start the ranks; rank 0 records the run
            self.delegated = True
            launch_ranks(plan, self.ctx.run_dir, log.info)
            return
        self.world.init(plan)
        env = capture_environment(plan.device)
        write_json(self.ctx.run_dir / "env.json", env)
        result.update(
            hardware=plan.hardware, device_name=plan.device_name, emulated=plan.emulated, attn=plan.attn,
            attn_kernel=plan.attn_kernel, precision=plan.precision, git_sha=env["git_sha"],
            git_dirty=env["git_dirty"], code_fingerprint=env["code_fingerprint"], torch_version=env["torch_version"],
            model=plan.model_name,
            tokens_per_step=plan.tokens_per_step, seq_len=plan.model.seq_len,
        )
        result.update(self.world.describe(plan.device_name))  # world_size, nodes, each rank's GPU
        _configure_torch(plan)
        if self.world.rank == 0:  # one W&B run per run, not per rank
            self.logger = make_logger(plan.logger, self.ctx.run_dir, result["sweep"], plan.name)
        self._guard("start", self.config_tree, plan.to_dict())

        from .build import build_attention, build_data, build_model

        attention = build_attention(plan)
        data = build_data(plan, log.info)
        model, forward, eval_forward, optimizers = build_model(plan, attention, data.bos_id)
        self.world.prepare(model, optimizers)  # rank 0's initial weights everywhere; Muon's work split over ranks
        self.model = model
        result["params"] = model.num_params()
        log.info("model: %s parameters", f"{result['params']:,}")

        from .train import Stepper, TrainState, train, warm_up

        self.state = state = TrainState()
        self.metrics = MetricsLog(self.ctx.run_dir / "metrics.jsonl")
        stepper = Stepper(model, forward, optimizers, plan, world=self.world)
        # each rank reads its own micro-batches of every step (data.loader.TokenStream)
        batches = functools.partial(data.train_batches, rank=self.world.rank, world_size=self.world.world_size)
        warm_up(stepper, batches, state, log.info)
        if plan.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        train(stepper, batches, state=state, log=log.info, on_metrics=self._on_metrics)
        self._record_training(model)
        result["peak_mem_mb"] = self.world.max(result["peak_mem_mb"])  # the largest over the ranks
        self.result["data_epochs"] = round(state.tokens / data.train_tokens, 3)
        if self.result["data_epochs"] > 1:
            log.warning("training made %.1f passes over %s training tokens: val_bpb includes the effect of repeating "
                        "data (use a larger dataset, e.g. data=fineweb_sp1024, for comparable numbers)",
                        self.result["data_epochs"], f"{data.train_tokens:,}")
        if state.diverged:
            result["status"] = "diverged"
            result["error"] = f"non-finite training loss ({state.last_loss}) at step {state.steps}"
            log.error(result["error"])
            return

        from .finalize import evaluate_and_export

        model.eval()  # no dropout here, but fp8 layers switch to their bf16 path for evaluation

        result.update(evaluate_and_export(plan, model, eval_forward, data, self.ctx.run_dir, log.info,
                                          world=self.world))
        result["status"] = "ok"

    def _on_metrics(self, record: dict[str, Any]) -> None:
        assert self.metrics is not None
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
        import torch

        plan, state, result = self.plan, self.state, self.result
        assert plan is not None and state is not None
        tok_s = state.tokens / state.train_seconds if state.train_seconds > 0 else None
        result.update(steps=state.steps, tokens=state.tokens, train_seconds=round(state.train_seconds, 3),
                      compile_seconds=round(state.compile_seconds, 3), train_loss=state.last_loss,
                      stages=state.stages, recompiles=state.recompiles,
                      tokens_per_s=round(tok_s, 1) if tok_s else None)
        if tok_s and plan.peak_flops:
            # tok_s is global: the peak is every rank's card together
            result["flops_per_token"] = plan.model.flops_per_token(plan.model.seq_len)
            result["mfu"] = round(result["flops_per_token"] * tok_s / (plan.peak_flops * plan.world_size), 4)
            if plan.emulated and plan.device_peak_flops:
                # MFU above is against the emulated profile's peak (what the recipe would get there, if it ran
                # this fast); this one is against the card that actually ran.
                result["mfu_device"] = round(
                    result["flops_per_token"] * tok_s / (plan.device_peak_flops * plan.world_size), 4)
        if plan.device == "cuda":
            result["peak_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        else:
            import resource

            result["peak_mem_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    # -- always -------------------------------------------------------------------------------------------
    def close_early(self, db: ResultsDB, run_id: str, status: str, error: str, tb: str) -> None:
        """Rank 0, from the dist guard's thread: a peer failed or a stop signal came while this rank may be stuck
        in a collective; close the row now, in case this process is killed before ``finish``."""
        with self._closing:
            if self._finished:
                return
            db.upsert(run_id, {"status": status, "error": error, "finished_at": time.time()})
            if tb:
                (self.ctx.run_dir / "error.txt").write_text(tb)

    def finish(self, db: ResultsDB, run_id: str, started: float) -> None:
        """Write result.json and complete the database row, whatever happened."""
        with self._closing:
            self._finished = True
        if self.metrics:
            self.metrics.close()
        from .launch import adopt_rank0_record

        if self.delegated and adopt_rank0_record(db, run_id, self.ctx.run_dir, self.result):
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
        write_json(self.ctx.run_dir / "result.json", self.result)
        try:
            db.upsert(run_id, {**self.result, "finished_at": finished,
                               "plan": self.plan.to_dict() if self.plan else None})
        except Exception as e:  # noqa: BLE001 - result.json already holds the record
            log.error("could not update the results database %s: %s", db.path, e)
        self._guard("log_result", self.result)
        self._guard("finish", self.result["status"])
        if self.world.info.launcher != "elastic":  # else the launching process prints it, last
            log.info("result:\n%s", format_result_block(self.result))
        self.world.shutdown(clean=self.result["status"] in ("ok", "diverged"))


def _configure_torch(plan: Any) -> None:
    import torch

    torch.manual_seed(plan.seed)
    if plan.device == "cuda":
        # TF32 only where the profile has it: an emulated T4 keeps true fp32 matmuls, as the card would.
        tf32 = plan.matmul_dtype == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if plan.memory_cap_gb:
            total = torch.cuda.get_device_properties(0).total_memory
            fraction = min(1.0, plan.memory_cap_gb * 1e9 / total)
            torch.cuda.set_per_process_memory_fraction(fraction)
            log.info("memory capped to %.1f GB (%.3f of the device)", plan.memory_cap_gb, fraction)


BLOCK_KEYS = ("status", "val_bpb", "val_loss", "val_bpb_quant", "val_bpb_ttt", "artifact_bytes", "artifact_ok",
              "tokens_per_s", "mfu", "peak_mem_mb", "steps", "tokens", "train_seconds", "compile_seconds",
              "eval_seconds", "params", "hardware", "device_name", "emulated", "attn_kernel", "precision", "seed",
              "run_dir", "error")


def format_result_block(result: dict[str, Any]) -> str:
    """The grep-able end of every run: one aligned ``key: value`` per line."""
    width = max(len(k) for k in BLOCK_KEYS)
    lines = []
    for key in BLOCK_KEYS:
        value = result.get(key)
        if isinstance(value, float) and math.isfinite(value):
            value = f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
        lines.append(f"{key + ':':<{width + 1}} {value}")
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
