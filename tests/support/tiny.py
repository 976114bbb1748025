"""The tiny models of the unit tests and their data: the GPT shape (TINY; a test that needs another says how it
differs, ``replace(TINY, ...)``), parameter-golf's optimizer settings (PGOLF), a GPT built off its init
(tiny_gpt), byte tables and a stream of documents for evaluation and TTT."""

from __future__ import annotations

from dataclasses import replace

import torch

from speedrun.core.model import AttnOutGate, LayerLoop, ModelShape, SmearGate

BOS = 0
"""The documents' first token in the tiny streams."""

TINY = ModelShape(vocab_size=64, n_layer=2, d_model=32, n_head=4, n_kv_head=2, mlp_mult=2, seq_len=32)
"""A GPT that trains, evaluates and adapts in milliseconds on a CPU (tied embeddings, logits capped at 30)."""

TTT_TINY = replace(TINY, seq_len=24)
"""TINY at the context the TTT tests are written for: chunks of 8, documents of 20 to 51 tokens."""

QUANT_TINY = replace(TINY, seq_len=16)
"""TINY at the context of the quantization tests (their calibration batches: calibration_batches)."""

QUANT_TINY_RUN = [
    "model=tiny",
    "model.n_layer=2",
    "model.d_model=32",
    "model.n_head=4",
    "model.n_kv_head=2",
    "model.mlp_mult=2",
    "model.seq_len=16",
    "data.vocab_size=64",
    "hardware.micro_batch=4",
    "budget.tokens_per_step=64",
]
"""QUANT_TINY as a run's overrides (its vocabulary, one micro-batch of 4 a step): the Plan the finish is given."""

LEVERS_TINY = replace(TINY, n_layer=5)
"""TINY deep enough for the record's levers: the loop, the parallel lanes and XSA each take layers of their own."""

ALL_ON = replace(
    LEVERS_TINY,
    n_layer=6,
    mlp_act="leaky_relu2",
    rope_dims=4,
    ln_scale=True,
    qk_gain_init=5.0,
    xsa_last_n=6,
    skip_gates=True,
    loop=LayerLoop(start=1, end=2, num=2, enable_at=0.5),
    parallel_start_layer=4,
    smear_gate=SmearGate(window=8),
    attn_out_gate=AttnOutGate(window=8, scale=0.5, init_std=0.1),
)
"""Every lever on, at the record's settings scaled to a 6-layer model (loop 1-2 x3: 10 layer calls)."""

PGOLF = dict(
    matrix_lr=0.04,
    scalar_lr=0.04,
    embed_lr=0.6,
    tied_embed_lr=0.05,
    head_lr=0.008,
    muon_momentum=0.95,
    muon_backend_steps=5,
    beta1=0.9,
    beta2=0.95,
    eps=1e-8,
)
"""parameter-golf's optimizer settings: build_optimizers' learning rates, Muon's momentum and steps, Adam's betas."""


def tiny_gpt(shape: ModelShape = TINY, *, seed: int = 0, noise: float = 0.05, attention=None, **kwargs):
    """A GPT of ``shape`` (attention: sdpa's math kernel unless given; ``kwargs`` go to GPT), its weights drawn from
    ``seed`` and each nudged by ``noise`` x N(0, 1): off the init, whose zero output projections would hide what
    attention and the MLPs do (noise=0: the init itself)."""
    from speedrun.core.attention import get_backend
    from speedrun.core.model import GPT

    torch.manual_seed(seed)
    model = GPT(shape, attention or get_backend("sdpa", kernel="math"), **kwargs)
    if noise:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn_like(p))
    return model


def calibration_batches(n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of 4 x 16 random (input, target) tokens, none of them BOS: what GPTQ's Hessians are collected
    from in the quantization tests."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(1, 64, (4, 16), generator=g), torch.randint(1, 64, (4, 16), generator=g)) for _ in range(n)]


def byte_luts(vocab: int = 64):
    """ByteLUTs of a made-up tokenizer: 2 bytes a token, BOS none (and a boundary), every third token leading with a
    space."""
    from speedrun.core.data import ByteLUTs

    base = torch.full((vocab,), 2, dtype=torch.int16)
    base[BOS] = 0
    boundary = torch.zeros(vocab, dtype=torch.bool)
    boundary[BOS] = True
    return ByteLUTs(base, torch.arange(vocab) % 3 == 0, boundary)


def docs_stream(lengths, seed=0):
    """BOS + (length - 1) tokens per document, no BOS inside."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for n in lengths:
        parts += [torch.tensor([BOS]), torch.randint(1, 64, (n - 1,), generator=g)]
    return torch.cat(parts)
