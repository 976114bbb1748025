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
"""

from __future__ import annotations

import math
from collections.abc import Callable
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


def first_non_finite(records: list[dict[str, Any]]) -> int | None:
    """Index of the first record whose train_loss is not finite, or None."""
    return next((i for i, r in enumerate(records) if not math.isfinite(r["train_loss"])), None)


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
