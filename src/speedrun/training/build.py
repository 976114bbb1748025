"""Build what a Plan describes: the data streams and the model with its attention backend and optimizers.

The attention backend is looked up by name here, once; the model never sees a backend string.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from speedrun.core.attention import get_backend
from speedrun.core.compile import compile_model
from speedrun.core.data import (
    TOKENIZERS,
    ByteLUTs,
    DatasetPaths,
    TokenStream,
    load_val_bytes,
    load_val_tokens,
    read_header,
)
from speedrun.core.optim import OptimSettings, build_optimizers
from speedrun.plan import Plan
from speedrun.plan.model_choice import check_instance, model_class
from speedrun.plan.settings import settings

log = logging.getLogger("speedrun")


@dataclass
class DataBundle:
    paths: DatasetPaths
    luts: ByteLUTs
    bos_id: int
    val_tokens: torch.Tensor
    train_batches: Callable[..., TokenStream]
    """train_batches(seq_len=None, micro_batch=None, position=0, rank=0, world_size=1): a deterministic stream of
    micro-batches from token ``position`` of the training shards (defaults: the plan's longest length and its
    micro-batch); with rank/world_size, that rank's share of every span of world_size micro-batches."""
    train_tokens: int
    """Tokens in the training shards (to report how many passes a run made over them)."""


def build_data(plan: Plan, log: Callable[[str], None]) -> DataBundle:
    d = plan.data
    if d.path is None:
        # builds the corpus on first use; a re-run of a train_gpt.py always names its data (speedrun.rerun)
        from speedrun.data.prepare import ensure_embedded_dataset

        paths = ensure_embedded_dataset(Path(d.cache_dir), vocab_size=d.vocab_size)
    else:
        assert d.tokenizer is not None  # the resolver refuses a path without its tokenizer
        from speedrun.data.existing import open_dataset  # data.path set, a Plan's choice (artifact.closure)

        paths = open_dataset(Path(d.path), Path(d.tokenizer), d.vocab_size)
    luts, bos_id = TOKENIZERS[d.tokenizer_kind](paths, d.tokenizer)
    seq_len = plan.model.seq_len
    val_tokens = load_val_tokens(
        paths.val, plan.eval.tokens, seq_len, vocab_size=paths.vocab_size, include_tail=plan.eval.include_tail
    )
    sidecar = load_val_bytes(paths, val_tokens.numel())  # CaseOps data: BPB on the original text's bytes
    if sidecar is not None:
        luts = dataclasses.replace(luts, sidecar=sidecar)
    log(
        f"data: {len(paths.train)} train shard(s), {val_tokens.numel() - 1:,} val tokens scored"
        f"{', bytes from the val byte sidecar' if sidecar is not None else ''}, "
        f"tokenizer {paths.tokenizer} (vocab {paths.vocab_size})"
    )
    pin = plan.device == "cuda"

    def train_batches(
        seq_len: int = seq_len,
        micro_batch: int = plan.micro_batch,
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


def build_attention(plan: Plan):
    """The attention backend, looked up by name once. Built before any data so that a kernel that cannot load
    (fa3 offline) fails in seconds."""
    return get_backend(plan.attn, **dict(plan.attn_options))


def build_model(plan: Plan, attention, bos_id: int):
    """-> (model, train forward, eval forward returning per-token nats, optimizers)."""
    # bos_id switches on document masking in the model; only backends that can mask documents get it. doc_bos_id
    # is the token alone, for model levers that must not cross documents (model.smear_gate) whatever the mask.
    model = model_class(plan.model_arch)(
        plan.model,
        attention,
        bos_id=bos_id if plan.document_mask else None,
        fused_qkv=plan.kernel.fused_qkv,
        doc_bos_id=bos_id,
        options=dict(plan.model_options),
    )
    check_instance(model, plan.model_arch)
    if plan.kernel.fp8:  # precision=fp8 resolves to every block linear; kernel.fp8 picks some
        from speedrun.core.fp8 import convert_linears, convert_torchao  # a Plan's choice (artifact.closure)

        (convert_torchao if plan.kernel.fp8_impl == "torchao" else convert_linears)(model.blocks, plan.kernel.fp8)
    model = model.to(plan.device)
    optimizers = build_optimizers(
        model,
        settings(OptimSettings, plan.optim),
        ns_dtype=torch.bfloat16 if plan.ns_dtype == "bf16" else torch.float32,
    )
    if plan.compile:
        # Static shapes: one graph per context length, all compiled during warm-up (progressive schedules
        # switch lengths mid-run); raise dynamo's per-function cache limit so those graphs, plus eval's, fit.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    compiled, compiled_eval, mark_step = compile_model(model, plan)

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if mark_step:  # inductor's CUDA graphs (compile_mode reduce-overhead / max-autotune): a new micro-batch
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(x, y)

    def eval_forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return compiled_eval(x, y, reduction="none")

    return model, forward, eval_forward, optimizers


def configure_torch(plan: Plan) -> dict[str, object]:
    """Seed, TF32, the memory cap and a CPU run's threads the Plan asks for, before anything is built; returns the
    result keys of what was chosen (cpu_threads, ...; empty on a GPU)."""
    import torch

    torch.manual_seed(plan.seed)
    chosen: dict[str, object] = {}
    if plan.device == "cpu":
        from speedrun.hardware.threads import choose_threads  # a CPU run's alone (artifact.closure)
        from speedrun.records.keys import thread_keys

        threads = choose_threads(plan.threads)
        torch.set_num_threads(threads.threads)
        chosen = thread_keys(threads)
        busy = threads.busy_line()
        if busy:
            log.warning(busy)
        else:
            log.info("torch trains on %d CPU thread(s) (%s)", threads.threads, threads.source)
    if plan.device == "cuda":
        # TF32 only where the profile has it: an emulated T4 keeps true fp32 matmuls, as the card would.
        tf32 = plan.matmul_dtype == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if plan.memory_cap_gb:
            total = torch.cuda.get_device_properties(0).total_memory
            fraction = min(1.0, plan.memory_cap_gb * 1e9 / total)
            torch.cuda.set_per_process_memory_fraction(fraction)
            log.info("memory capped to %.1f GB (%.3f of the device)", plan.memory_cap_gb, fraction)
    return chosen
