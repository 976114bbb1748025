"""TTT's hooks outside the blocks' linears (the head's adapter, ttt.targets with head; the attention's input
adapter, ttt.shared_attn_a) are refused by the Plan on a model class that lacks them, before any training, not
when TTT starts after it."""

from __future__ import annotations

import pytest

from speedrun.config import to_config
from speedrun.errors import PlanError
from speedrun.plan import resolve
from support.devices import fake_device

TINY = ["hardware=cpu", "model=tiny", "data.vocab_size=64", "budget.tokens_per_step=512"]
EXTERNAL = "model.arch=external.tiny_lm:TinyLM"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["ttt=record"], r"ttt.targets=record adapts the head.*drop head from ttt.targets"),
        (["ttt=lora", "ttt.targets='q,v,head'"], r"ttt.targets=q,v,head adapts the head"),
        (["ttt=lora", "ttt.shared_attn_a=true"], r"ttt.shared_attn_a=true hooks each block's attention input"),
    ],
)
def test_a_hook_the_model_lacks_is_refused_at_plan_time(compose, overrides, message):
    with pytest.raises(PlanError, match=message):
        resolve(to_config(compose([*TINY, EXTERNAL, *overrides])), fake_device("cpu"))
    # the built-in GPT has both hooks; the external model without them plans TTT on its linears
    resolve(to_config(compose([*TINY, *overrides])), fake_device("cpu"))
    resolve(to_config(compose([*TINY, EXTERNAL, "ttt=lora"])), fake_device("cpu"))
