"""A run's building: the data streams and the model with its optimizers, compiled, from plain settings. The shell
finds the dataset's files (building the embedded corpus, checking a user's shards) and the model's class (the
model.arch registry), then hands them here; warm-up and training follow (speedrun.core.train.fit).

The attention backend is looked up by name by the shell, once; the model never sees a backend string.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from speedrun.core.compile import CompilePlan, compile_model
from speedrun.core.data import (
    TOKENIZERS,
    ByteLUTs,
    DatasetPaths,
    TokenStream,
    load_val_bytes,
    load_val_tokens,
    read_header,
)
from speedrun.core.fp8 import convert_linears, convert_torchao
from speedrun.core.model import ModelShape
from speedrun.core.optim import OptimSettings, build_optimizers


@dataclass
class DataBundle:
    paths: DatasetPaths
    luts: ByteLUTs
    bos_id: int
    val_tokens: torch.Tensor
    train_batches: Callable[..., TokenStream]
    """train_batches(seq_len=None, micro_batch=None, position=0, rank=0, world_size=1): a deterministic stream of
    micro-batches from token ``position`` of the training shards (defaults: the run's longest length and its
    micro-batch); with rank/world_size, that rank's share of every span of world_size micro-batches."""
    train_tokens: int
    """Tokens in the training shards (to report how many passes a run made over them)."""


def open_data(
    paths: DatasetPaths,
    tokenizer_kind: str,
    tokenizer: str | None,
    *,
    seq_len: int,
    micro_batch: int,
    eval_tokens: int | None,
    include_tail: bool,
    device: str,
    log: Callable[[str], None],
) -> DataBundle:
    """The tokenizer's byte tables, the validation tokens (the first ``eval_tokens``; None: the whole split) and
    the training streams of the dataset at ``paths``."""
    luts, bos_id = TOKENIZERS[tokenizer_kind](paths, tokenizer)
    val_tokens = load_val_tokens(
        paths.val, eval_tokens, seq_len, vocab_size=paths.vocab_size, include_tail=include_tail
    )
    sidecar = load_val_bytes(paths, val_tokens.numel())  # CaseOps data: BPB on the original text's bytes
    if sidecar is not None:
        luts = dataclasses.replace(luts, sidecar=sidecar)
    log(
        f"data: {len(paths.train)} train shard(s), {val_tokens.numel() - 1:,} val tokens scored"
        f"{', bytes from the val byte sidecar' if sidecar is not None else ''}, "
        f"tokenizer {paths.tokenizer} (vocab {paths.vocab_size})"
    )
    pin = device == "cuda"

    def train_batches(
        seq_len: int = seq_len,
        micro_batch: int = micro_batch,
        position: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> TokenStream:
        stream = TokenStream(
            paths.train,
            seq_len,
            micro_batch,
            rank=rank,
            world_size=world_size,
            vocab_size=paths.vocab_size,
            pin_memory=pin,
        )
        stream.load_state_dict({"position": position})
        return stream

    return DataBundle(
        paths=paths,
        luts=luts,
        bos_id=bos_id,
        val_tokens=val_tokens,
        train_batches=train_batches,
        train_tokens=sum(read_header(p) for p in paths.train),
    )


def make_model(
    model_class: Callable[..., Any],
    shape: ModelShape,
    attention: Any,
    *,
    bos_id: int,
    document_mask: bool,
    fused_qkv: bool,
    options: dict[str, Any],
    fp8: tuple[str, ...],
    fp8_impl: str,
    device: str,
    optim: OptimSettings,
    ns_dtype: str,
    compiling: CompilePlan,
) -> tuple[Any, Any, Any, list]:
    """-> (model, train forward, eval forward returning per-token nats, optimizers). ``compiling``: whether and
    how torch.compile wraps it (speedrun.core.compile.compile_model)."""
    # bos_id switches on document masking in the model; only backends that can mask documents get it. doc_bos_id
    # is the token alone, for model levers that must not cross documents (model.smear_gate) whatever the mask.
    model = model_class(
        shape,
        attention,
        bos_id=bos_id if document_mask else None,
        fused_qkv=fused_qkv,
        doc_bos_id=bos_id,
        options=options,
    )
    if fp8:  # precision=fp8 resolves to every block linear; kernel.fp8 picks some
        (convert_torchao if fp8_impl == "torchao" else convert_linears)(model.blocks, fp8)
    model = model.to(device)
    optimizers = build_optimizers(model, optim, ns_dtype=torch.bfloat16 if ns_dtype == "bf16" else torch.float32)
    if compiling.compile:
        # Static shapes: one graph per context length, all compiled during warm-up (progressive schedules
        # switch lengths mid-run); raise dynamo's per-function cache limit so those graphs, plus eval's, fit.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    compiled, compiled_eval, mark_step = compile_model(model, compiling)

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if mark_step:  # inductor's CUDA graphs (compile_mode reduce-overhead / max-autotune): a new micro-batch
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(x, y)

    def eval_forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return compiled_eval(x, y, reduction="none")

    return model, forward, eval_forward, optimizers
