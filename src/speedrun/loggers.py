"""Run loggers: where per-step metrics and the final result go besides metrics.jsonl and result.json.

A logger must never fail or block a training run: every call is guarded by the runner, and problems become
warnings in run.log.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .config import LoggerConfig


class RunLogger:
    """The console logger: progress lines already go through `logging`, so there is nothing more to send."""

    def start(self, config: dict[str, Any], plan: Optional[dict[str, Any]]) -> None:
        pass

    def log_metrics(self, record: dict[str, Any]) -> None:
        pass

    def log_result(self, result: dict[str, Any]) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


def make_logger(cfg: LoggerConfig, run_dir: Path, group: Optional[str], name: str) -> RunLogger:
    if cfg.name == "console":
        return RunLogger()
    raise ValueError(f"logger={cfg.name}: unknown; choose one of console")
