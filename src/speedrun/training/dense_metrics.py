"""Dense training metrics without host syncs: per-step losses kept on the device, copied out in one transfer.

Every step's loss is copied into a slot of a small device buffer (an asynchronous device-side copy, so no step
waits for the host); the buffer is read with a single transfer when it is full (logger.flush_every_steps), at a
progress line, before a periodic validation or checkpoint, and at the end. That read is also where a non-finite
loss is noticed, so a divergence stops the run at most flush_every_steps steps late.

The copy into a preallocated slot, rather than keeping each step's loss tensor, is deliberate: a step replayed
from a CUDA graph returns the same output tensor every time, overwritten by the next replay.

metrics.jsonl records (one JSON object per line):

- train: ``{"step", "tokens", "train_loss", "lr_mult", "elapsed_s"}`` for every step (logger.dense=true) or for
  the last step of each flush (dense=false: about one per progress line); the record of a step that printed a
  progress line also has ``tokens_per_s`` and ``progress``. ``elapsed_s`` is train seconds as the host saw them
  when it queued the step (exact at progress lines, where the device is synchronised).
- validation (eval.every_steps / every_seconds): ``{"kind": "val", "step", "tokens", "val_loss", "val_bpb",
  "val_tokens", "elapsed_s", "val_seconds"}``.

Every flush hands the host every buffered step's loss (whatever logger.dense keeps in the file), so the divergence
verdict (``divergence``) sees each step without a sync of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


class LossBuffer:
    def __init__(self, device: str, capacity: int):
        self.capacity = capacity
        self._values = torch.zeros(capacity, dtype=torch.float32, device=device)
        self._meta: list[tuple[int, int, float, float]] = []  # step, tokens, lr_mult, elapsed_s

    @property
    def full(self) -> bool:
        return len(self._meta) >= self.capacity

    def __len__(self) -> int:
        return len(self._meta)

    def add(self, loss: torch.Tensor, step: int, tokens: int, lr_mult: float, elapsed: float) -> None:
        """Queue one step's loss (a device tensor); nothing waits for the device."""
        self._values[len(self._meta)].copy_(loss.detach(), non_blocking=True)
        self._meta.append((step, tokens, lr_mult, elapsed))

    def flush(self) -> list[dict[str, Any]]:
        """The buffered steps as train records, oldest first (one device-to-host transfer), and the buffer emptied."""
        if not self._meta:
            return []
        values = self._values[: len(self._meta)].tolist()
        records = [
            {
                "step": step,
                "tokens": tokens,
                "train_loss": value,
                "lr_mult": round(lr, 6),
                "elapsed_s": round(elapsed, 3),
            }
            for (step, tokens, lr, elapsed), value in zip(self._meta, values)
        ]
        self._meta.clear()
        return records


DIVERGENCE_MARGIN = 1.0
"""Nats the end-of-training loss may sit above its first loss or ln(vocab) before the run counts as diverged. A
fresh model starts near uniform (its first loss is about ln(vocab)) and a few steps on small batches move the loss
by half a nat either way (2 steps of 256 tokens, tests/run/test_run_outcomes.py: 6.93 -> 7.50), so a short run must not
be judged to the hundredth; a run that went wrong ends whole nats above (3 steps of pgolf_baseline on CPU: 6.9 ->
15.0)."""
EARLY_MARGIN = 4.0
"""The margin for a run judged before it has SMOOTH_STEPS steps after its first: the first few steps of a small
model at a full learning rate bounce by a nat or more (a 2 s CPU sweep job of the tiny preset: 6.92 -> 8.20 at step
2), while a blow-up is many nats (pgolf_baseline for 10 s on a CPU: 6.9 -> 15.0 in 3 steps)."""
SMOOTH_STEPS = 10
"""The end of training is judged on the mean of the last this many steps' losses (the first step excluded), and
on the last step's alone: both must be above, so neither one noisy last batch nor a spike just before it decides."""


@dataclass(frozen=True)
class Divergence:
    step: int
    """The first non-finite step, or for a run that ended badly its last step (where the verdict was taken)."""
    reason: str
    """One line, for the run's error."""


def non_finite(losses: Sequence[float], start_step: int = 1) -> Divergence | None:
    """The first step whose loss is not finite (``losses`` are consecutive steps from ``start_step``), or None."""
    bad = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
    if bad is None:
        return None
    return Divergence(start_step + bad, f"non-finite training loss ({losses[bad]}) at step {start_step + bad}")


def divergence(
    losses: Sequence[float],
    vocab_size: int,
    *,
    start_step: int = 1,
    first: tuple[int, float] | None = None,
) -> Divergence | None:
    """The divergence verdict on a run's training losses; None for a run that did not diverge.

    ``losses`` are consecutive steps' losses, oldest first, the first at ``start_step``, ending at the run's last
    step: the whole run, or (the training loop) its last SMOOTH_STEPS. ``first`` is (step, loss) of the run's first
    logged loss when ``losses`` does not begin with it.

    Diverged: a loss is not finite; or, at the end of a run of two steps or more, both the mean of the last
    SMOOTH_STEPS losses after the first step and the last loss are more than DIVERGENCE_MARGIN (EARLY_MARGIN in a
    run shorter than SMOOTH_STEPS steps after its first) above the first logged loss, or above ln(vocab_size)
    (uniform guessing). Only the end counts: a loss that rises for a while and
    comes back down is training.
    """
    found = non_finite(losses, start_step)
    if found is not None or not losses:
        return found
    first_step, first_loss = first if first is not None else (start_step, losses[0])
    end_step = start_step + len(losses) - 1
    after = [x for i, x in enumerate(losses) if start_step + i > first_step]
    if not after:  # one step: the end is the start, nothing trained yet to judge
        return None
    window = after[-SMOOTH_STEPS:]
    smoothed, last = sum(window) / len(window), window[-1]
    end = min(smoothed, last)
    uniform = math.log(vocab_size)
    margin = DIVERGENCE_MARGIN if len(after) >= SMOOTH_STEPS else EARLY_MARGIN
    rose, above_uniform = end > first_loss + margin, end > uniform + margin
    if not (rose or above_uniform):
        return None
    head = f"training loss rose from {first_loss:.4f} at step {first_step} to" if rose else "training loss ended at"
    if len(window) > 1:
        reason = f"{head} {smoothed:.4f} (mean of steps {end_step - len(window) + 1}-{end_step}, last {last:.4f})"
    else:
        reason = f"{head} {last:.4f} at step {end_step}"
    if above_uniform:
        reason += f", above ln({vocab_size}) = {uniform:.4f} (uniform guessing)"
    return Divergence(end_step, reason)


def progress_line(record: dict[str, Any], frac: float, train_seconds: float, log: Callable[[str], None]) -> None:
    """Add tokens_per_s and progress to the record of the step being reported, and print the progress line."""
    tok_s = record["tokens"] / train_seconds if train_seconds > 0 else 0.0
    eta = train_seconds / frac - train_seconds if 0 < frac < 1 else 0.0
    record.update(elapsed_s=round(train_seconds, 3), tokens_per_s=round(tok_s, 1), progress=round(min(frac, 1.0), 4))
    log(
        f"step {record['step']:>6}  loss {record['train_loss']:.4f}  lr x{record['lr_mult']:.2f}  {tok_s:,.0f} tok/s  "
        f"elapsed {train_seconds:.0f}s  eta {eta:.0f}s"
    )


def val_record(
    step: int, tokens: int, elapsed: float, val_loss: float, val_bpb: float, val_tokens: int, seconds: float
) -> dict[str, Any]:
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
