"""At the end of a sweep run with logger=wandb: its leaderboard as a W&B Table and the report's plots as images, in
one extra W&B run of the sweep's group (job_type ``sweep-summary``, files in ``<sweep dir>/wandb/``).

Offline-safe like the job loggers: the mode is resolved the same way (offline without a key or server), and any
W&B problem is a warning, never a failed sweep.
"""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any

from speedrun.report.plots import make_plots
from speedrun.run.wandb_logger import WandbLogger, _settings, resolve_wandb_mode

log = logging.getLogger("speedrun.logger")


def table_data(csv_text: str) -> tuple[list[str], list[list[Any]]]:
    """summary.csv -> (columns, rows), numbers as numbers (a W&B Table sorts and plots those), empty cells None."""
    reader = list(csv.reader(io.StringIO(csv_text)))
    if not reader:
        return [], []
    columns, rows = reader[0], reader[1:]
    return columns, [[_number(v) for v in row] for row in rows]


def _number(value: str) -> Any:
    if value == "":
        return None  # an empty cell (no ok run, no test): a W&B column must not mix "" with numbers
    try:
        f = float(value)
    except ValueError:
        return value
    return int(f) if f.is_integer() and "." not in value and "e" not in value.lower() else f


def log_sweep_summary(
    sweep_dir: Path, sweep: str, logger_cfg: Any, csv_text: str, groups: Any, metric: str = "val_bpb"
) -> None:
    """Log the sweep's table and plots to W&B (logger_cfg: the sweep's LoggerConfig-like node)."""
    try:
        import wandb
    except ImportError:
        log.warning("logger=wandb: wandb is not installed; no sweep summary in W&B")
        return
    try:
        plots = make_plots(groups, _plots_dir(sweep_dir), metric)
        columns, rows = table_data(csv_text)
        run = wandb.init(
            mode=resolve_wandb_mode(str(logger_cfg.mode)),
            project=logger_cfg.project,
            entity=logger_cfg.entity,
            group=sweep,
            job_type="sweep-summary",
            name=f"{sweep}/summary",
            dir=str(sweep_dir),
            settings=_settings(wandb, WandbLogger.INIT_TIMEOUT_S),
        )
        # list(columns): a copy, which the checker accepts as wandb.Table's list[str | int] (list is invariant).
        payload: dict[str, Any] = {"leaderboard": wandb.Table(columns=list(columns), data=rows)}
        payload.update({f"plots/{name}": wandb.Image(str(path), caption=name) for name, path in plots.items()})
        run.log(payload)
        run.summary["n_combinations"] = len(rows)
        run.finish()
        log.info(
            "logger=wandb: sweep leaderboard (%d rows) and %d plot(s) logged in group %s", len(rows), len(plots), sweep
        )
    except Exception as e:  # noqa: BLE001 - the sweep's own summary is already on disk
        log.warning("logger=wandb: sweep summary failed (%s: %s)", type(e).__name__, e)


def _plots_dir(sweep_dir: Path) -> Path:
    path = Path(sweep_dir) / "plots"
    path.mkdir(parents=True, exist_ok=True)
    return path
