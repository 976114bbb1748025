"""The table of cards (speedrun.hardware.cards): each known card found by the name torch gives it, with its dense
peak FLOP/s (what MFU divides by); a card not in the table gets no peak, never a neighbour's."""

from __future__ import annotations

import pytest

from speedrun.hardware.cards import CARDS, card_for

# torch.cuda.get_device_name() of each card -> (table entry, dense bf16 TFLOP/s or fp16 where the card has no bf16)
NAMES = {
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 989.5),
    "NVIDIA H100 PCIe": ("H100 PCIe", 756),
    "NVIDIA H100 NVL": ("H100 NVL", 835.5),
    "NVIDIA H200": ("H200 SXM", 989.5),
    "NVIDIA H200 NVL": ("H200 NVL", 835.5),
    "NVIDIA A100-SXM4-40GB": ("A100 SXM 40GB", 312),
    "NVIDIA A100-SXM4-80GB": ("A100 SXM 80GB", 312),
    "NVIDIA A100-PCIE-40GB": ("A100 PCIe 40GB", 312),
    "NVIDIA A100 80GB PCIe": ("A100 PCIe 80GB", 312),
    "NVIDIA L4": ("L4", 121),
    "NVIDIA A10": ("A10", 125),
    "NVIDIA A10G": ("A10G", 70),
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 165.2),
    "NVIDIA GeForce RTX 5090": ("RTX 5090", 209.5),
    "Tesla V100-SXM2-16GB": ("V100 SXM2", 125),
    "Tesla V100-PCIE-32GB": ("V100 PCIe", 112),
    "Tesla T4": ("T4", 65),
    "NVIDIA B200": ("B200", 2250),
    "NVIDIA GB200": ("GB200", 2500),
}


@pytest.mark.parametrize("device_name,expected", NAMES.items())
def test_each_known_card_is_matched_by_its_torch_name(device_name, expected):
    card = card_for(device_name)
    assert card is not None and card.name == expected[0]
    assert card.peak_flops("bf16" if "bf16" in card.peak_tflops else "fp16") == expected[1] * 1e12


def test_cards_that_are_not_in_the_table_get_no_peak():
    # neighbours by name or capability, never their figures
    for name in (
        "NVIDIA RTX 6000 Ada Generation",
        "NVIDIA H100",
        "NVIDIA GH200 480GB",
        "NVIDIA A100X",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA L40S",
        "NVIDIA A40",
    ):
        assert card_for(name) is None, name
    assert all(card.peak_tflops["fp16"] > 0 for card in CARDS)
