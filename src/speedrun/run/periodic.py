"""What the training loop does between steps, with its clock paused: periodic validation, checkpoints, stops.

``LoopExtras`` is handed to train.train(); the loop asks ``due`` after every step (cheap: counters and clocks),
and when it says yes, flushes the buffered losses and calls ``run`` with the train clock paused, so neither the
validation nor the checkpoint write counts in train_seconds (they are reported apart: val_seconds_periodic,
checkpoint_seconds). ``finish`` runs after the last step: a last validation point and, with periodic checkpoints
on, a checkpoint of the finished training, so a job stopped during the final evaluation resumes straight to it.

On several ranks every decision here is the same on every rank at the same step: ``agree`` folds each rank's stop
request and checkpoint wall clock into the loop's per-step collective (the largest over the ranks), every rank joins
``save`` (each rank's RNG and data position gathered, rank 0 writes the one file, training.checkpoint), and a stop
raises on every rank after it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from speedrun.core.dist import SINGLE
from speedrun.core.evaluate import run_eval
from speedrun.core.train import autocast_dtype
from speedrun.plan import Plan
from speedrun.run.checkpoint import capture, rank_state, save_checkpoint
from speedrun.run.preempt import NONE, StopRequests

log = logging.getLogger("speedrun")

PRUNE_CHECKS: list[Callable[[int, Any], bool]] = []
"""Asked after each periodic validation of a single-process run with (step, the validation's result): True ends
training there (budget_end pruned). speedrun.task adds an Optuna trial's (speedrun.sweep_trial); empty otherwise."""


class PeriodicEval:
    """Standard windows of model.seq_len over the first eval.periodic_tokens validation tokens. On several ranks
    (``shard``, a speedrun.core.dist.World) the batches of windows are split over the ranks and the sums
    all-reduced in float64, as the final evaluation does (evaluation.evaluate): every rank gets the same val_loss and
    val_bpb, equal to one rank scoring every window."""

    def __init__(
        self,
        plan: Plan,
        model: torch.nn.Module,
        eval_forward: Callable,
        val_tokens: torch.Tensor,
        luts: Any,
        shard: Any = None,
    ):
        self.plan, self.model, self.forward, self.luts = plan, model, eval_forward, luts
        self.shard = shard if shard is not None and not shard.single else None
        seq_len = plan.model.seq_len
        windows = max(1, min(plan.eval.periodic_tokens, val_tokens.numel() - 1) // seq_len)
        self.tokens = val_tokens[: windows * seq_len + 1]

    def __call__(self) -> Any:
        was_training = self.model.training
        self.model.eval()
        try:
            return run_eval(
                "standard",
                self.forward,
                self.tokens,
                self.luts,
                seq_len=self.plan.model.seq_len,
                stride=None,
                batch_size=self.plan.eval.batch_size,
                device=self.plan.device,
                autocast_dtype=autocast_dtype(self.plan.autocast),
                shard=self.shard,
            )
        finally:
            self.model.train(was_training)


class LoopExtras:
    def __init__(
        self,
        plan: Plan,
        run_dir: Path,
        *,
        stepper: Any,
        evaluator: PeriodicEval | None,
        meta: dict[str, Any],
        on_metrics: Callable[[dict[str, Any]], None],
        log_fn: Callable[[str], None] = log.info,
    ):
        self.plan, self.run_dir, self.stepper, self.evaluator = plan, Path(run_dir), stepper, evaluator
        self.meta, self.on_metrics, self.log = meta, on_metrics, log_fn
        self.world = getattr(stepper, "world", None) or SINGLE
        """On several ranks every decision here is the same on every rank: eval.every_steps counts the same steps,
        eval.every_seconds reads the loop's agreed clock (rank 0's), the evaluation is sharded and all-reduced."""
        self.stop = StopRequests()
        self.next_ckpt_wall = float("inf")
        """checkpoint.every_seconds's next wall-clock time; set by ``start`` when timed training begins."""
        self.next_eval_seconds = plan.eval.every_seconds or float("inf")
        self.last_eval_step: int | None = None
        self.last_ckpt: tuple[int, str | None] = (-1, None)
        self.seconds = 0.0
        """The loop's (agreed) train seconds at the last ``due``: what ``run`` decides on, so every rank agrees."""
        self.stop_level = NONE
        """The stop signals' request (preempt.NONE ... PREEMPT), the largest over the ranks at the last ``agree``."""
        self.stop_taken: list[int] = []
        """This rank's signals that stop_level was agreed on: StopRequests.act consumes those alone."""
        self.deferring_stops = False
        self.wall_due = False
        """checkpoint.every_seconds came due (on any rank's wall clock) at the last ``agree``."""

    # -- what the loop calls ---------------------------------------------------------------------------------
    def start(self) -> None:
        """The timed loop begins: checkpoint.every_seconds counts from here, not from construction, so that the
        warm-up's compile (two minutes on a GPU) does not make the first checkpoint come due at step 1."""
        every = self.plan.checkpoint.every_seconds
        self.next_ckpt_wall = time.monotonic() + every if every else float("inf")

    def deferring(self) -> Any:
        """Stop signals noted until the next step boundary (checkpoint.on_signal; off: the guard of a run of several
        ranks, or the default handler of one, stops at once)."""
        if not self.plan.checkpoint.on_signal:
            return contextlib.nullcontext()
        return self._deferring()

    @contextlib.contextmanager
    def _deferring(self) -> Iterator[None]:
        with self.stop.deferring(), self.world.stops_deferred():
            self.deferring_stops = True
            try:
                yield
            finally:
                self.deferring_stops = False

    def agree(self, seconds: float) -> float:
        """After every step: rank 0's train seconds, and this rank's stop request and checkpoint clock folded into
        the same collective (World.agree_with_flags), so a signal that reached any rank, or a checkpoint due by the
        wall clock, is acted on by every rank at this step boundary. One process: its own values."""
        wall = time.monotonic() >= self.next_ckpt_wall
        self.stop_taken = list(self.stop.pending)  # what this rank's level is made of (later signals wait)
        seconds, (level, wall_due) = self.world.agree_with_flags(
            seconds, [float(self.stop.level(self.stop_taken)), float(wall)]
        )
        self.stop_level, self.wall_due = int(level), bool(wall_due)
        return seconds

    def due(self, state: Any, seconds: float) -> bool:
        self.seconds = seconds
        return self.stop_level != NONE or self._eval_due(state, seconds) or self._ckpt_due(state)

    def run(self, state: Any) -> None:
        if self._eval_due(state, self.seconds):
            self.evaluate(state)
        if self._ckpt_due(state):
            self.save(state)
        if self.stop_level != NONE:
            level, self.stop_level = self.stop_level, NONE
            done = self.last_ckpt[1] if self.last_ckpt[0] == state.steps else None
            save = lambda: self.save(state) if self.plan.checkpoint.on_signal else None  # noqa: E731
            # raises unless it carries on
            self.stop.act(state.steps, done, save, level=level, handed_over=self.world.barrier, taken=self.stop_taken)
            if self.deferring_stops:
                self.world.stops_handled()

    def finish(self, state: Any) -> None:
        # a signal that came during the last step, after its boundary was checked (on any rank: agreed)
        self.stop_taken = list(self.stop.pending)
        self.stop_level = int(self.world.max(float(self.stop.level(self.stop_taken))) or NONE)
        if self.stop_level != NONE:
            self.run(state)
        if self.evaluator is not None and self.last_eval_step != state.steps:
            self.evaluate(state)
        if self.plan.checkpoint.periodic and self.last_ckpt[0] != state.steps:
            self.save(state)

    def warm(self) -> float:
        """One periodic evaluation before the clock starts, so its graphs compile in warm-up; returns seconds."""
        if self.evaluator is None:
            return 0.0
        t = time.perf_counter()
        self.evaluator()
        return time.perf_counter() - t

    # -- the work --------------------------------------------------------------------------------------------
    def _eval_due(self, state: Any, seconds: float) -> bool:
        if self.evaluator is None or self.last_eval_step == state.steps:
            return False
        every = self.plan.eval.every_steps
        return bool(every and state.steps % every == 0) or seconds >= self.next_eval_seconds

    def _ckpt_due(self, state: Any) -> bool:
        every = self.plan.checkpoint.every_steps
        return bool(every and state.steps % every == 0) or self.wall_due

    def evaluate(self, state: Any) -> None:
        assert self.evaluator is not None
        t = time.perf_counter()
        res = self.evaluator()
        seconds = time.perf_counter() - t
        state.val_seconds_periodic += seconds
        self.last_eval_step = state.steps
        if self.plan.eval.every_seconds:
            now = self.world.agree(state.train_seconds)  # rank 0's clock: the next due is the same on every rank
            while self.next_eval_seconds <= now:
                self.next_eval_seconds += self.plan.eval.every_seconds
        if self.world.rank == 0:  # rank 0 writes metrics.jsonl and run.log; the others hold the same numbers
            self.on_metrics(
                val_record(
                    state.steps, state.tokens, state.train_seconds, res.val_loss, res.val_bpb, res.tokens, seconds
                )
            )
            self.log(
                f"val    {state.steps:>6}  val_bpb {res.val_bpb:.4f}  val_loss {res.val_loss:.4f}  "
                f"({res.tokens:,} tokens, {seconds:.1f}s, not in train time)"
            )
        self._check_target(state, res)  # the same verdict on every rank: the result is all-reduced
        if PRUNE_CHECKS and self.plan.world_size == 1 and any(check(state.steps, res) for check in PRUNE_CHECKS):
            state.budget_end = "pruned"
            self.log(f"pruned at step {state.steps}: the sweep's study ends this trial here")

    def _check_target(self, state: Any, res: Any) -> None:
        """budget.target_*: the first evaluation at or below the target records where training got there (the
        loop then stops); state.train_seconds is the flush's, taken before the clock paused for this evaluation."""
        metric, target = self.plan.target_metric, self.plan.target_value
        if metric is None or state.target_steps is not None:
            return
        assert target is not None  # the resolver sets the target's metric and value together
        value = float(getattr(res, metric))
        if value <= target:
            state.target_steps, state.target_tokens, state.target_seconds = (
                state.steps,
                state.tokens,
                state.train_seconds,
            )
            self.log(
                f"target {metric} {value:.4f} <= {target:g} at step {state.steps}, {state.train_seconds:.2f} train "
                f"seconds: training stops here"
            )

    def save(self, state: Any) -> str:
        """Checkpoint this step boundary. On several ranks every rank calls it at the same step: each rank's RNG
        and data position are gathered, rank 0 writes the one file (its model and optimizers are every rank's,
        training.checkpoint) and broadcasts its path, so no rank goes on before the file is in place."""
        t = time.perf_counter()
        if self.world.single:
            try:
                path = self._write(state, None)
            except Exception as e:  # the record names what failed; the cause (a full disk) stays chained
                raise RuntimeError(f"the checkpoint of step {state.steps} could not be written: {e}") from e
        else:
            ranks = self.world.gather(rank_state(state))
            path = self._write_on_rank0(state, ranks)
        seconds = time.perf_counter() - t
        state.checkpoint_seconds += seconds
        self.last_ckpt = (state.steps, path)
        self.wall_due = False
        if self.plan.checkpoint.every_seconds:
            self.next_ckpt_wall = time.monotonic() + self.plan.checkpoint.every_seconds
        self.log(f"checkpoint at step {state.steps}: {path} ({seconds:.1f}s, not in train time)")
        return path

    def _write_on_rank0(self, state: Any, ranks: list[dict[str, Any]]) -> str:
        """Rank 0 writes; every rank gets the path, or rank 0's error, so that all stop alike when it fails (a
        full disk) rather than wait on a rank that left."""

        failed: list[Exception] = []

        def write() -> dict[str, str]:
            try:
                return {"path": self._write(state, ranks)}
            except Exception as e:  # noqa: BLE001 - raised on every rank just below
                failed.append(e)
                return {"error": f"{type(e).__name__}: {e}"}

        outcome = self.world.from_rank0(write)
        if "error" in outcome:  # rank 0 keeps the cause: a full disk is then told apart from a bug
            cause = failed[0] if failed else None
            raise RuntimeError(
                f"the checkpoint of step {state.steps} could not be written: {outcome['error']}"
            ) from cause
        return outcome["path"]

    def _write(self, state: Any, ranks: list[dict[str, Any]] | None) -> str:
        s = self.stepper
        payload = capture(s.model, s.optimizers, s.scaler, state, ema=getattr(s, "ema", None), ranks=ranks)
        meta = {
            **self.meta,
            "steps": state.steps,
            "tokens": state.tokens,
            "train_seconds": state.train_seconds,
            "last_eval_step": self.last_eval_step,
            "world_size": self.world.world_size,
            "saved_at": time.time(),
        }
        return str(save_checkpoint(self.run_dir, payload, meta, self.plan.checkpoint.keep))


def checkpoint_meta(
    config_tree: Any, overrides: list[str], plan: Plan, cwd: Path, code: str | None = None
) -> dict[str, Any]:
    """What a checkpoint's .json keeps for resume: the composed config, the job's overrides, the directory the job
    started in (for the record: a resume takes relative paths from its own), the Plan and the code fingerprint."""
    return {
        "config": config_tree,
        "overrides": list(overrides),
        "cwd": str(cwd),
        "code_fingerprint": code,
        "plan": json.loads(json.dumps(plan.to_dict())),
    }


def val_record(
    step: int, tokens: int, elapsed: float, val_loss: float, val_bpb: float, val_tokens: int, seconds: float
) -> dict[str, Any]:
    """A periodic validation's metrics.jsonl record: ``{"kind": "val", "step", "tokens", "val_loss", "val_bpb",
    "val_tokens", "elapsed_s", "val_seconds"}``."""
    return {
        "kind": "val",
        "step": step,
        "tokens": tokens,
        "val_loss": round(val_loss, 6),
        "val_bpb": round(val_bpb, 6),
        "val_tokens": val_tokens,
        "elapsed_s": round(elapsed, 3),
        "val_seconds": round(seconds, 3),
    }
