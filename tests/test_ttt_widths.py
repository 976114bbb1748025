"""How wide a TTT chunk step runs: eager steps pad to a power of two (kernels that plan per shape see few shapes),
compiled steps to a multiple of 64 (their graphs have dynamic shapes, so any width runs on the warm-up's graphs and
a power of two would only add padding). That compiled TTT scores what eager scores at such widths, without a
recompile: tests/test_ttt_score_first.py::test_compiled_ttt_scores_like_eager_with_its_warm_up_off_the_clock."""

from __future__ import annotations

import pytest

from speedrun.finishing import ttt as ttt_module


@pytest.mark.parametrize(
    ("n", "eager", "compiled"),
    [(1, 64, 64), (48, 64, 64), (64, 64, 64), (65, 128, 128), (129, 256, 192), (300, 512, 320), (513, 1024, 576),
     (1025, 2048, 1088), (2000, 2048, 2048), (2048, 2048, 2048)],
)  # fmt: skip
def test_step_width_pads_eager_to_powers_of_two_and_compiled_to_multiples_of_64(n, eager, compiled):
    assert ttt_module._step_width(n, 2048, compiled=False) == eager
    assert ttt_module._step_width(n, 2048, compiled=True) == compiled


def test_step_width_never_exceeds_the_context():
    assert ttt_module._step_width(20, 24, compiled=True) == ttt_module._step_width(20, 24, compiled=False) == 24
