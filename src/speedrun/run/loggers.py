"""Run loggers: where per-step metrics and the final result go besides metrics.jsonl and result.json.

A logger must never fail or block a training run: every call is guarded by the runner, and problems become
warnings in run.log. The Weights & Biases logger lives in speedrun.run.wandb_logger, imported only by a run that
chose it (logger=wandb, speedrun.run.job.make_logger), so an exported file of another run does not carry it.
"""

from __future__ import annotations

from typing import Any


class RunLogger:
    """The console logger: progress lines already go through `logging`, so there is nothing more to send."""

    def start(self, config: dict[str, Any], plan: dict[str, Any] | None) -> None:
        pass

    def log_metrics(self, record: dict[str, Any]) -> None:
        pass

    def update_config(self, values: dict[str, Any]) -> None:
        pass

    def log_result(self, result: dict[str, Any]) -> None:
        pass

    def finish(self, status: str) -> None:
        pass
