"""A rough estimate of training memory, made by the resolver and recorded in the Plan (``memory_estimate_gb``).

It is an order of magnitude to set beside ``peak_mem_mb`` and an out-of-memory report, not a guarantee and not a
refusal (the resolver refuses only what it can bound: materialised attention scores). With P parameters, a
micro-batch of B sequences of T tokens, L layers of width d and vocabulary V:

    weights + grads + optimizer    16 P bytes   fp32 weights (4) and grads (4), up to two fp32 states (8: Adam)
    activations                    B T L d (8 + 3 mlp_mult) x 2 bytes (4 in fp32) kept for backward: per block
                                   about 8 d-wide tensors around attention (norm in/out, q, k, v, rotated q/k,
                                   attention out) and 3 of the MLP's width (fc out, ReLU, ReLU^2)
    logits                         B T V x 10 bytes (half-precision logits, their fp32 upcast, the softcap's output);
                                   with kernel.fused_ce only one chunk's rows at a time (speedrun.core.fused_ce)
    attention scores               what the backend says it materialises (math: B H T^2 L x 6), else 0

The micro-batch is taken at the longest context (tokens per micro-batch are constant across stages, so only the
scores grow with T). For pgolf_baseline it reads 9.4 GB, against a peak of 11.9 GB on an H100.
"""

from __future__ import annotations

from speedrun.core.model import ModelShape


def training_memory_bytes(
    model: ModelShape, micro_batch: int, precision: str, scores_bytes: int, params: int, logit_rows: int = 0
) -> int:
    """``logit_rows``: the rows of logits that exist at once (kernel.fused_ce's chunk), 0 for all the tokens."""
    tokens = micro_batch * model.seq_len
    act_bytes = 4 if precision == "fp32" else 2
    states = 16 * params
    # every layer call keeps its activations: a looped layer (model.loop) once per call
    activations = tokens * model.layer_passes(looped=True) * model.d_model * (8 + 3 * model.mlp_mult) * act_bytes
    logits = min(tokens, logit_rows or tokens) * model.vocab_size * 10
    return states + activations + logits + scores_bytes


def param_count(model: ModelShape) -> int:
    """Parameters of the GPT from its shape: the matmul weights, the embedding when untied (the tied one is the
    head, already counted), norms and scalars left out (a rounding error here)."""
    embed = 0 if model.tie_embeddings else model.vocab_size * model.d_model
    return model.matmul_params() + embed
