"""The runner's hooks into the loop: batch-size search, periodic validation, checkpoints, resume, result keys.

Kept apart from runner.py so the runner calls two functions: ``prepare_loop`` before warm-up and ``loop_result``
when it records training.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedrun.errors import ConfigError
from speedrun.plan import Plan, plan_json
from speedrun.plan.settings import train_settings
from speedrun.records.keys import optim_keys
from speedrun.run.checkpoint import load_checkpoint, load_checkpoint_file, restore
from speedrun.run.periodic import LoopExtras, PeriodicEval, checkpoint_meta

log = logging.getLogger("speedrun")

_SAME_PLAN = (
    "model",
    "tokens_per_step",
    "budget",
    "optim",
    "schedule",
    "ema",
    "precision",
    "target_metric",
    "target_value",
)
"""Plan fields a checkpoint must agree on to be continued (the config is the same; the device may not be)."""


@dataclass
class LoopHooks:
    """What the loop's extras need of the job that runs them: where to write, and what a checkpoint records."""

    run_dir: Path
    config_tree: Any
    """The composed config, saved in every checkpoint's .json (resume runs it again)."""
    overrides: list[str]
    cwd: Path
    """Where the job started (relative paths in its config are taken from there)."""
    code_fingerprint: str | None
    """The code the run started with (records.identity): a resume onto other code is refused (training.resume)."""
    write_file: Callable[[str, str], None]
    """Writes a run-dir file (plan.json after a batch search); the job's record decides when and where."""
    on_metrics: Callable[[dict[str, Any]], None]


def prepare_loop(
    plan: Plan, stepper: Any, eval_forward: Any, data: Any, hooks: LoopHooks
) -> tuple[Plan, ResumableExtras, dict[str, Any] | None]:
    """Search batch sizes if the plan asks (rewriting plan.json with the choice) and build the LoopExtras.
    Returns the plan that trains, the extras and the search's record (None: no search)."""
    searched = None
    world = getattr(stepper, "world", None)
    if plan.micro_batch_search or plan.eval.batch_search:
        # every rank searches its own memory; the smallest choice over the ranks is what every rank runs
        from speedrun.run.batch_search import search_batches  # a Plan's choice

        plan, searched = search_batches(plan, stepper.model, log.info, world=world)
        stepper.settings = train_settings(plan)
        hooks.write_file("plan.json", plan_json(plan) + "\n")
    evaluator = (
        PeriodicEval(plan, stepper.model, eval_forward, data.val_tokens, data.luts, shard=world)
        if plan.eval.periodic
        else None
    )
    meta = checkpoint_meta(hooks.config_tree, hooks.overrides, plan, hooks.cwd, hooks.code_fingerprint)
    extras = ResumableExtras(
        plan, hooks.run_dir, stepper=stepper, evaluator=evaluator, meta=meta, on_metrics=hooks.on_metrics
    )
    return plan, extras, searched


class ResumableExtras(LoopExtras):
    def restore(self, state: Any) -> None:
        """Load the run's newest checkpoint into the model, optimizers, scaler and TrainState (after warm-up,
        which restores the initial weights when it ends). On several ranks rank 0 picks the checkpoint (ranks > 0
        write into a directory of their own and may not even know the run's) and every rank loads that file."""
        payload = self._load()
        meta = self.saved_meta(payload)
        saved, now = meta.get("plan") or {}, self.plan.to_dict()
        differ = [k for k in _SAME_PLAN if k in saved and saved[k] != now.get(k)]
        if differ:
            raise ConfigError(
                f"resume: the checkpoint's plan differs in {', '.join(differ)} from this device's "
                f"({self.plan.device_name}): resume on a device that resolves the same plan"
            )
        s, w = self.stepper, self.world
        restore(
            payload,
            s.model,
            s.optimizers,
            s.scaler,
            state,
            ema=getattr(s, "ema", None),
            rank=w.rank,
            world_size=w.world_size,
        )
        self.last_ckpt = (state.steps, payload["path"])
        self.last_eval_step = meta.get("last_eval_step")  # a validation at the checkpoint's step is not repeated
        if self.plan.eval.every_seconds:
            while self.next_eval_seconds <= state.train_seconds:
                self.next_eval_seconds += self.plan.eval.every_seconds
        self.log(
            f"resumed from {payload['path']}: step {state.steps}, {state.tokens:,} tokens, "
            f"{state.train_seconds:.1f} train seconds done"
        )

    def _load(self) -> dict[str, Any]:
        """Rank 0 loads the newest readable checkpoint and tells every rank its path (or why there is none, so that
        every rank stops with the same error); the others load that file."""
        mine: dict[str, Any] = {}

        def pick() -> dict[str, Any]:
            try:
                mine["payload"] = load_checkpoint(self.run_dir, map_location=self.plan.device)
            except (OSError, ValueError) as e:  # a checkpoint of another format, an unreadable dir
                return {"error": f"{type(e).__name__}: {e}"}
            return {"path": mine["payload"]["path"] if mine["payload"] is not None else None}

        picked = self.world.from_rank0(pick)
        if "error" in picked:
            raise ConfigError(f"resume: {picked['error']}")
        if picked["path"] is None:
            raise ConfigError(f"resume: no readable checkpoint in {self.run_dir / 'checkpoints'}")
        return mine.get("payload") or load_checkpoint_file(picked["path"], self.plan.device)

    @staticmethod
    def saved_meta(payload: dict[str, Any]) -> dict[str, Any]:
        return json.loads(Path(payload["path"]).with_suffix(".json").read_text())


def loop_result(plan: Plan, state: Any) -> dict[str, Any]:
    """Result keys of the loop: which budget ended training, the FLOPs trained, the time kept out of
    train_seconds, the batch sizes that ran (searched or not), and the optimizer, schedule and EMA levers
    (speedrun.records.keys.optim_keys: muon_wd ... ema_decay)."""
    return {
        **optim_keys(plan.optim, plan.schedule, plan.ema),
        "budget_end": state.budget_end,
        "val_seconds_periodic": round(state.val_seconds_periodic, 3),
        "checkpoint_seconds": round(state.checkpoint_seconds, 3),
        "micro_batch": plan.micro_batch,
        "grad_accum": plan.grad_accum,
        "eval_batch_size": plan.eval.batch_size,
        "ema_init_share": None if state.diverged else ema_init_share(plan, state.steps),
        **target_keys(plan, state),
    }


def ema_init_share(plan: Plan, steps: int) -> float | None:
    """The initial weights' share of the EMA after ``steps`` updates, decay ** steps (the average starts as a copy
    of them); None without EMA, or without a step (nothing was averaged; an eval-only run scores its weights). The
    record's 0.9965 assumes thousands of steps: after 215 it is still 47% the untrained model, and the final
    evaluation scores that average."""
    if not plan.ema.on or steps == 0:
        return None
    assert plan.ema.decay is not None  # EMA is on exactly when a decay is set
    return round(float(plan.ema.decay) ** steps, 6)


def target_keys(plan: Plan, state: Any) -> dict[str, Any]:
    """Time to target (budget.target_*): the target and whether a periodic evaluation reached it, with the train
    seconds (evaluations excluded), steps and tokens at that evaluation; the *_to_target keys are null when it was
    not reached. Empty without a target."""
    if plan.target_metric is None:
        return {}
    reached = state.target_steps is not None
    return {
        "target_metric": plan.target_metric,
        "target_value": plan.target_value,
        "reached": reached,
        "time_to_target": round(state.target_seconds, 3) if reached else None,
        "steps_to_target": state.target_steps,
        "tokens_to_target": state.target_tokens,
    }
