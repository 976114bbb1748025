"""What is scored and how: the eval group's windows and batch, and TTT's settings checked against the model, the
ranks and the device."""

from __future__ import annotations

import dataclasses

from speedrun.config import Config, TTTConfig
from speedrun.config.choices import EvalName, TTTName
from speedrun.core.model import ModelShape
from speedrun.core.ttt_lora import targets_of
from speedrun.errors import PlanError
from speedrun.hardware.profiles import HardwareProfile
from speedrun.plan.attention import capabilities
from speedrun.plan.types import EvalPlan


def resolve_eval(
    cfg: Config,
    profile: HardwareProfile,
    attn: str,
    model: ModelShape,
    micro_batch: int,
    micro_batch_search: bool = False,
) -> EvalPlan:
    e = cfg.eval
    if e.name == EvalName.sliding and e.stride is not None and e.stride > model.seq_len:
        raise PlanError(
            f"eval=sliding needs eval.stride <= model.seq_len={model.seq_len}, got {e.stride}; use e.g. eval.stride=64"
        )
    if e.document_isolated and not capabilities(attn).document_mask:
        raise PlanError(
            f"eval.document_isolated=true needs an attention backend with a document mask; attn={attn} "
            f"has none: use attn=flex (CUDA) or attn=math, or eval.document_isolated=false"
        )
    tokens = e.tokens  # None or 0: the whole split, on every card, so scores compare across cards
    label = str(e.name) if e.name != EvalName.sliding else f"sliding:{e.stride}"
    # a model trained with attn.document_mask keeps masking documents at eval too
    label += "+doc" if e.document_isolated or cfg.attn.document_mask else ""
    search = e.batch_size == "auto" or (e.batch_size is None and micro_batch_search)
    batch_size = micro_batch if e.batch_size in (None, "auto") else e.batch_size
    return EvalPlan(
        mode=str(e.name),
        stride=e.stride,
        document_isolated=e.document_isolated,
        tokens=tokens or None,
        batch_size=batch_size,
        label=label,
        batch_search=search,
        every_steps=e.every_steps,
        every_seconds=e.every_seconds,
        periodic_tokens=e.periodic_tokens,
        max_seconds=e.max_seconds,
        include_tail=e.include_tail,
    )


def resolve_ttt(
    ttt: TTTConfig, model: ModelShape, eval_batch: int, world_size: int, on_cuda: bool, hooks: tuple[str, ...] = ()
) -> TTTConfig:
    """``hooks``: what the model class lets TTT hook (its ``ttt_hooks``: speedrun.core.model.GPT's)."""
    if ttt.name == TTTName.off:
        return ttt
    if "head" in targets_of(ttt.targets) and "head" not in hooks:
        raise PlanError(
            f"ttt.targets={ttt.targets} adapts the head, and the model class has no head_adapter hook (its ttt_hooks "
            "lack 'head'; speedrun.core.model.GPT has one): drop head from ttt.targets, or use model.arch=gpt"
        )
    if ttt.shared_attn_a and "attention" not in hooks:
        raise PlanError(
            "ttt.shared_attn_a=true hooks each block's attention input, and the model class has no such hook (its "
            "ttt_hooks lack 'attention'; speedrun.core.model.GPT has one): set ttt.shared_attn_a=false, or use "
            "model.arch=gpt"
        )
    if ttt.cuda_graphs and not on_cuda:
        raise PlanError(
            "ttt.cuda_graphs=true replays TTT's steps from CUDA graphs and needs a CUDA GPU, which this machine "
            "does not have; use ttt.cuda_graphs=false (or leave it null: on with ttt.compile on a GPU)"
        )
    if ttt.cuda_graphs is None:  # compiled TTT on a GPU is launch-bound: replay its steps
        ttt = dataclasses.replace(ttt, cuda_graphs=on_cuda and ttt.compile)
    if ttt.warm_start_a and ttt.warm_start_chains < world_size:
        raise PlanError(
            f"ttt.warm_start_a carries A along ttt.warm_start_chains={ttt.warm_start_chains} chains of batches, each "
            f"on one rank: {world_size} ranks would leave {world_size - ttt.warm_start_chains} without TTT work; set "
            f"ttt.warm_start_chains={world_size} (or more), or ttt.warm_start_a=false"
        )
    chunks = ttt.chunk_sizes()
    if any(c > model.seq_len for c in chunks):
        raise PlanError(
            f"ttt chunk sizes {chunks} (ttt.chunk_size, ttt.short_chunks) must be in "
            f"1..model.seq_len={model.seq_len}; use smaller chunks"
        )
    return dataclasses.replace(ttt, batch_size=ttt.batch_size or eval_batch)
