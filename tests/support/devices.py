"""Fake devices for the resolver: a DetectedDevice for each hardware profile, as detect() reports it on that card."""

from __future__ import annotations

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
