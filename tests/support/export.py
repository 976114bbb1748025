"""What the export tests share: the environment of a machine with torch but no speedrun (bare_env), and a finished
run dir as the export reads it (fake_run)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
import yaml

from speedrun.artifact.wrap import pack

SITE_PACKAGES = str(Path(torch.__file__).resolve().parents[1])
"""torch's (and omegaconf's, numpy's, sentencepiece's) site-packages. With `python -S` and only this on PYTHONPATH,
its .pth files are not read, so an editable install of speedrun (a .pth file) is not importable."""


def bare_env(**extra: str) -> dict[str, str]:
    """The environment of a machine with torch and the requirements but no speedrun."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": SITE_PACKAGES, "PYTHONUNBUFFERED": "1", **extra}


CONFIG = {
    "name": "r",
    "seed": 0,
    "model": {"arch": "gpt", "n_layer": 2},
    "optim": {"matrix_lr": 0.04},
    "data": {"name": "embedded", "path": None, "vocab_size": 1024},
    "quant": {"name": "int8", "compressor": "zlib", "cap_bytes": 16_000_000},
    "sweep": None,
}


def fake_run(
    root: Path, seed: int, status: str = "ok", artifact_ok: bool = True, result_extra: dict | None = None, **config
) -> Path:
    """A finished run dir as the export reads it: result.json (plus ``result_extra``; the code's bytes and sha256 as
    the run recorded them), run.log, its config (plus ``config``) in .hydra/config.yaml and a (tiny) train_gpt.py."""
    run = root / f"run{seed}"
    (run / ".hydra").mkdir(parents=True)
    tree = {**CONFIG, "seed": seed, **config}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(tree))
    data = pack("X = 1\n")
    (run / "train_gpt.py").write_bytes(data)
    (run / "run.log").write_text(f"seed {seed}\n")
    result = {
        "status": status,
        "error": None if status == "ok" else "RuntimeError: boom",
        "seed": seed,
        "val_bpb": 1.5,
        "val_loss": 3.0,
        "val_bpb_quant": 1.5 + seed / 100,
        "val_loss_quant": 3.0 + seed / 100,
        "artifact_model_bytes": 1000,
        "artifact_code_bytes": len(data),
        "artifact_code_sha256": hashlib.sha256(data).hexdigest(),
        "artifact_bytes": 1000 + len(data),
        "artifact_ok": artifact_ok,
        "steps": 10,
        "torch_version": torch.__version__,
        **(result_extra or {}),
    }
    (run / "result.json").write_text(json.dumps(result))
    return run
