"""Build what a Plan describes: the shell's part (finding or building the dataset, the model class model.arch
names, a CPU run's threads) around speedrun.core.pipeline, which opens the data and builds the model.

The attention backend is looked up by name here, once; the model never sees a backend string.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from speedrun.core.attention import get_backend
from speedrun.core.optim import OptimSettings
from speedrun.core.pipeline import DataBundle, make_model, open_data
from speedrun.plan import Plan
from speedrun.plan.model_choice import check_instance, model_class
from speedrun.plan.settings import settings

log = logging.getLogger("speedrun")


def build_data(plan: Plan, log: Callable[[str], None]) -> DataBundle:
    """The Plan's dataset, found or built here (the shell's part), opened by speedrun.core.pipeline.open_data."""
    d = plan.data
    if d.path is None:
        # builds the corpus on first use; a re-run of a train_gpt.py always names its data (speedrun.rerun)
        from speedrun.data.prepare import ensure_embedded_dataset

        paths = ensure_embedded_dataset(Path(d.cache_dir), vocab_size=d.vocab_size)
    else:
        assert d.tokenizer is not None  # the resolver refuses a path without its tokenizer
        from speedrun.data.existing import open_dataset  # data.path set, a Plan's choice

        paths = open_dataset(Path(d.path), Path(d.tokenizer), d.vocab_size)
    return open_data(
        paths,
        d.tokenizer_kind,
        d.tokenizer,
        seq_len=plan.model.seq_len,
        micro_batch=plan.micro_batch,
        eval_tokens=plan.eval.tokens,
        include_tail=plan.eval.include_tail,
        device=plan.device,
        log=log,
    )


def build_attention(plan: Plan):
    """The attention backend, looked up by name once. Built before any data so that a kernel that cannot load
    (fa3 offline) fails in seconds."""
    return get_backend(plan.attn, **dict(plan.attn_options))


def build_model(plan: Plan, attention, bos_id: int):
    """-> (model, train forward, eval forward returning per-token nats, optimizers): the class model.arch names
    (the shell's registry), built by speedrun.core.pipeline.make_model."""
    built = make_model(
        model_class(plan.model_arch),
        plan.model,
        attention,
        bos_id=bos_id,
        document_mask=plan.document_mask,
        fused_qkv=plan.kernel.fused_qkv,
        fused_ce=plan.kernel.fused_ce_chunk,
        options=dict(plan.model_options),
        fp8=plan.kernel.fp8,
        fp8_impl=plan.kernel.fp8_impl,
        device=plan.device,
        optim=settings(OptimSettings, plan.optim),
        ns_dtype=plan.ns_dtype,
        compiling=plan,
    )
    check_instance(built[0], plan.model_arch)
    return built


def configure_torch(plan: Plan) -> dict[str, object]:
    """Seed, TF32, the memory cap and a CPU run's threads the Plan asks for, before anything is built; returns the
    result keys of what was chosen (cpu_threads, ...; empty on a GPU)."""

    torch.manual_seed(plan.seed)
    chosen: dict[str, object] = {}
    if plan.device == "cpu":
        from speedrun.hardware.threads import choose_threads  # a CPU run's alone
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
