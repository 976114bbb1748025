"""A refusal's advice is itself accepted: every `use precision=...` or `use attn=...` that a refusal names, tried on
the same card, resolves (a T4 asked for fp8 was once told to use bf16, which its own check refuses). And a refusal
with two reasons says them as two (`needs X (t4 is sm75), and it runs Y only`)."""

from __future__ import annotations

import re

import pytest

from speedrun.config import to_config
from speedrun.errors import PlanError
from speedrun.plan import resolve
from support.devices import fake_device

# the cards that lack something (bf16, fp8, FA3's builds) and the requests they refuse; an H100 or B200 refuses
# none of these but fa3 at fp16, which the a100 case covers
CARDS = ["cpu", "t4", "a100"]
REQUESTS = [["precision=fp8"], ["precision=bf16"], ["attn=fa3"], ["attn=fa3", "precision=fp16"]]


def _refusal(compose, card: str, overrides: list[str]) -> str | None:
    try:
        resolve(to_config(compose([f"hardware={card}", "debug=smoke", *overrides])), fake_device(card))
    except PlanError as e:
        return str(e)
    return None


def _advice(message: str) -> list[tuple[str, str]]:
    """(key, value) pairs of the advice after the refusal's " - use ": precision=fp16 or fp32 -> both."""
    _, sep, advice = message.partition(" - use ")
    if not sep:
        return []
    key_values = re.findall(r"(attn|precision)=(\w+)", advice)
    key = key_values[0][0] if key_values else None
    bare = re.findall(r"\bor (\w+)\b", advice)  # "precision=fp16 (...) or fp32": fp32 is the same key's
    return key_values + [(key, v) for v in bare if key and v not in ("attn", "precision")]


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize("request_", REQUESTS, ids=" ".join)
def test_every_alternative_a_refusal_names_is_accepted_on_that_card(compose, card, request_):
    message = _refusal(compose, card, request_)
    if message is None:
        return  # accepted: nothing to advise
    advice = _advice(message)
    for key, value in advice:
        swapped = [o for o in request_ if not o.startswith(f"{key}=")] + [f"{key}={value}"]
        assert _refusal(compose, card, swapped) is None, f"{message!r} advises {key}={value}, refused on {card}"


def test_the_t4s_fp8_refusal_offers_what_a_t4_runs(compose):
    message = _refusal(compose, "t4", ["precision=fp8"])
    assert message is not None and "bf16" not in message.partition(" - use ")[2]
    assert {v for _, v in _advice(message)} == {"fp16", "fp32"}


def test_two_reasons_read_as_two(compose):
    message = _refusal(compose, "t4", ["attn=fa3", "precision=fp16"])
    assert message is not None
    assert "needs compute capability >= sm80 (t4 is sm75), and it runs bf16, fp8 only, not precision=fp16" in message
