"""Acceptance judging for the report: multiple-comparison correction."""

from __future__ import annotations

import pytest

from speedrun.stats import holm


def test_holm_matches_hand_computed_example() -> None:
    # Sorted 0.01, 0.02, 0.04 times 3, 2, 1 give 0.03, 0.04, 0.04 (monotone).
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])


def test_holm_caps_at_one_and_keeps_order() -> None:
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([0.001]) == pytest.approx([0.001])
    assert holm([]) == []
