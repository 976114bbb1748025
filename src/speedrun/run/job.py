"""The pipeline of one job, phase by phase: resolve -> start -> build -> train -> record training -> finish.

``Job.run`` reads like the list above; each phase is a method that takes what the previous one made. The record
(run-dir files, results row, logger) is ``Job.record``, a speedrun.run.job_record.JobRecord the runner opened.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

from speedrun.config import Config, LoggerConfig
from speedrun.core.compile import keeps_grads
from speedrun.core.gptq import Calibration
from speedrun.core.pipeline import gptq_hessians
from speedrun.core.train import Hooks, Stepper, TrainSettings, TrainState, fit, trained_shapes
from speedrun.errors import PlanError
from speedrun.hardware import profiles as hardware
from speedrun.kernels.cache import cache_stats
from speedrun.plan import Plan, plan_json, resolve
from speedrun.plan.budget import reads_training_data
from speedrun.plan.settings import finish_settings, train_settings
from speedrun.records.identity import gpu_identity
from speedrun.records.keys import model_keys, optim_keys, quant_keys
from speedrun.records.store import MetricsLog, capture_environment
from speedrun.run import run_steps
from speedrun.run.build import build_attention, build_data, build_model, configure_torch
from speedrun.run.finish import evaluate_and_export
from speedrun.run.hooks import READY_LINE, wait_at_start_gate
from speedrun.run.job_record import JobRecord
from speedrun.run.loggers import RunLogger
from speedrun.run.loop_setup import LoopHooks, loop_result, prepare_loop
from speedrun.run.mfu import mfu_keys
from speedrun.run.oom import start_history
from speedrun.run.peak_memory import PeakMemory
from speedrun.run.quant_phase import measure_reserve

log = logging.getLogger("speedrun")


class Job:
    """The pipeline of one run (resolve, build, train, the Hessians, evaluation and export), writing what it
    measures into its ``record`` (speedrun.run.job_record.JobRecord), which the runner opened and closes."""

    peak_memory: Any = None
    model: Any = None
    calibration: Calibration | None = None
    """GPTQ's Hessians, collected right after the loop (rank 0, quant=int6); the export quantizes with them."""
    hessian_seconds: float | None = None
    """Wall seconds from train()'s return (after its last flush, any final checkpoint and the EMA's copy, which the
    loop's clock leaves out) to the Hessians' end: what train_seconds adds to the loop's clock."""
    loop_ended: float = 0.0
    training_ended: float | None = None
    """When training's last read of data ended (the loop's, or the Hessians'): evaluation's clock starts there."""
    code: Any = None
    """The source as the job read it when it started, with its resolved config: the self-extracting file is made
    from it (speedrun.artifact.wrap.CodeSource), so the file carries the code that ran, not a later edit."""

    def __init__(self, record: JobRecord):
        self.record = record
        record.training_keys = self.training_keys  # the record keeps what training measured, even if it stops

    def run(self, config: Config) -> None:
        """The whole pipeline. ``config`` is read by the resolver alone; everything after it reads the Plan."""
        plan = self.resolve(config)
        del config
        if self.record.delegated:  # dist.nproc > 1 under `python -m run`: the ranks ran it; rank 0 recorded the run
            return
        self.start(plan)
        data, model, forward, eval_forward, optimizers = self.build(plan)
        state = self.train(plan, data, model, forward, eval_forward, optimizers)
        if not state.diverged:
            self.calibrate(data, model)
        self.end_training(data)
        if state.diverged:  # a result, not a crash: nothing worth evaluating
            self.record.result.update(status="diverged", error=state.divergence, diverged_step=state.diverged_step)
            log.error(self.record.result["error"])
            return
        self.finish_model(data, model, eval_forward)
        self.record.result.update(status="ok", phase="done")

    # -- phases ---------------------------------------------------------------------------------------
    def resolve(self, config: Config) -> Plan:
        """Config + the device -> the frozen Plan, written as plan.json; under `python -m run dist.nproc=N` the
        ranks are started here and this process only waits for them."""
        plan = self.record.plan = resolve(
            config, hardware.detect(), cwd=self.record.ctx.original_cwd, world=self.record.world.info
        )
        log.info("plan:\n%s", _indent(plan.describe()))
        start_history(plan)  # hardware.memory_snapshot=true: allocations from the model build on
        self.record.write_file("plan.json", plan_json(plan) + "\n")
        if plan.dist.launch == "self":  # asked for several ranks and none exists yet: start them, train nothing
            from speedrun.distributed.launch import launch_ranks  # a Plan's choice

            self.record.delegated = True
            launch_ranks(plan, self.record.ctx.run_dir, log.info)
        return plan

    def start(self, plan: Plan) -> None:
        """Join the other ranks, record the environment and what the plan chose, configure torch, open the
        logger."""
        if plan.artifact.code_rule == "wrapped":  # the code that ran, read now: the file is linked at the end
            from speedrun.artifact.wrap import CodeSource  # a raw count links nothing

            self.code = CodeSource.snapshot()
        self.record.world.init(plan)
        env = capture_environment(plan.device)
        self.record.write_file("env.json", json.dumps(env, indent=2, default=str) + "\n")
        self.record.result.update(
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
            model_arch=plan.model_arch,
            model_options=dict(plan.model_options) or None,
            tokens_per_step=plan.tokens_per_step,
            seq_len=plan.model.seq_len,
            card=plan.card,
            memory_estimate_gb=plan.memory_estimate_gb,
            data=plan.data.name,
            eval_whole_split=plan.eval.tokens is None,
            track=plan.track.name,
        )
        self.record.result.update(gpu_identity(plan.device))  # which physical card: cards of one model differ in speed
        self.record.result.update(self.record.world.describe(plan.device_name))  # world_size, nodes, each rank's GPU
        self.record.result.update(plan.kernel.result_keys())  # kernel_* settings that ran, so sweeps over kernel= group
        self.record.result.update(
            optim_keys(plan.optim, plan.schedule, plan.ema)
        )  # the optimizer, schedule and EMA levers
        self.record.result.update(model_keys(plan.model))  # the model levers (model_*)
        self.record.result.update(quant_keys(plan.quant))  # the export's levers (quant_*)
        self.record.result.update(configure_torch(plan))  # a CPU run's thread count (cpu_threads)
        if self.record.world.rank == 0:  # one W&B run per run, not per rank
            self.record.logger = make_logger(
                plan.logger, self.record.ctx.run_dir, self.record.result["sweep"], plan.name
            )
        self.record.guard("start", self.record.config_tree, plan.to_dict())

    def build(self, plan: Plan) -> tuple[Any, Any, Any, Any, Any]:
        """The data streams, and the model with its attention backend and optimizers, identical on every rank."""
        attention = build_attention(plan)
        data = build_data(plan, log.info)
        model, forward, eval_forward, optimizers = build_model(plan, attention, data.bos_id)
        self.record.world.prepare(
            model, optimizers
        )  # rank 0's initial weights everywhere; Muon's work split over ranks
        self.model = model
        self.record.result["params"] = model.num_params()
        log.info("model: %s parameters", f"{self.record.result['params']:,}")
        return data, model, forward, eval_forward, optimizers

    def train(self, plan: Plan, data: Any, model: Any, forward: Any, eval_forward: Any, optimizers: Any) -> TrainState:
        """Warm up (compile, untimed; GPTQ's reserve measured), restore a resumed run's checkpoint, train to the
        budget."""
        self.record.state = state = TrainState()
        if self.record.resume is None:  # a resume opens its metrics (dropping steps after its checkpoint) once restored
            self.record.metrics = MetricsLog(self.record.ctx.run_dir / "metrics.jsonl")
        stepper = Stepper(model, forward, optimizers, train_settings(plan), world=self.record.world)
        # each rank reads its own micro-batches of every step (data.loader.TokenStream)
        batches = functools.partial(
            data.train_batches, rank=self.record.world.rank, world_size=self.record.world.world_size
        )
        # batch search, periodic validation, checkpoints and stop signals: on every rank, agreed between them
        plan, extras = self._prepare_loop(plan, stepper, eval_forward, data)
        self.record.on_phase("warmup")

        def after_warmup(step_times: dict[tuple[int, bool], float], state: TrainState) -> TrainSettings | None:
            if extras is not None:  # step 0's periodic validation: the weights warm-up restored
                state.compile_seconds += extras.warm()
            state.hessian_reserve_seconds = self._hessian_reserve(plan, model, data)
            resolved = self._run_steps(plan, step_times, state.hessian_reserve_seconds)
            return None if resolved == plan else train_settings(resolved)

        def before_clock(state: TrainState) -> None:
            plan = self.record.plan
            assert plan is not None
            if plan.kernel.profile:  # untimed and undone, like warm-up: trace.json + top-kernels table in run.log
                from speedrun.kernels.profile import profile_steps  # a Plan's choice

                self.record.result.update(
                    profile_steps(
                        stepper,
                        batches,
                        self.record.ctx.run_dir,
                        log.info,
                        plan.kernel.profile_steps,
                        trained_shapes(stepper.settings),
                        peak_flops=plan.peak_flops,
                    )
                )
            if self._resuming():
                extras.restore(state)
                if self.record.resume is not None:
                    self.record.release(state.steps)
            log.info(READY_LINE)  # speedrun.bench's end of start-up: warm-up, GPTQ's reserve, profile, restore done
            if wait_at_start_gate(log.info) is not None:  # SPEEDRUN_START_GATE: train at the same time as a peer
                self.record.world.agree(0.0)  # every rank leaves the gate before rank 0's clock starts
            # keeps_grads: true exactly when training replays CUDA graphs, whose pools the peak must count
            graphs = keeps_grads(plan.compile, plan.kernel.compile_mode, plan.kernel.cuda_graphs)
            self.peak_memory = PeakMemory(plan.device, graph_pools=graphs)
            self.peak_memory.start()  # peak_mem_mb covers timed training only
            self.record.on_phase("train")

        hooks = Hooks(after_warmup=after_warmup, before_clock=before_clock, between_steps=extras)
        time_steps = run_steps.needs_projection(plan)
        fit(
            stepper,
            batches,
            state=state,
            report=self._train_report,
            hooks=hooks,
            time_steps=time_steps,
        )
        self.loop_ended = time.perf_counter()
        if self.record.plan is not None and self.record.plan.compile:
            self.record.result.update(cache_stats())
        return state

    def _train_report(self, kind: str, values: dict[str, Any]) -> None:
        """core.train.fit's progress: its lines to the log, each step's metrics into the record."""
        if kind == "line":
            log.info(values["text"])
        elif kind == "metrics":
            self.record.on_metrics(values)

    def _hessian_reserve(self, plan: Plan, model: Any, data: Any) -> float:
        """Seconds of the time budget GPTQ's Hessians get after the loop: the plan's, or measured now on rank 0
        (which collects them) and agreed by every rank, whose loops stop on rank 0's clock anyway."""
        if not plan.budget.measures_reserve:
            return plan.budget.hessian_reserve or 0.0
        rank0 = self.record.world.rank == 0
        reserve = self.record.world.agree(measure_reserve(plan, model, data, log.info) if rank0 else 0.0)
        seconds = plan.budget.seconds
        if seconds is not None and reserve >= seconds:  # the same value, so the same refusal, on every rank
            raise PlanError(
                f"GPTQ's Hessians would take {reserve:.1f} s here (measured in warm-up), the whole "
                f"budget.train_seconds={seconds:g}: raise budget.train_seconds, or lower quant.calib_batches"
            )
        return reserve

    def _run_steps(self, plan: Plan, step_times: dict[tuple[int, bool], float], reserve: float) -> Plan:
        """The steps the run will make (speedrun.run.run_steps): settings given as fractions of the run become
        steps (a new plan.json, result.json's run_steps), and each step-counted setting longer than the run is a
        warning. A time budget's projection is rank 0's, so every rank trains with the same settings."""
        run = run_steps.known_steps(plan)
        if run is None and step_times:
            projected = run_steps.project_steps(plan, plan.budget.loop_seconds(reserve) or 0.0, step_times)
            run = run_steps.RunSteps(int(self.record.world.agree(float(projected.steps))), projected.source)
        if run is None:
            return plan
        resolved, warnings = run_steps.resolve(plan, run)
        log.info(run_steps.describe(plan, resolved, run))
        for line in warnings:
            log.info(line)
        # kept to re-apply after the loop's keys, which come from the resolved plan (its fractions are null)
        self.run_step_keys = {**run_steps.result_keys(plan, resolved, run), "run_steps_warnings": warnings or None}
        self.record.result.update(self.run_step_keys)
        if resolved == plan:
            return plan
        self.record.plan = (
            resolved  # training takes its settings (an ema.horizon's decay starts the average: core.train.fit)
        )
        self.record.write_file("plan.json", plan_json(resolved) + "\n")
        return resolved

    def calibrate(self, data: Any, model: Any) -> None:
        """GPTQ's Hessians, right after the last step (rank 0, which exports): the last read of training data, so
        train_seconds ends with them (speedrun.run.quant_phase)."""
        plan = self.record.plan
        assert plan is not None
        if not reads_training_data(plan.quant) or self.record.world.rank != 0:
            return
        model.eval()  # as the export scores and quantizes it (fp8 layers take their bf16 path)
        self.calibration = gptq_hessians(model, data, finish_settings(plan), _log_report)
        self.training_ended = time.perf_counter()
        self.hessian_seconds = self.training_ended - self.loop_ended

    def end_training(self, data: Any) -> None:
        """Record training (the loop, and the Hessians after it), before evaluation starts."""
        plan, state = self.record.plan, self.record.state
        assert plan is not None and state is not None
        self.record.record_training()
        self.record.result["peak_mem_mb"] = self.record.world.max(
            self.record.result["peak_mem_mb"]
        )  # the largest over the ranks
        self.record.result["epochs"] = round(state.tokens / data.train_tokens, 3)
        self.record.on_phase("train")  # training's keys are in the record before evaluation starts
        if self.record.result["epochs"] > 1 and self.record.world.rank == 0:  # once per run, not once per rank
            _warn_repeated_data(plan, self.record.result["epochs"], data.train_tokens)

    def _resuming(self) -> bool:
        """Whether this job restores a checkpoint: rank 0's decision, on every rank. A rank > 0 runs in a directory
        of its own, so auto-resume (a job requeued into its run dir) finds the checkpoint on rank 0 alone; the
        others follow it (auto-resume found the same config there) and load the file rank 0 picks."""
        resuming = bool(self.record.world.from_rank0(lambda: self.record.resume is not None))
        if self.record.resume is not None and not resuming:
            raise RuntimeError(
                f"rank {self.record.world.rank} resumes {self.record.resume.run_dir} but rank 0 starts afresh: give every rank the "
                f"same resume=<run dir>"
            )
        return resuming

    def _prepare_loop(self, plan: Plan, stepper: Any, eval_forward: Any, data: Any) -> tuple[Any, Any]:
        """Batch-size search (a new plan.json when it chose), periodic validation and checkpoints."""
        hooks = LoopHooks(
            run_dir=self.record.ctx.run_dir,
            config_tree=self.record.config_tree,
            overrides=self.record.ctx.overrides,
            cwd=self.record.ctx.original_cwd,
            code_fingerprint=self.record.result.get("code_fingerprint"),
            write_file=self.record.write_file,
            on_metrics=self.record.on_metrics,
        )
        plan, extras, searched = prepare_loop(plan, stepper, eval_forward, data, hooks)
        if searched is not None:
            self.record.plan = plan
            self.record.result["batch_search"] = searched
            self.record.guard(
                "update_config",
                {
                    "micro_batch": plan.micro_batch,
                    "grad_accum": plan.grad_accum,
                    "eval_batch_size": plan.eval.batch_size,
                },
            )
        return plan, extras

    def finish_model(self, data: Any, model: Any, eval_forward: Any) -> None:
        """Score the model, export the artifact, score its round trip, test-time train (speedrun.run.finish)."""
        assert self.record.plan is not None  # resolve() set it, before the model was built
        model.eval()  # no dropout here, but fp8 layers switch to their bf16 path for evaluation
        self.record.result.update(
            evaluate_and_export(
                self.record.plan,
                model,
                eval_forward,
                data,
                self.record.ctx.run_dir,
                log.info,
                on_phase=self.record.on_phase,
                world=self.record.world,
                code=self._frozen_code(),
                hessians=self.calibration.hessians if self.calibration is not None else None,
                started=self.training_ended or self.loop_ended or None,
            )
        )

    def _frozen_code(self) -> Any:
        """The source read at start with the settings the run ended up with (the resolved Plan, GPTQ's measured
        reserve, a CPU run's threads: a sum over another number of threads rounds differently)."""
        plan, state = self.record.plan, self.record.state
        if self.code is None or plan is None:
            return None
        threads = self.record.result.get("cpu_threads")
        reserve = state.hessian_reserve_seconds if state is not None else 0.0
        return self.code.for_plan(plan, hessian_reserve=reserve, threads=threads)

    def training_keys(self) -> dict[str, Any]:
        """What the result records of training: steps, tokens, times, losses, the loop's keys, MFU, peak memory."""
        plan, state = self.record.plan, self.record.state
        assert plan is not None and state is not None
        tok_s = state.tokens / state.train_seconds if state.train_seconds > 0 else None
        result: dict[str, Any] = {}
        result.update(
            steps=state.steps,
            tokens=state.tokens,
            **self._train_time_keys(),
            compile_seconds=round(state.compile_seconds, 3),
            train_loss=state.last_loss,
            stages=state.stages,
            recompiles=state.recompiles,
            tokens_per_s=round(tok_s, 1) if tok_s else None,
        )
        result.update(loop_result(plan, state))
        result.update(getattr(self, "run_step_keys", {}))  # the fractions of the run the settings came from
        result.update(mfu_keys(plan, state.stages, state.steps, state.train_seconds))
        result.update((self.peak_memory or PeakMemory(plan.device)).read())
        return result

    def _train_time_keys(self) -> dict[str, Any]:
        """train_seconds, the time the track and the budget count: the loop's clock (train_loop_seconds) plus, where
        GPTQ's Hessians were collected after it, the wall time to their end (quant_hessian_seconds the collection
        alone); budget_seconds the limit (null: none) and quant_reserve_ok whether both fit in it."""
        plan, state = self.record.plan, self.record.state
        assert plan is not None and state is not None
        loop = state.train_seconds
        keys: dict[str, Any] = {
            "train_loop_seconds": round(loop, 3),
            "budget_seconds": plan.budget.seconds,
            "train_seconds": round(loop + (self.hessian_seconds or 0.0), 3),
        }
        if self.calibration is not None:
            limit = plan.budget.seconds
            keys.update(
                quant_hessian_seconds=round(self.calibration.seconds, 3),
                hessian_reserve_seconds=round(state.hessian_reserve_seconds, 3),
                quant_reserve_ok=None if limit is None else keys["train_seconds"] <= limit,
            )
            log.info(
                "training: loop %.1f s + GPTQ's Hessians %.1f s = %.1f s%s",
                loop,
                self.hessian_seconds,
                keys["train_seconds"],
                ""
                if limit is None
                else f" of budget.train_seconds {limit:g} (reserve {state.hessian_reserve_seconds:.1f} s: "
                f"{'enough' if keys['quant_reserve_ok'] else 'NOT enough, raise quant.reserve_seconds'})",
            )
        return keys


def make_logger(settings: LoggerConfig, run_dir: Path, group: str | None, name: str) -> RunLogger:
    """The run's logger: the console's (speedrun.run.loggers), or Weights & Biases' when the Plan chose it."""
    if settings.name == "console":
        return RunLogger()
    if settings.name == "wandb":
        from speedrun.run.wandb_logger import WandbLogger  # logger=wandb, a Plan's choice

        return WandbLogger(settings, run_dir, group, name)
    raise ValueError(f"logger={settings.name}: unknown; choose one of console, wandb")


def _warn_repeated_data(plan: Plan, epochs: float, train_tokens: int) -> None:
    # the fix depends on the data: the embedded corpus has a bigger dataset to move to; shards of one's own need
    # more of them (or a smaller budget)
    fix = (
        "use a larger dataset for comparable numbers: data=fineweb_sp1024, or data=python_sp1024 built from this "
        "machine's Python installation (scripts/prepare_data.py --source python)"
        if plan.data.path is None
        else f"add train shards to {plan.data.path} (scripts/prepare_data.py) or train on fewer tokens"
    )
    log.warning(
        "training made %.1f passes over %s training tokens: val_bpb includes the effect of repeating data (%s)",
        epochs,
        f"{train_tokens:,}",
        fix,
    )


def _log_report(kind: str, values: dict[str, Any]) -> None:
    """The core's Report where only its lines matter: to the run's log."""
    if kind == "line":
        log.info(values["text"])


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
