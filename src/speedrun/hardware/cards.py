"""Known GPU cards and their dense peak FLOP/s per matmul dtype, as data: the denominator of ``mfu``.

Kept apart from the hardware profiles (speedrun.hardware.profiles), which are recipes (dtypes, kernels, batch sizes, memory
caps): a profile says what to run, this table says how fast the card that actually ran can multiply. ``mfu``
always divides by the peak of the card that ran (matched by ``torch.cuda.get_device_name()``); a card that is not
in the table gets no peak, so ``mfu`` is null and a warning says so, never a neighbour's figure.

Figures are NVIDIA's datasheet numbers without sparsity (a datasheet's starred "with sparsity" figure halved), in
TFLOP/s. For GeForce cards they are the rates with FP32 accumulation (what torch's fp16/bf16 matmuls use; GeForce
runs FP16-accumulate at twice that). dtypes: fp32 (CUDA cores), tf32, bf16, fp16, fp8 (tensor cores); a dtype
missing is one the card has no tensor-core rate for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    name: str
    """Display name, recorded as ``card``."""
    pattern: str
    """Regular expression searched in the lower-cased torch device name (with '-' and '_' read as spaces)."""
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s per matmul dtype."""
    source: str
    """Where the figures come from."""

    def peak_flops(self, dtype: str) -> float | None:
        tflops = self.peak_tflops.get(dtype)
        return None if tflops is None else tflops * 1e12


def _peaks(
    fp32: float, tf32: float | None, half: float, fp8: float | None = None, bf16: bool = True
) -> dict[str, float]:
    out = {"fp32": fp32, "fp16": half}
    if tf32 is not None:
        out["tf32"] = tf32
    if bf16:
        out["bf16"] = half
    if fp8 is not None:
        out["fp8"] = fp8
    return out


# Order matters: the first pattern that matches wins, so the specific forms (NVL, PCIe, GB200) come before the
# names they contain. An H100 or H200 whose form factor the name does not say is unknown on purpose: SXM, PCIe
# and NVL differ by up to 30%.
CARDS: tuple[Card, ...] = (
    Card("H100 NVL", r"\bh100\b.*\bnvl\b", _peaks(60, 417.5, 835.5, 1670.5), "H100 NVL datasheet (per GPU)"),
    Card("H100 PCIe", r"\bh100\b.*\bpcie\b", _peaks(51, 378, 756, 1513), "H100 datasheet, PCIe column"),
    Card("H100 SXM", r"\bh100\b.*\b(sxm\d*|hbm3)\b", _peaks(67, 494.5, 989.5, 1979), "H100 datasheet, SXM column"),
    Card("H200 NVL", r"\bh200\b.*\bnvl\b", _peaks(60, 417.5, 835.5, 1670.5), "H200 datasheet, NVL column"),
    Card("H200 SXM", r"\bh200\b", _peaks(67, 494.5, 989.5, 1979), "H200 datasheet, SXM column"),
    Card("GB200", r"\bgb200\b", _peaks(80, 1250, 2500, 5000), "GB200 NVL72 datasheet, per GPU"),
    Card("B200", r"\bb200\b", _peaks(75, 1125, 2250, 4500), "HGX B200 datasheet, per GPU (1/8)"),
    Card("A100 SXM 80GB", r"\ba100\b.*\bsxm.*\b80gb\b", _peaks(19.5, 156, 312), "A100 datasheet"),
    Card("A100 SXM 40GB", r"\ba100\b.*\bsxm.*\b40gb\b", _peaks(19.5, 156, 312), "A100 datasheet"),
    Card(
        "A100 PCIe 80GB", r"\ba100\b.*(\b80gb\b.*\bpcie\b|\bpcie\b.*\b80gb\b)", _peaks(19.5, 156, 312), "A100 datasheet"
    ),
    Card(
        "A100 PCIe 40GB", r"\ba100\b.*(\b40gb\b.*\bpcie\b|\bpcie\b.*\b40gb\b)", _peaks(19.5, 156, 312), "A100 datasheet"
    ),
    Card("L4", r"\bl4\b", _peaks(30.3, 60, 121, 242.5), "L4 datasheet"),
    # A10G: AWS's variant; NVIDIA publishes no datasheet. Its tensor cores run at half the A10's rate (measured
    # bf16 matmuls top out near 70 TFLOP/s), so the A10's 125 would understate its MFU by half.
    Card("A10G", r"\ba10g\b", _peaks(31.2, 35, 70), "AWS G5 figures (no NVIDIA datasheet)"),
    Card("A10", r"\ba10\b", _peaks(31.2, 62.5, 125), "A10 datasheet"),
    Card("RTX 5090", r"\brtx 5090$", _peaks(104.8, 104.8, 209.5, 419), "RTX Blackwell whitepaper, FP32 accumulate"),
    Card("RTX 4090", r"\brtx 4090$", _peaks(82.6, 82.6, 165.2, 330.3), "Ada whitepaper, FP32 accumulate"),
    Card("V100S PCIe", r"\bv100s\b", _peaks(16.4, None, 130, bf16=False), "V100S datasheet"),
    Card("V100 SXM2", r"\bv100\b.*\bsxm2\b", _peaks(15.7, None, 125, bf16=False), "V100 datasheet, SXM2 column"),
    Card("V100 PCIe", r"\bv100\b.*\bpcie\b", _peaks(14, None, 112, bf16=False), "V100 datasheet, PCIe column"),
    Card("T4", r"\bt4\b", _peaks(8.1, None, 65, bf16=False), "T4 datasheet (FP16 mixed precision)"),
)


def _normal(device_name: str) -> str:
    return re.sub(r"[-_]+", " ", device_name.lower()).strip()


def card_for(device_name: str | None) -> Card | None:
    """The table's entry for a torch device name, or None for a card it does not know (and for None)."""
    if not device_name:
        return None
    name = _normal(device_name)
    return next((card for card in CARDS if re.search(card.pattern, name)), None)
