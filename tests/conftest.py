"""Shared fixtures: compose the real config tree, and fake devices for the resolver."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def compose():
    """compose(["attn=sdpa", ...]) -> DictConfig, from the real conf/ tree, as `python -m run` would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from speedrun.config import CONF_DIR, register_configs

    register_configs()

    def _compose(overrides=(), return_hydra_config=False):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)

    return _compose


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """data.cache_dir for CLI runs: the embedded dataset is built once per session (per vocabulary size), by the
    first run that needs it, and shared by tests/test_cli.py and tests/test_experiments.py."""
    return tmp_path_factory.mktemp("cache")


# What torch.cuda.get_device_name() says on each profile's card (the card table, speedrun.hardware.cards, matches these).
DEVICE_NAMES = {
    "t4": "Tesla T4",
    "a100": "NVIDIA A100-SXM4-80GB",
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
}


def fake_device(profile_name: str, name: str | None = None):
    """A DetectedDevice for a profile, as detect() would report it on that card (``name``: another card name)."""
    from speedrun.hardware.profiles import PROFILES, DetectedDevice

    p = PROFILES[profile_name]
    if p.device_type == "cpu":
        return DetectedDevice("cpu", "test cpu", None, 0.0, p)
    return DetectedDevice("cuda", name or DEVICE_NAMES[profile_name], p.capability, p.memory_gb, p)


def run_cli(args, cwd, timeout=300, env_extra=None):
    """Run `python -m run ...` in a subprocess (the real entry point) and return the CompletedProcess."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "run", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
