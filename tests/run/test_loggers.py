"""logger=wandb never fails a run: offline without a key or a server, a warning and off without wandb installed or
after a W&B error. A real offline sweep with it: tests/e2e/test_wandb_sweep.py."""

from __future__ import annotations

import logging
import os
import sys
import types
from pathlib import Path

import pytest

from speedrun.config import LoggerConfig
from speedrun.run.job import make_logger
from speedrun.run.wandb_logger import WandbLogger, artifact_files, artifact_metadata, resolve_wandb_mode

# ---------------------------------------------------------------------------------------------------------
# never fail, never block


def test_mode_auto_is_offline_without_a_key_or_a_server(monkeypatch, tmp_path):
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    assert resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    assert resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode("auto") is None  # the environment decides
    assert resolve_wandb_mode("online") == "online" and resolve_wandb_mode("offline") == "offline"
    with pytest.raises(ValueError, match="logger.mode"):
        resolve_wandb_mode("sometimes")


def _logger(tmp_path: Path) -> WandbLogger:
    lg = make_logger(LoggerConfig(name="wandb", mode="offline"), tmp_path, "sweep-1", "t")
    assert isinstance(lg, WandbLogger)
    return lg


def test_without_wandb_installed_the_logger_warns_and_stays_off(monkeypatch, tmp_path, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    lg = _logger(tmp_path)
    with caplog.at_level(logging.WARNING, logger="speedrun.logger"):
        lg.start({"seed": 0}, None)
        lg.log_metrics({"step": 1, "train_loss": 1.0})
        lg.log_result({"status": "ok"})
        lg.finish("ok")
    assert lg.run is None and "wandb is not installed" in caplog.text


def test_a_wandb_error_is_one_warning_then_the_logger_is_off(monkeypatch, tmp_path, caplog):
    calls = []

    class Run:
        dir = str(tmp_path / "files")
        summary: dict = {}

        def define_metric(self, *a, **k):
            pass

        def log(self, *a, **k):
            calls.append("log")
            raise RuntimeError("backend went away")

        def finish(self, **k):
            calls.append("finish")

    fake = types.SimpleNamespace(init=lambda **k: Run(), Settings=lambda **k: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    lg = _logger(tmp_path)
    with caplog.at_level(logging.WARNING, logger="speedrun.logger"):
        lg.start({}, None)
        lg.log_metrics({"step": 1, "train_loss": 1.0})
        lg.log_metrics({"step": 2, "train_loss": 0.9})
        lg.finish("ok")
    assert calls == ["log"] and caplog.text.count("backend went away") == 1 and lg.run is None

    def refuse(**k):
        raise TimeoutError("init timed out")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=refuse, Settings=lambda **k: None))
    lg = _logger(tmp_path)
    lg.start({}, None)  # no exception reaches the run
    assert lg.run is None and "init timed out" in caplog.text


def test_a_failed_artifact_upload_is_a_warning_and_the_wandb_run_still_finishes(monkeypatch, tmp_path, caplog):
    calls = []

    class Run:
        dir, id = str(tmp_path / "files"), "abc"
        summary: dict = {}

        def define_metric(self, *a, **k):
            pass

        def log_artifact(self, *a, **k):
            raise OSError("no space left on device")

        def finish(self, **k):
            calls.append("finish")

    class Artifact:
        def __init__(self, name, type, description, metadata):
            calls.append(name)

        def add_file(self, path, name):
            pass

    fake = types.SimpleNamespace(init=lambda **k: Run(), Settings=lambda **k: None, Artifact=Artifact)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    (tmp_path / "model.int8.zlib").write_bytes(b"weights")
    lg = _logger(tmp_path)
    with caplog.at_level(logging.WARNING, logger="speedrun.logger"):
        lg.start({}, None)
        lg.log_result({"status": "ok", "quant": "int8", "compressor": "zlib"})
        lg.finish("ok")
    # no train_gpt.py in the run dir (artifact.code_rule=raw): only the model is an artifact
    assert calls == ["model-abc", "finish"] and "no space left on device" in caplog.text


def test_the_artifacts_are_the_files_the_run_wrote(tmp_path):
    result = {"status": "ok", "quant": "int6", "compressor": "brotli", "val_bpb": 1.1, "stages": [1], "mfu": None}
    assert artifact_files(tmp_path, result) == []
    (tmp_path / "train_gpt.py").write_text("print()")
    (tmp_path / "model.int6.brotli").write_bytes(b"w")
    (tmp_path / "model.pt").write_bytes(b"float weights: not the artifact")
    assert artifact_files(tmp_path, result) == [
        ("model", tmp_path / "model.int6.brotli"),
        ("code", tmp_path / "train_gpt.py"),
    ]
    assert artifact_files(tmp_path, {**result, "quant": "off"}) == [("code", tmp_path / "train_gpt.py")]
    assert artifact_metadata({**result, "val_bpb": float("nan")}) == {
        "status": "ok",
        "quant": "int6",
        "compressor": "brotli",
    }
    assert artifact_metadata(result)["val_bpb"] == 1.1 and "stages" not in artifact_metadata(result)
