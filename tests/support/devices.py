"""Fake devices for the resolver: a DetectedDevice for each hardware profile, as detect() reports it on that card."""

from __future__ import annotations

from speedrun.hardware.profiles import DetectedDevice, device_for


def fake_device(profile_name: str, name: str | None = None) -> DetectedDevice:
    """A DetectedDevice for a profile, as detect() would report it on that card (``name``: another card name); the
    cpu profile's is named "test cpu"."""
    return device_for(profile_name, name or ("test cpu" if profile_name == "cpu" else None))
