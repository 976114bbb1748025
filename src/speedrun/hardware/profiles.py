"""Hardware profiles as data, and detection of the device we are actually on.

A profile is a recipe: dtypes, kernels, batch sizes, memory cap. Its peak numbers (dense datasheet TFLOP/s) are
the emulated card's, for ``mfu_profile``; ``mfu`` divides by the peak of the card that actually ran, which comes
from the card table (speedrun.hardware.cards), not from here. Detection happens only when ``detect()`` is called, never
at import time.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TypedDict


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    """Profile id (also the hardware= option)."""
    family: str
    """Compute family: the profile whose kernels and recipe apply (an H200 is an h100)."""
    device_type: str
    """torch device type: cuda or cpu."""
    capability: tuple[int, int] | None
    """CUDA compute capability, None for CPU."""
    memory_gb: float
    """Usable device memory in GB (a T4 is 15)."""
    smem_per_sm_kb: int | None
    """Shared memory per SM, which bounds Triton block sizes."""
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s per matmul dtype (fp32, tf32, bf16, fp16, fp8); a dtype missing is unsupported."""
    bandwidth_tbps: float | None
    """Memory bandwidth in TB/s."""
    # Recommended defaults, used where the config leaves a field as None / auto.
    precision: str
    attn: str
    sdpa_kernel: str
    micro_batch_tokens: int
    """Tokens per micro-batch; micro_batch = micro_batch_tokens // seq_len."""
    model: str
    tokens_per_step: int
    train_seconds: float
    flex_blocks: tuple[int, int] = (128, 64)
    """Default (BLOCK_M, BLOCK_N) of flex attention's forward where tiles are not chosen per head_dim."""
    smem_per_block_kb: int | None = None
    """Shared memory one program (thread block) may use, with the opt-in Triton makes (None: smem_per_sm_kb).
    Without the opt-in a block gets 48 KB on every card."""
    flex_tiles_by_head_dim: bool = False
    """Choose flex's forward and backward tiles per head_dim from the shared-memory budget
    (speedrun.kernels.tiles.choose_tiles): for cards whose Triton defaults do not fit (sm75)."""
    name_patterns: tuple[str, ...] = field(default=())
    """Substrings of torch.cuda.get_device_name() that identify this GPU."""

    @property
    def has_bf16(self) -> bool:
        return "bf16" in self.peak_tflops

    def peak_flops(self, matmul_dtype: str) -> float | None:
        """Peak FLOP/s for a matmul dtype, or None if the profile has no figure (CPU)."""
        tflops = self.peak_tflops.get(matmul_dtype)
        return None if tflops is None else tflops * 1e12


class _Recipe(TypedDict):
    """The recommended-default fields of HardwareProfile that the GPU profiles share."""

    precision: str
    attn: str
    sdpa_kernel: str
    micro_batch_tokens: int
    model: str
    tokens_per_step: int
    train_seconds: float


_GPU_DEFAULTS = _Recipe(
    precision="bf16",
    attn="sdpa",
    sdpa_kernel="flash",
    micro_batch_tokens=65536,
    model="pgolf_baseline",
    tokens_per_step=524288,
    train_seconds=120.0,
)
# On sm90 SDPA's cuDNN kernel trains pgolf_baseline faster than flash (check attn_backends); A100 and B200 keep
# flash until measured.
_SM90_DEFAULTS: _Recipe = {**_GPU_DEFAULTS, "sdpa_kernel": "cudnn"}

PROFILES: dict[str, HardwareProfile] = {
    "cpu": HardwareProfile(
        name="cpu",
        family="cpu",
        device_type="cpu",
        capability=None,
        memory_gb=0.0,
        smem_per_sm_kb=None,
        peak_tflops={},
        bandwidth_tbps=None,
        precision="fp32",
        attn="sdpa",
        sdpa_kernel="flash",
        micro_batch_tokens=4096,
        model="tiny",
        tokens_per_step=4096,
        train_seconds=60.0,
    ),
    # T4: no bf16, no flash/cuDNN attention (sm75), 64 KB shared memory per SM -> fp16 + GradScaler,
    # SDPA's memory-efficient kernel, flex tiles chosen per head_dim to fit (speedrun.kernels.tiles).
    "t4": HardwareProfile(
        name="t4",
        family="t4",
        device_type="cuda",
        capability=(7, 5),
        memory_gb=15.0,
        smem_per_sm_kb=64,
        peak_tflops={"fp32": 8.1, "fp16": 65.0},
        bandwidth_tbps=0.32,
        precision="fp16",
        attn="sdpa",
        sdpa_kernel="efficient",
        micro_batch_tokens=8192,
        model="pgolf_baseline",
        tokens_per_step=65536,
        train_seconds=300.0,
        flex_blocks=(64, 32),
        name_patterns=("T4",),
        smem_per_block_kb=64,
        flex_tiles_by_head_dim=True,
    ),
    "a100": HardwareProfile(
        name="a100",
        family="a100",
        device_type="cuda",
        capability=(8, 0),
        memory_gb=80.0,
        smem_per_sm_kb=164,
        peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        bandwidth_tbps=2.0,
        name_patterns=("A100",),
        smem_per_block_kb=163,
        **_GPU_DEFAULTS,
    ),
    "h100": HardwareProfile(
        name="h100",
        family="h100",
        device_type="cuda",
        capability=(9, 0),
        memory_gb=80.0,
        smem_per_sm_kb=228,
        peak_tflops={"fp32": 67.0, "tf32": 495.0, "bf16": 989.0, "fp16": 989.0, "fp8": 1979.0},
        bandwidth_tbps=3.35,
        name_patterns=("H100",),
        smem_per_block_kb=227,
        **_SM90_DEFAULTS,
    ),
    # H200: H100 compute with more and faster memory. Detected, not a hardware= option of its own.
    "h200": HardwareProfile(
        name="h200",
        family="h100",
        device_type="cuda",
        capability=(9, 0),
        memory_gb=141.0,
        smem_per_sm_kb=228,
        peak_tflops={"fp32": 67.0, "tf32": 495.0, "bf16": 989.0, "fp16": 989.0, "fp8": 1979.0},
        bandwidth_tbps=4.8,
        name_patterns=("H200",),
        smem_per_block_kb=227,
        **_SM90_DEFAULTS,
    ),
    "b200": HardwareProfile(
        name="b200",
        family="b200",
        device_type="cuda",
        capability=(10, 0),
        memory_gb=180.0,
        smem_per_sm_kb=228,
        peak_tflops={"fp32": 80.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
        bandwidth_tbps=8.0,
        name_patterns=("B200",),
        smem_per_block_kb=227,
        **_GPU_DEFAULTS,
    ),
}

SELECTABLE = ("auto", "cpu", "t4", "a100", "h100", "b200")


@dataclass(frozen=True)
class DetectedDevice:
    """What is physically there."""

    device_type: str
    name: str
    capability: tuple[int, int] | None
    memory_gb: float
    profile: HardwareProfile
    """The profile that matches it (by name, else the nearest by capability)."""


def profile_for_gpu(name: str, capability: tuple[int, int], memory_gb: float) -> HardwareProfile:
    """The profile of a GPU: by its marketing name, else the nearest lower capability (with a warning)."""
    for profile in PROFILES.values():
        if any(p.lower() in name.lower() for p in profile.name_patterns):
            return profile
    gpus = sorted(
        ((p.capability, p) for p in PROFILES.values() if p.capability is not None and p.name == p.family),
        key=lambda cap_profile: cap_profile[0],
    )
    below = [p for cap, p in gpus if cap <= capability]
    nearest = below[-1] if below else gpus[0][1]
    warnings.warn(
        f"unknown GPU {name!r} (sm{capability[0]}{capability[1]}, {memory_gb:.0f} GB): using the nearest profile "
        f"{nearest.name!r} for its recipe; mfu is computed only for cards in speedrun.hardware.cards",
        stacklevel=2,
    )
    return nearest


def detect() -> DetectedDevice:
    """Probe the current device (CUDA device 0 as seen through CUDA_VISIBLE_DEVICES, else CPU)."""
    import torch

    if not torch.cuda.is_available():
        return DetectedDevice("cpu", _cpu_name(), None, 0.0, PROFILES["cpu"])
    props = torch.cuda.get_device_properties(0)
    capability = (props.major, props.minor)
    memory_gb = props.total_memory / 1e9
    return DetectedDevice("cuda", props.name, capability, memory_gb, profile_for_gpu(props.name, capability, memory_gb))


def _cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


DEVICE_NAMES = {
    "t4": "Tesla T4",
    "a100": "NVIDIA A100-SXM4-80GB",
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
}
"""What torch.cuda.get_device_name() says on each GPU profile's card; the card table (speedrun.hardware.cards)
matches each of them, so a plan made for one has the card's MFU peak."""


def device_for(profile_name: str, name: str | None = None) -> DetectedDevice:
    """A DetectedDevice for a profile, as detect() would report it on that profile's card (``name``: another card
    name): what `--plan` resolves for when this machine lacks the card, so a recipe can be checked before renting."""
    p = PROFILES[profile_name]
    if p.device_type == "cpu":
        return DetectedDevice("cpu", name or "cpu", None, 0.0, p)
    return DetectedDevice("cuda", name or DEVICE_NAMES[profile_name], p.capability, p.memory_gb, p)
