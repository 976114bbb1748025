"""The Weights & Biases run logger (logger=wandb): one W&B run per job, the curves against training tokens, the
result as its summary, and the compressed model and train_gpt.py as artifacts."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import socket
from pathlib import Path
from typing import Any, Literal, TypeGuard
from urllib.parse import urlparse

from speedrun.artifact.code_count import WRAPPED_FILE
from speedrun.config import LoggerConfig
from speedrun.records.identity import file_sha256
from speedrun.run.loggers import RunLogger

log = logging.getLogger("speedrun.logger")

WandbInitMode = Literal["online", "offline", "disabled"]
"""The modes speedrun passes to wandb.init."""
_INIT_MODES: dict[str, WandbInitMode] = {"online": "online", "offline": "offline", "disabled": "disabled"}


class WandbLogger(RunLogger):
    """Weights & Biases: one W&B run per job, in ``<run dir>/wandb/``, grouped by sweep id.

    wandb is imported when the run starts, not before. ``logger.mode=auto`` runs online only with an API key
    (WANDB_API_KEY or ``wandb login``) and a reachable server, else offline (``wandb sync <run dir>/wandb/offline-run-*``
    later); WANDB_MODE, when set, decides instead. Any problem (no wandb, no network, a W&B error) is a warning
    in run.log and the logger turns itself off: it never fails the training run, and every wait is bounded.
    """

    INIT_TIMEOUT_S = 60.0
    PROBE_TIMEOUT_S = 3.0

    def __init__(self, settings: LoggerConfig, run_dir: Path, group: str | None, name: str):
        self.settings, self.run_dir, self.group, self.name = settings, run_dir, group, name
        self.run: Any = None
        self._last_step = 0

    def start(self, config: dict[str, Any], plan: dict[str, Any] | None) -> None:
        self._safely("start", self._start, config, plan)

    def log_metrics(self, record: dict[str, Any]) -> None:
        if self.run is not None:
            self._safely("log", self._log_metrics, record)

    def update_config(self, values: dict[str, Any]) -> None:
        if self.run is not None:
            self._safely("config", lambda v: self.run.config.update(v, allow_val_change=True), values)

    def log_result(self, result: dict[str, Any]) -> None:
        if self.run is not None:
            self._safely("summary", self._log_result, result)
        if self.run is not None:
            self._log_artifacts(result)

    def finish(self, status: str) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            self._safely("finish", self._finish, run, status)

    def _safely(self, what: str, fn: Any, *args: Any) -> None:
        """A W&B problem is a warning, after which the logger is off (not one warning per step)."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            log.warning("logger=wandb: %s failed (%s: %s); W&B logging is off for this run", what, type(e).__name__, e)
            self.run = None

    def _start(self, config: dict[str, Any], plan: dict[str, Any] | None) -> None:
        try:
            import wandb
        except ImportError:
            log.warning("logger=wandb: wandb is not installed (pip install -e '.[wandb]'); W&B logging is off")
            return
        mode = resolve_wandb_mode(self.settings.mode)
        # The run's id comes from its run dir, so a resumed run (resume=<run dir>) continues the same W&B run.
        kwargs: dict[str, Any] = dict(
            project=self.settings.project,
            entity=self.settings.entity,
            group=self.group,
            job_type="train",
            # W&B shows the group (the sweep) beside the name already: a sweep's job is its run name and job number
            name=f"{self.name}/{self.run_dir.name}" if self.group else self.run_dir.name,
            dir=str(self.run_dir),
            config={**config, "plan": plan, "settings": settings_of(plan)},
            id=wandb_run_id(self.run_dir),
            resume="allow",
        )
        try:
            self.run = wandb.init(mode=mode, settings=_settings(wandb, self.INIT_TIMEOUT_S), **kwargs)
        except Exception as e:  # noqa: BLE001 - e.g. a server that stopped answering: keep the record offline
            if mode == "offline":
                raise
            log.warning("logger=wandb: %s: %s; logging offline instead", type(e).__name__, e)
            mode = "offline"
            self.run = wandb.init(mode=mode, settings=_settings(wandb, self.INIT_TIMEOUT_S), **kwargs)
        define_metrics(self.run)
        if mode == "offline" or getattr(getattr(self.run, "settings", None), "mode", None) == "offline":
            log.info(
                "logger=wandb: offline run in %s (upload later: wandb sync %s)",
                Path(self.run.dir).parent,
                Path(self.run.dir).parent,
            )
        else:
            log.info("logger=wandb: %s", getattr(self.run, "url", None) or self.run.dir)

    def _log_metrics(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        step = max(int(step), self._last_step) if _is_number(step) else self._last_step
        self._last_step = step
        self.run.log({k: v for k, v in record.items() if _is_number(v)}, step=step)

    def _log_result(self, result: dict[str, Any]) -> None:
        self.run.summary.update(
            {k: v for k, v in result.items() if v is not None and (isinstance(v, (str, bool)) or _is_number(v))}
        )

    def _log_artifacts(self, result: dict[str, Any]) -> None:
        """The compressed model and train_gpt.py as W&B artifacts (types ``model`` and ``code``, named
        ``model-<run id>`` and ``code-<run id>``), each with the run's key numbers as metadata; a file the run did
        not write (quant=off, artifact.code_rule=raw, a run that ended before its export) is left out. A problem is
        a warning; the W&B run still finishes."""
        try:
            import wandb  # here, as in _start: only a run with logger=wandb needs it

            metadata = artifact_metadata(result)
            for kind, path in artifact_files(self.run_dir, result):
                art = wandb.Artifact(
                    f"{kind}-{self.run.id}",
                    type=kind,
                    description=ARTIFACT_DESCRIPTIONS[kind],
                    metadata={**metadata, "file": path.name, "sha256": file_sha256(path)},
                )
                art.add_file(str(path), name=path.name)
                self.run.log_artifact(art, aliases=["latest", str(result.get("status"))])
        except Exception as e:  # noqa: BLE001 - the run's record is written; W&B only misses its files
            log.warning("logger=wandb: logging the artifacts failed (%s: %s)", type(e).__name__, e)

    @staticmethod
    def _finish(run: Any, status: str) -> None:
        run.summary["status"] = status
        run.finish(exit_code=0 if status == "ok" else 1)


SETTINGS = (
    "hardware",
    "device_name",
    "emulated",
    "precision",
    "matmul_dtype",
    "attn",
    "attn_kernel",
    "compile",
    "micro_batch",
    "grad_accum",
    "tokens_per_step",
    "memory_cap_gb",
    "ns_dtype",
    "model_name",
)
"""Plan fields copied flat into the W&B config as ``settings.<key>`` (the kernel and hardware choices that ran),
so runs can be filtered and grouped by them without digging into the nested plan."""


ARTIFACT_DESCRIPTIONS = {
    "model": "the quantized, compressed weights (model.<quant>.<compressor>) the run scored as val_bpb_quant",
    "code": "the self-extracting train_gpt.py: `python train_gpt.py` re-runs the run (artifact_code_bytes)",
}

ARTIFACT_METADATA = (
    "status",
    "name",
    "val_bpb",
    "val_loss",
    "val_bpb_quant",
    "val_loss_quant",
    "val_bpb_ttt",
    "artifact_bytes",
    "artifact_model_bytes",
    "artifact_code_bytes",
    "artifact_code_rule",
    "artifact_code_sha256",
    "artifact_ok",
    "quant",
    "compressor",
    "steps",
    "tokens",
    "params",
    "train_seconds",
    "tokens_per_s",
    "hardware",
    "device_name",
    "precision",
    "attn_kernel",
    "seed",
    "sweep",
    "track",
    "track_ok",
    "eval_fingerprint",
    "tokenizer_sha256",
    "git_sha",
    "git_dirty",
    "code_fingerprint",
    "run_dir",
)
"""Result keys each W&B artifact carries as metadata: what it scored, its size, how it was trained and the code."""


def artifact_metadata(result: dict[str, Any]) -> dict[str, Any]:
    return {
        k: result[k]
        for k in ARTIFACT_METADATA
        if k in result and (result[k] is None or isinstance(result[k], (str, bool)) or _is_number(result[k]))
    }


def artifact_files(run_dir: Path, result: dict[str, Any]) -> list[tuple[str, Path]]:
    """(artifact type, file) for the run's compressed model and train_gpt.py, those that exist."""
    files = [("code", Path(run_dir) / WRAPPED_FILE)]
    if result.get("quant") and result.get("compressor"):
        files.insert(0, ("model", Path(run_dir) / f"model.{result['quant']}.{result['compressor']}"))
    return [(kind, path) for kind, path in files if path.is_file()]


def log_export(run_dir: Path, folder: Path, say: Any = log.info) -> bool:
    """``python -m speedrun.export``: the submission folder as a W&B artifact (type ``submission``) of the run it
    came from, when that run logged to W&B (its plan.json's logger); the same W&B run, resumed by its id. False
    when the run did not use W&B; a W&B problem is a warning (the folder is written either way)."""
    try:
        plan = json.loads((Path(run_dir) / "plan.json").read_text())
    except (OSError, ValueError):
        return False
    settings = plan.get("logger") or {}
    if settings.get("name") != "wandb":
        return False
    try:
        import wandb

        mode = resolve_wandb_mode(str(settings.get("mode") or "auto"))
        run = wandb.init(
            project=settings.get("project"),
            entity=settings.get("entity"),
            dir=str(run_dir),
            id=wandb_run_id(Path(run_dir)),
            resume="allow",
            mode=mode,
            settings=_settings(wandb, WandbLogger.INIT_TIMEOUT_S),
        )
        art = wandb.Artifact(
            f"submission-{wandb_run_id(Path(run_dir))}",
            type="submission",
            description="the parameter-golf submission folder python -m speedrun.export wrote from this run",
        )
        art.add_dir(str(folder))
        run.log_artifact(art, aliases=["latest"])
        run.finish()
    except Exception as e:  # noqa: BLE001 - W&B is a mirror: the folder on disk is the export
        log.warning("logger=wandb: logging the export folder failed (%s: %s)", type(e).__name__, e)
        return False
    say(f"logger=wandb: {folder} logged as a submission artifact of W&B run {wandb_run_id(Path(run_dir))}")
    return True


def settings_of(plan: dict[str, Any] | None) -> dict[str, Any]:
    return {k: plan.get(k) for k in SETTINGS if k in plan} if plan else {}


def wandb_run_id(run_dir: Path) -> str:
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def define_metrics(run: Any) -> None:
    """Every curve against training tokens (the x-axis that compares across cards and batch sizes); validation
    summarised by its minimum (the run's final summary then holds the final evaluation's values, see
    log_result); train_loss by its last value."""
    run.define_metric("tokens")
    for key in ("train_loss", "lr_mult", "elapsed_s", "tokens_per_s", "progress", "step"):
        run.define_metric(key, step_metric="tokens", summary="last")
    for key in ("val_bpb", "val_loss"):
        run.define_metric(key, step_metric="tokens", summary="min")


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _settings(wandb: Any, init_timeout: float) -> Any:
    """Settings that keep W&B out of the way: bounded waits, no console capture (run.log has it), quiet."""
    wanted = {"init_timeout": init_timeout, "finish_timeout": 120.0, "console": "off", "quiet": True}
    fields = getattr(wandb.Settings, "model_fields", None)
    if fields is not None:
        wanted = {k: v for k, v in wanted.items() if k in fields}
    return wandb.Settings(**wanted)


def resolve_wandb_mode(mode: str) -> WandbInitMode | None:
    """logger.mode -> the mode passed to wandb.init (None: WANDB_MODE from the environment decides)."""
    if mode in _INIT_MODES:
        return _INIT_MODES[mode]
    if mode != "auto":
        raise ValueError(f"logger.mode={mode}: choose auto, online, offline or disabled")
    if os.environ.get("WANDB_MODE"):
        return None
    base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    host = urlparse(base).hostname or "api.wandb.ai"
    if not _has_api_key(host):
        log.info("logger=wandb: no W&B API key (WANDB_API_KEY or `wandb login`): offline")
        return "offline"
    port = urlparse(base).port or (80 if base.startswith("http:") else 443)
    try:
        socket.create_connection((host, port), timeout=WandbLogger.PROBE_TIMEOUT_S).close()
    except OSError as e:
        log.info("logger=wandb: %s:%s unreachable (%s): offline", host, port, e)
        return "offline"
    return "online"


def _has_api_key(host: str) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc

    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False
