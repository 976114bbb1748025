"""The GPT of parameter-golf's baseline family.

Per block (pre-norm, no biases, parameter-free RMSNorm):
    x = resid_mix[0] * x + resid_mix[1] * x0            # learnable mix with the embedding x0
    x = x + attn_scale * attn(norm(x))                  # GQA, QK-norm, RoPE, per-head q gain
    x = x + mlp_scale * mlp(norm(x))                    # relu(x W_fc)^2 W_proj
The first half of the blocks ("encoder") pushes its outputs on a stack; each block of the second half first adds
skip_weights[i] * stack.pop() (U-Net style). Output projections (attn proj, mlp proj, untied lm_head) start at zero.
logits = softcap * tanh(logits / softcap), cross-entropy in fp32. ModelShape is what the GPT is built from
(the Plan records it); layers, the block, its attention and its MLP come before the model around them.

Record levers (ModelShape, config.training.ModelConfig), each off by default and then absent from the computation
(the model is today's, bit for bit): leaky_relu(x, slope)^2 in the MLP, partial RoPE (the first rope_dims channels
of each head), ln_scale (norm outputs x 1/sqrt(layer+1)), qk_gain_init, XSA in the last layers (the attention
output minus its component along the value vector), sigmoid gates on the skips, depth recurrence (model.loop:
layers start..end called 1 + num times while ``loop_active``, a Python switch the compiled graphs specialise on),
parallel residual lanes from a decoder layer, the SmearGate on the embedding (never across BOS) and the sparse
attention output gate. Their small parameters (gates, lane weights) are Adam "scalar" parameters, none an
nn.Linear: GPTQ, fp8 and TTT see the same linears as without them, and the int8/int6 export keeps them in float.

Parameter names follow parameter-golf's train_gpt.py (tok_emb, blocks.N.attn.c_q, ..., skip_weights,
lm_head) so state dicts and its name-based rules (control tensors kept in fp32 by the quantizer) carry over.
Weights are fp32 masters; run under torch.autocast for bf16/fp16 matmuls. Under bf16 autocast the residual
stream is bf16 (as in parameter-golf, whose model is cast to bf16); otherwise it stays fp32 (fp16's range is
too narrow for it). Norms, the q/k path before attention, the softcap and the loss are computed in fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.core import choice
from speedrun.core.attention import AttentionBackend, allowed_keys, document_ids
from speedrun.core.fused_ce import linear_softcap_ce

# ---- the shape --------------------------------------------------------------------------------------------------------
# The model's shape, resolved: one torch-free dataclass that the Plan records and the GPT is built from.
#
# The model group's schema (config.ModelConfig) leaves fields None for "take the preset's"; the resolver fills
# them and builds a ModelShape, whose checks run here, once.


@dataclass(frozen=True)
class LayerLoop:
    """Depth recurrence (model.loop): once on, layers start..end run 1 + num times in a row, weights shared."""

    start: int = 0
    end: int = 0
    num: int = 0
    """Extra passes over the segment; 0: off."""
    enable_at: float = 0.0
    """Fraction of the training budget at which the loop switches on."""

    @property
    def on(self) -> bool:
        return self.num > 0


@dataclass(frozen=True)
class SmearGate:
    """model.smear_gate: x_t += lambda * sigmoid(w . x_t[:window]) * x_{t-1} on the embedding, not across BOS."""

    window: int = 0
    """Embedding channels that drive the gate; 0: off."""


@dataclass(frozen=True)
class AttnOutGate:
    """model.attn_out_gate: y_h *= sigmoid(scale * W_h . x[:window]) per head and position, before attn.proj."""

    window: int = 0
    """Channels of the attention input that drive the gate; 0: off."""
    scale: float = 1.0
    init_std: float = 0.0
    """Std of W's normal init; 0: zeros (every gate 0.5 at init)."""


def _coerce(value: Any, cls: type) -> Any:
    """A nested lever as given (its config dataclass, a dict from plan.json, or the frozen type) -> cls."""
    if isinstance(value, cls):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return cls(**value)


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    mlp_mult: int
    seq_len: int
    """Longest sequence the model takes; RoPE tables are built for this length."""
    tie_embeddings: bool = True
    logit_softcap: float = 30.0
    """softcap * tanh(logits / softcap); 0 turns it off."""
    logit_rescale: bool = False
    """quant.logit_rescale: the softcap as two parameters, one for positive and one for negative logits, both at
    logit_softcap (the same logits until global TTT moves them)."""
    rope_base: float = 10000.0
    qk_norm: bool = True
    """RMSNorm on q and k per head, then a learnable per-head q gain (qk_gain_init)."""
    tied_embed_init_std: float = 0.005
    """Std of the token embedding's normal init when tied (untied: std 1, as nn.Embedding)."""
    qk_gain_init: float = 1.5
    """Initial value of the per-head q gain (after QK-norm)."""
    # parameter-golf's April 2026 record stack (records/track_10min_16mb/2026-04-29_*/train_gpt.py): every lever
    # below is off by default, and with all of them off the model is today's, bit for bit. The schema's docstrings
    # (config.training.ModelConfig) say what each one does.
    mlp_act: str = "relu2"
    """MLP activation: relu2 = relu(x)^2, leaky_relu2 = leaky_relu(x, mlp_leaky_slope)^2."""
    mlp_leaky_slope: float = 0.5
    rope_dims: int | None = None
    """Rotate only the first rope_dims channels of each head; None or 0: all of them."""
    ln_scale: bool = False
    """Scale the block norms' outputs by 1 / sqrt(layer + 1)."""
    xsa_last_n: int = 0
    """XSA in the last xsa_last_n layers; 0: none."""
    skip_gates: bool = False
    """Learned sigmoid gates on the U-Net skips: x = lerp(w * skip, x, sigmoid(g))."""
    loop: LayerLoop = LayerLoop()
    parallel_start_layer: int | None = None
    """Two residual lanes (attention and MLP in parallel) from this layer; None or 0: off."""
    parallel_final_lane: str = "mean"
    smear_gate: SmearGate = SmearGate()
    attn_out_gate: AttnOutGate = AttnOutGate()

    def __post_init__(self) -> None:
        object.__setattr__(self, "loop", _coerce(self.loop, LayerLoop))
        object.__setattr__(self, "smear_gate", _coerce(self.smear_gate, SmearGate))
        object.__setattr__(self, "attn_out_gate", _coerce(self.attn_out_gate, AttnOutGate))
        object.__setattr__(self, "mlp_act", str(self.mlp_act))  # a config Choice -> its plain string
        object.__setattr__(self, "parallel_final_lane", str(self.parallel_final_lane))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def block_matmul_params(self) -> int:
        """Weights of one block's matmuls (q, k, v, attn proj, MLP fc and proj)."""
        kv = self.n_kv_head * self.head_dim
        attn = self.d_model * (self.d_model + 2 * kv) + self.d_model * self.d_model
        mlp = 2 * self.mlp_mult * self.d_model * self.d_model
        return attn + mlp

    def matmul_params(self) -> int:
        """Weights of the block matmuls plus the lm_head (counted even when tied): what 6 x N FLOPs counts."""
        return self.n_layer * self.block_matmul_params() + self.vocab_size * self.d_model

    def layer_passes(self, looped: bool = False) -> int:
        """Block calls per forward: n_layer, plus loop.num x (loop.end - loop.start + 1) while the loop is on."""
        extra = self.loop.num * (self.loop.end - self.loop.start + 1) if looped and self.loop.on else 0
        return self.n_layer + extra

    def layer_order(self, looped: bool = False) -> tuple[list[int], list[int]]:
        """(encoder, decoder) layer indices in the order the forward calls them. Off: the first n_layer // 2 layers
        push U-Net skips, the rest pop them. Looped (the record's encoder_indices / decoder_indices): layers
        0..start-1, then start..end 1 + num times, then end+1..n_layer-1, split at half of that sequence."""
        if not (looped and self.loop.on):
            return list(range(self.n_layer // 2)), list(range(self.n_layer // 2, self.n_layer))
        lp = self.loop
        order = list(range(lp.start)) + list(range(lp.start, lp.end + 1)) * (lp.num + 1)
        order += list(range(lp.end + 1, self.n_layer))
        half = len(order) // 2
        return order[:half], order[half:]

    def flops_per_token(self, seq_len: int, looped: bool = False) -> int:
        """Training FLOPs per token at context ``seq_len``: 6 x (P x block_matmul_params + vocab x d_model) +
        12 x P x d_model x seq_len, P = layer_passes(looped) (n_layer, more while model.loop is on: a looped layer
        costs each pass). Attention scores and values, no causal halving: the nanochat/autoresearch convention used
        for MFU. The record levers' gates, XSA and norms are elementwise or tiny and not counted."""
        passes = self.layer_passes(looped)
        matmul = passes * self.block_matmul_params() + self.vocab_size * self.d_model
        return 6 * matmul + 12 * passes * self.d_model * seq_len


# ---- parameter-free pieces --------------------------------------------------------------------------------------------
# The GPT's parameter-free pieces, as plain functions with a reference test each: RMSNorm, RoPE (full and
# partial), XSA.


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dim, computed in fp32, returned in x's dtype."""
    return F.rms_norm(x.float(), (x.size(-1),)).to(x.dtype)


def rope_tables(
    seq_len: int, head_dim: int, base: float, rope_dims: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (seq_len, rd // 2), fp32, rd = rope_dims or head_dim: the frequencies are spread over the
    rotated channels (the record's Rotary(rope_dims=16): inv_freq = 1 / base^(arange(0, rd, 2) / rd))."""
    rd = rope_dims or head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) by position; halves convention (x1 = first D/2 dims), as parameter-golf."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dims: int) -> torch.Tensor:
    """Rotate the first rope_dims channels of (B, H, T, D) (halves convention within them), pass the rest through
    (the record's apply_rotary_emb with rope_dims > 0). rope_dims >= D is apply_rope."""
    if rope_dims >= x.size(-1):
        return apply_rope(x, cos, sin)
    return torch.cat((apply_rope(x[..., :rope_dims], cos, sin), x[..., rope_dims:]), dim=-1)


def xsa(y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """XSA (the record's _xsa_efficient): y (B, H, T, D) attention output, v (B, Hkv, T, D) values; returns
    y - (y . v_hat) v_hat per head and position, v_hat = v / |v| of the head's KV group (query head h reads KV head
    h // (H // Hkv), as GQA's repeat_interleave). Computed in fp32, returned in y's dtype."""
    B, H, T, D = y.shape
    hkv = v.size(1)
    yg = y.float().reshape(B, hkv, H // hkv, T, D)
    vn = F.normalize(v.float(), dim=-1).unsqueeze(2)
    return (yg - (yg * vn).sum(dim=-1, keepdim=True) * vn).reshape(B, H, T, D).to(y.dtype)


# ---- the block --------------------------------------------------------------------------------------------------------
# A block of the built-in GPT (GPT below), and its attention and MLP: pre-norm, no biases, GQA with
# QK-norm, RoPE and a per-head q gain, relu^2 MLP, each block's outputs scaled and mixed with the embedding. The
# record levers a block carries (leaky relu^2, partial RoPE, ln_scale, XSA, the attention output gate, parallel
# residual lanes) are off by default; gpt.py's docstring says what each does. ``Columns`` is a forward at some
# columns only (GPT.forward's pick).


def bias_free_linear(d_in: int, d_out: int, zero_init: bool = False) -> nn.Linear:
    layer = nn.Linear(d_in, d_out, bias=False)  # default init: U(-1/sqrt(d_in), 1/sqrt(d_in)), as theirs
    if zero_init:
        nn.init.zeros_(layer.weight)
    return layer


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: ModelShape, attention: AttentionBackend, fused_qkv: bool = False, use_xsa: bool = False):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = shape.n_head, shape.n_kv_head, shape.head_dim
        kv_dim = shape.n_kv_head * shape.head_dim
        self.split = (shape.d_model, kv_dim, kv_dim)
        self.fused_qkv = fused_qkv
        """In training mode, q, k and v come from one matmul over their concatenated weights (kernel.fused_qkv): the
        input is read once, and the backward's input gradient is one GEMM instead of three plus two adds (yet it is
        no faster on an H100, check ``kernel_fused_qkv``, so it is off unless asked for). The three Linear modules
        stay (their names, Muon's matrices, fp8, GPTQ's hooks and TTT's adapters see them); eval mode, which GPTQ,
        TTT and evaluation use, always calls them one by one."""
        self.c_q = bias_free_linear(shape.d_model, shape.d_model)
        self.c_k = bias_free_linear(shape.d_model, kv_dim)
        self.c_v = bias_free_linear(shape.d_model, kv_dim)
        self.proj = bias_free_linear(shape.d_model, shape.d_model, zero_init=True)
        self.qk_norm = shape.qk_norm
        if shape.qk_norm:
            self.q_gain = nn.Parameter(torch.full((shape.n_head,), shape.qk_gain_init, dtype=torch.float32))
        self.attention = attention  # a plain object, not a module: no parameters, not in state_dict
        self.rope_dims = shape.rope_dims or shape.head_dim
        self.use_xsa = use_xsa
        gate = shape.attn_out_gate
        self.gate_window, self.gate_scale = gate.window, gate.scale
        if gate.window:
            # the record's sparse attention gate (attn_gate_w, (n_head, window)): a Parameter, not an nn.Linear, so
            # GPTQ, fp8 and TTT leave it alone and the export keeps it in float
            w = torch.zeros(shape.n_head, gate.window)
            if gate.init_std > 0:
                nn.init.normal_(w, mean=0.0, std=gate.init_std)
            self.attn_gate_w = nn.Parameter(w)
        self.adapter: nn.Module | None = None
        """Low-rank deltas from this attention's input, set only on TTT's own copy of the model (speedrun.core.
        ttt_lora.InputAdapters, ttt.shared_attn_a): ``adapter(x, at)`` -> the deltas of q, k, v and of the output
        (None where there is no adapter), q's and the output's at ``at``'s columns. Its adapters share one
        product with the input, where adapters wrapped around c_q, c_k, c_v and the whole attention each take
        their own."""

    def _adapted(self, x: torch.Tensor, at: Columns | None, q, k, v):
        """q, k, v plus the adapter's deltas, and the output's delta (None without an adapter)."""
        if self.adapter is None:
            return q, k, v, None
        dq, dk, dv, out = self.adapter(x, at)
        q, k, v = (y if d is None else y + d.to(y.dtype) for y, d in ((q, dq), (k, dk), (v, dv)))
        return q, k, v, out

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: object, at: Columns | None = None
    ) -> torch.Tensor:
        if at is not None:
            return self._forward_at(x, cos, sin, at)
        B, T, C = x.shape
        if self.fused_qkv and self.training:
            # the concatenated weight is rebuilt every call (0.5-1 MB here): no second copy of the weights to keep
            # in step with the optimizer, and autograd splits its gradient back onto c_q, c_k and c_v
            weight = torch.cat((self.c_q.weight, self.c_k.weight, self.c_v.weight))
            q, k, v = F.linear(x, weight).split(self.split, dim=-1)
        else:
            q, k, v = self.c_q(x), self.c_k(x), self.c_v(x)
        q, k, v, delta_out = self._adapted(x, None, q, k, v)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        dtype = v.dtype  # the matmul dtype (bf16/fp16 under autocast)
        # norm, rotation and gain in fp32 (one fused kernel under compile), then back to the matmul dtype
        q, k = q.float(), k.float()
        if self.qk_norm:
            q = F.rms_norm(q, (self.head_dim,))
            k = F.rms_norm(k, (self.head_dim,))
        if self.rope_dims == self.head_dim:
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        else:
            q = apply_partial_rope(q, cos, sin, self.rope_dims)
            k = apply_partial_rope(k, cos, sin, self.rope_dims)
        if self.qk_norm:
            q = q * self.q_gain[None, :, None, None]
        y = self.attention(q.to(dtype), k.to(dtype), v, ctx)
        if self.use_xsa:
            y = xsa(y, v)
        if self.gate_window:
            # y_h *= sigmoid(scale * W_h . x[:window]) per position (the record's sparse_attn_gate)
            g = torch.sigmoid(self.gate_scale * F.linear(x[..., : self.gate_window], self.attn_gate_w))
            y = y * g.transpose(1, 2).unsqueeze(-1).to(y.dtype)
        y = self.proj(y.transpose(1, 2).reshape(B, T, C))
        return y if delta_out is None else y + delta_out.to(y.dtype)

    def _forward_at(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, at: Columns) -> torch.Tensor:
        """The output at ``at``'s columns only, (B, G, C): keys and values from every position of x (B, T, C),
        queries, the output gate and the projection at the picked ones. The same arithmetic as forward followed
        by a gather, with the causal (and window, document) mask as at.mask instead of the backend's kernel."""
        B, T, C = x.shape
        G = at.cols.size(1)
        xp = at.gather(x)
        q, k, v, delta_out = self._adapted(x, at, self.c_q(xp), self.c_k(x), self.c_v(x))
        q = q.view(B, G, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        dtype = v.dtype
        q, k = q.float(), k.float()
        if self.qk_norm:
            q = F.rms_norm(q, (self.head_dim,))
            k = F.rms_norm(k, (self.head_dim,))
        # each picked query at its own position: the tables' rows gathered, (B, 1, G, rd // 2) against q's heads
        cos_q, sin_q = cos[at.cols].unsqueeze(1), sin[at.cols].unsqueeze(1)
        if self.rope_dims == self.head_dim:
            q, k = apply_rope(q, cos_q, sin_q), apply_rope(k, cos, sin)
        else:
            q = apply_partial_rope(q, cos_q, sin_q, self.rope_dims)
            k = apply_partial_rope(k, cos, sin, self.rope_dims)
        if self.qk_norm:
            q = q * self.q_gain[None, :, None, None]
        # each KV head's query heads side by side along the query axis, (B, Hkv, group * G, D) with the mask
        # repeated to match: GQA without a copy of K and V per query head (query head h reads KV head h // group)
        group = self.n_head // self.n_kv_head
        mask = at.mask.repeat(1, 1, group, 1) if group > 1 else at.mask
        qg = q.to(dtype).reshape(B, self.n_kv_head, group * G, self.head_dim)
        y = F.scaled_dot_product_attention(qg, k.to(dtype), v, attn_mask=mask)
        y = y.reshape(B, self.n_head, G, self.head_dim)  # not view: a GPU kernel's output may be strided
        if self.use_xsa:  # each query's own value vector: v at the picked columns
            y = xsa(y, v.gather(2, at.cols[:, None, :, None].expand(-1, self.n_kv_head, -1, self.head_dim)))
        if self.gate_window:
            g = torch.sigmoid(self.gate_scale * F.linear(xp[..., : self.gate_window], self.attn_gate_w))
            y = y * g.transpose(1, 2).unsqueeze(-1).to(y.dtype)
        y = self.proj(y.transpose(1, 2).reshape(B, G, C))
        return y if delta_out is None else y + delta_out.to(y.dtype)


class Columns(NamedTuple):
    """Some columns of each row (GPT.forward's ``pick``): ``cols`` (B, G) their indices, ``mask`` (B, 1, G, T)
    True where the query at that column may attend a key (causal; within the backend's window and the document
    when it masks them)."""

    cols: torch.Tensor
    mask: torch.Tensor

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) at the columns: (B, G, C)."""
        return x.gather(1, self.cols[..., None].expand(-1, -1, x.size(-1)))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.fc = bias_free_linear(shape.d_model, shape.mlp_mult * shape.d_model)
        self.proj = bias_free_linear(shape.mlp_mult * shape.d_model, shape.d_model, zero_init=True)
        self.leaky_slope = shape.mlp_leaky_slope if shape.mlp_act == "leaky_relu2" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.leaky_slope is None:
            return self.proj(torch.relu(self.fc(x)).square())
        return self.proj(F.leaky_relu(self.fc(x), self.leaky_slope).square())  # the record's LeakyReLU(0.5)^2


class Block(nn.Module):
    # 1-D/0-D and mixing parameters: Adam, kept fp32; everything else in a block is a matrix for Muon.
    CONTROL = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "attn_gate_w", "lane_resid", "lane_post")
    ln_scale: torch.Tensor | None
    lane_resid: nn.Parameter
    lane_post: nn.Parameter

    def __init__(self, shape: ModelShape, attention: AttentionBackend, fused_qkv: bool = False, layer: int = 0):
        super().__init__()
        self.attn = CausalSelfAttention(shape, attention, fused_qkv, use_xsa=layer >= shape.n_layer - shape.xsa_last_n)
        self.mlp = MLP(shape)
        self.attn_scale = nn.Parameter(torch.ones(shape.d_model))
        self.mlp_scale = nn.Parameter(torch.ones(shape.d_model))
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(shape.d_model), torch.zeros(shape.d_model))))
        # ln_scale: a buffer, not a Python float, so kernel.compile_scope=blocks traces one graph for every layer
        scale = torch.tensor(1.0 / math.sqrt(layer + 1)) if shape.ln_scale else None
        self.register_buffer("ln_scale", scale, persistent=False)
        if shape.parallel_start_layer and layer >= shape.parallel_start_layer:
            # the record's parallel_resid_lambdas[layer] (init 1.1) and parallel_post_lambdas[layer] (init 1):
            # lane_post[0] = attention's weights into (lane 0, lane 1), lane_post[1] = the MLP's
            self.lane_resid = nn.Parameter(torch.full((2,), 1.1))
            self.lane_post = nn.Parameter(torch.ones(2, 2))

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        if self.ln_scale is None:
            return rms_norm(x)
        return (F.rms_norm(x.float(), (x.size(-1),)) * self.ln_scale).to(x.dtype)

    def forward(self, x, x0, cos, sin, ctx, lane1=None, at: Columns | None = None):
        """One block on the residual stream x. With ``lane1`` (parallel residual lanes, x being lane 0) attention
        reads lane 0 mixed with x0 and the MLP reads lane 1, side by side, and it returns both lanes (the record's
        GPT._parallel_block). With ``at`` it returns the stream (and lanes) at those columns only (GPT.forward's
        pick, for its last layer call)."""
        if at is not None:
            return self._forward_at(x, x0, cos, sin, at, lane1)
        dt = x.dtype
        mix = self.resid_mix.to(dt)
        if lane1 is not None:
            attn = self.attn_scale.to(dt) * self.attn(self.norm(mix[0] * x + mix[1] * x0), cos, sin, ctx).to(dt)
            mlp = self.mlp_scale.to(dt) * self.mlp(self.norm(lane1)).to(dt)
            r, p = self.lane_resid.to(dt), self.lane_post.to(dt)
            return r[0] * x + p[0, 0] * attn + p[1, 0] * mlp, r[1] * lane1 + p[0, 1] * attn + p[1, 1] * mlp
        x = mix[0] * x + mix[1] * x0
        x = x + self.attn_scale.to(dt) * self.attn(self.norm(x), cos, sin, ctx).to(dt)
        x = x + self.mlp_scale.to(dt) * self.mlp(self.norm(x)).to(dt)
        return x

    def _forward_at(self, x, x0, cos, sin, at: Columns, lane1=None):
        """forward at ``at``'s columns: attention's keys and values read every position, everything after it (the
        output projection, the residual, the MLP) runs at the columns only."""
        dt = x.dtype
        mix = self.resid_mix.to(dt)
        h = mix[0] * x + mix[1] * x0
        attn = self.attn_scale.to(dt) * self.attn(self.norm(h), cos, sin, None, at=at).to(dt)
        if lane1 is not None:
            lane1 = at.gather(lane1)
            mlp = self.mlp_scale.to(dt) * self.mlp(self.norm(lane1)).to(dt)
            r, p = self.lane_resid.to(dt), self.lane_post.to(dt)
            x = at.gather(x)
            return r[0] * x + p[0, 0] * attn + p[1, 0] * mlp, r[1] * lane1 + p[0, 1] * attn + p[1, 1] * mlp
        h = at.gather(h) + attn
        return h + self.mlp_scale.to(dt) * self.mlp(self.norm(h)).to(dt)


# ---- the model --------------------------------------------------------------------------------------------------------


def _residual_dtype(device_type: str) -> torch.dtype:
    """bf16 under bf16 autocast (as parameter-golf), else fp32. Reads autocast state, not tensor values, so it
    is compile-safe. A bf16 stream halves the traffic of every elementwise kernel."""
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16:
        return torch.bfloat16
    return torch.float32


FUSED_CE = choice("kernel.fused_ce", {"on": linear_softcap_ce})
"""kernel.fused_ce: the training loss without the whole fp32 logits (speedrun.core.fused_ce)."""


class GPT(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    fused_ce = 0
    """Rows per chunk of the fused head loss in training (kernel.fused_ce, set by make_model); 0: the eager head."""
    ttt_hooks = ("head", "attention")
    """What score-first TTT may hook besides the blocks' linears: ``head_adapter`` (ttt.targets with head) and each
    block attention's ``adapter`` (ttt.shared_attn_a). The Plan refuses either on a model class that lacks it."""

    def __init__(
        self,
        shape: ModelShape,
        attention: AttentionBackend,
        bos_id: int | None = None,
        fused_qkv: bool = False,
        doc_bos_id: int | None = None,
        options: dict | None = None,
    ):
        """attention: the backend every layer calls (speedrun.core.attention.get_backend). bos_id: mask attention at
        document boundaries (documents start at BOS); None attends across documents, as parameter-golf does.
        fused_qkv: one q/k/v matmul per block in training mode (CausalSelfAttention.fused_qkv). doc_bos_id: the BOS
        token, for what must not cross documents without masking attention (model.smear_gate; bos_id if None).
        options: a registered model's own knobs (speedrun.plan.model_choice); the built-in GPT's levers are ModelShape
        fields, so it gets none (the config has no other keys). The Plan has checked the rest: document masking
        only over a backend that can, sequences of at most model.seq_len, pick only where supports_pick."""
        super().__init__()
        self.shape, self.attention, self.bos_id = shape, attention, bos_id
        self.tok_emb = nn.Embedding(shape.vocab_size, shape.d_model)
        # (encoder, decoder) layer orders, loop off and on; the longer (looped) one sizes the skips, as the record
        self.orders = {False: shape.layer_order(False), True: shape.layer_order(True)}
        n_skip = min(len(self.orders[shape.loop.on][0]), len(self.orders[shape.loop.on][1]))
        self.skip_weights = nn.Parameter(torch.ones(n_skip, shape.d_model))
        self.blocks = nn.ModuleList([Block(shape, attention, fused_qkv, layer=i) for i in range(shape.n_layer)])
        self.lm_head = (
            None if shape.tie_embeddings else bias_free_linear(shape.d_model, shape.vocab_size, zero_init=True)
        )
        if shape.tie_embeddings:
            nn.init.normal_(self.tok_emb.weight, mean=0.0, std=shape.tied_embed_init_std)
        # skip gates: sigmoid(0) = 0.5 at init, the record's (skip_gates zeros)
        self.skip_gates: nn.Parameter | None = (
            nn.Parameter(torch.zeros(n_skip, shape.d_model)) if shape.skip_gates else None
        )
        self.loop_active = False
        """model.loop switched on (set_loop): a Python attribute, so a compiled model keeps one graph per state."""
        self.smear_window = shape.smear_gate.window
        self.smear_bos_id = doc_bos_id if doc_bos_id is not None else bos_id
        if self.smear_window:
            # the record's smear_gate (a (1, window) linear, zero init) and smear_lambda (zeros): identity at init
            self.smear_w = nn.Parameter(torch.zeros(self.smear_window))
            self.smear_lambda = nn.Parameter(torch.zeros(1))
        # quant.logit_rescale: the softcap as two scalars (positive, negative logits), at the softcap: the same
        # logits. Frozen in training (no optimizer group holds them); phased global TTT trains every weight, them too.
        self.logit_rescale: nn.Parameter | None = None
        if shape.logit_rescale:
            self.logit_rescale = nn.Parameter(torch.full((2,), float(shape.logit_softcap)), requires_grad=False)
        cos, sin = rope_tables(shape.seq_len, shape.head_dim, shape.rope_base, shape.rope_dims)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # Callables that stand in for the blocks and the head inside compiled_regions() (kernel.compile_scope=blocks);
        # a plain tuple, not a ModuleList, so they are not registered as submodules or saved.
        self._region_calls: tuple[tuple, Any] | None = None
        self.head_adapter: nn.Module | None = None
        """A module adding a delta to the logits, from the normed final hidden state (B, T, C) -> (B, T, V): TTT's LoRA
        on the output head (speedrun.core.ttt_lora), set only on TTT's own copy of the model. The head's weight is
        applied with F.linear (it may be the tied embedding), so an adapter cannot be swapped in as a module."""

    @contextlib.contextmanager
    def compiled_regions(self, blocks: tuple, head: object) -> Iterator[None]:
        """Run forward with these callables (compiled copies of the blocks and of head, or TTT's head at a chunk's
        columns) in place of the modules' own calls. Only the callers that ask get them: GPTQ's hooks call the
        model itself."""
        self._region_calls = (blocks, head)
        try:
            yield
        finally:
            self._region_calls = None

    # ---- the depth-recurrence switch ---------------------------------------------------------------

    def set_loop(self, active: bool) -> None:
        """Switch model.loop on or off (a no-op for a model without one). The training loop switches it at
        loop.enable_at; warm-up compiles both states first."""
        self.loop_active = bool(active) and self.shape.loop.on

    @contextlib.contextmanager
    def looped(self, active: bool = True) -> Iterator[None]:
        """set_loop(active) for the duration of the block, the previous state after it."""
        before = self.loop_active
        self.set_loop(active)
        try:
            yield
        finally:
            self.loop_active = before

    # ---- forward -----------------------------------------------------------------------------------

    def smear(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The record's SmearGate with its BOS fix: x_t += lambda * sigmoid(w . x_t[:window]) * x_{t-1} for t >= 1,
        except where idx_t is BOS (a document's first token takes nothing from the previous document)."""
        w = self.smear_window
        gate = torch.sigmoid(F.linear(x[:, 1:, :w], self.smear_w[None, :]))  # (B, T-1, 1)
        keep = torch.ne(idx[:, 1:], cast(int, self.smear_bos_id)).unsqueeze(-1)  # set whenever the gate is on
        g = (self.smear_lambda * gate * keep).to(x.dtype)
        return torch.cat((x[:, :1], x[:, 1:] + g * x[:, :-1]), dim=1)

    def skip(self, x: torch.Tensor, skip: torch.Tensor, i: int) -> torch.Tensor:
        """Decoder call i takes a U-Net skip: x + w_i * skip, or with model.skip_gates lerp(w_i * skip, x,
        sigmoid(g_i)) (the record's torch.lerp form)."""
        scaled = self.skip_weights[i].to(x.dtype) * skip
        if self.skip_gates is None:
            return x + scaled
        return torch.lerp(scaled, x, torch.sigmoid(self.skip_gates[i].to(x.dtype)))

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        reduction: str = "mean",
        pick: torch.Tensor | None = None,
    ):
        """idx (B, T) token ids. Returns the mean cross-entropy (fp32 scalar) when targets are given and
        reduction == "mean", the per-token loss (B, T) fp32 for reduction == "none", else logits (B, T, V).

        ``pick`` (B, G) column indices: all of that at those columns only ((B, G) losses, (B, G, V) logits; the
        mean over them), the same numbers as the whole forward's columns (up to the attention kernel's rounding).
        The last layer call then runs its queries, output projection and MLP at the columns only: nothing after
        its keys and values reaches another column's output. TTT scores a chunk of 48 tokens with a window of up
        to 2,048 of context (speedrun.core.ttt_score), so that call runs at 48 columns instead of up to 2,048."""
        B, T = idx.shape
        ctx = self.attention.prepare(idx, self.bos_id)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]

        blocks, head = self._region_calls or (self.blocks, self.head)
        x = self.tok_emb(idx)
        if self.smear_window:
            x = self.smear(x, idx)
        x = rms_norm(x).to(_residual_dtype(idx.device.type))
        x0 = x
        encoder, decoder = self.orders[self.loop_active]
        parallel = self.shape.parallel_start_layer or self.shape.n_layer
        skips: list[torch.Tensor] = []
        for i in encoder:
            x = blocks[i](x, x0, cos, sin, ctx)
            skips.append(x)
        lane1 = None
        at = None if pick is None else self._columns(idx, pick)
        for j, i in enumerate(decoder):
            if lane1 is None and i >= parallel:
                lane1 = x  # the lanes split before this call's skip, which goes into lane 0 only (the record's)
            if skips:
                x = self.skip(x, skips.pop(), j)
            last = at if j == len(decoder) - 1 else None  # the columns from the last call on
            if lane1 is None:
                x = blocks[i](x, x0, cos, sin, ctx, at=last)
            else:
                x, lane1 = blocks[i](x, x0, cos, sin, ctx, lane1, at=last)
        if lane1 is not None:
            lane = self.shape.parallel_final_lane
            x = lane1 if lane == "mlp" else x if lane == "attn" else 0.5 * (x + lane1)
        if pick is not None and targets is not None:
            targets = targets.gather(1, pick)
        return head(x, targets, reduction)

    @property
    def supports_pick(self) -> bool:
        """forward takes ``pick`` (speedrun.plan.model_choice, an optional part of the contract): over a backend whose
        attention an explicit mask rebuilds exactly (AttentionBackend.plain_softmax; the built-in ones)."""
        return bool(getattr(self.attention, "plain_softmax", False))

    def _columns(self, idx: torch.Tensor, pick: torch.Tensor) -> Columns:
        """The picked columns with the mask their queries attend with: the backend's rule (allowed_keys: causal,
        its window, the document when bos_id masks documents), for queries at those columns."""
        pos = torch.arange(idx.size(1), device=idx.device)
        q_docs = k_docs = None
        if self.bos_id is not None:
            doc = document_ids(idx, self.bos_id)
            q_docs, k_docs = doc.gather(1, pick)[:, :, None], doc[:, None, :]
        allowed = allowed_keys(pick[:, :, None], pos[None, None, :], self.attention.window, q_docs, k_docs)
        return Columns(pick, allowed[:, None])

    def head(self, x: torch.Tensor, targets: torch.Tensor | None, reduction: str = "mean"):
        """Final norm, logits, softcap and loss of the residual stream x (B, T, C): forward's return value. In training
        with ``fused_ce`` rows, the loss of the same math comes from speedrun.core.fused_ce, chunk by chunk."""
        B, T = x.shape[:2]
        x = rms_norm(x)
        weight = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
        rescale = self.logit_rescale
        fixed_caps = rescale is None or not rescale.requires_grad  # trainable caps take the eager path, for a gradient
        if self.fused_ce and self.training and targets is not None and self.head_adapter is None and fixed_caps:
            cap = self.shape.logit_softcap if rescale is None else rescale
            return FUSED_CE["on"](x, weight, targets, cap, self.fused_ce, reduction)  # the same loss in row chunks
        logits = F.linear(x, weight)
        if self.head_adapter is not None:
            logits = logits + self.head_adapter(x)
        logits = logits.float()
        if self.logit_rescale is not None:  # asymmetric: c = pos where the logit is > 0, else neg
            caps = torch.where(logits > 0, self.logit_rescale[0], self.logit_rescale[1])
            logits = caps * torch.tanh(logits / caps)
        elif self.shape.logit_softcap > 0:
            cap = self.shape.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), reduction=reduction)
        return loss if reduction == "mean" else loss.view(B, T)

    # ---- accounting --------------------------------------------------------------------------------

    def num_params(self) -> int:
        """All parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Optimizer partition: matrix (2-D block weights, Muon), scalar (gains, scales, mixes, skip weights, the
        record levers' gates and lane weights: Adam), embed (token embedding: Adam), head (untied lm_head: Adam; empty when tied)."""
        matrix: list[nn.Parameter] = []
        scalar: list[nn.Parameter] = []
        for name, p in self.blocks.named_parameters():
            control = p.ndim < 2 or name.rsplit(".", 1)[-1] in Block.CONTROL
            (scalar if control else matrix).append(p)
        scalar.append(self.skip_weights)
        # the record levers' model-level gates (skip gates, smear gate): Adam too
        scalar += [
            p
            for p in (self.skip_gates, getattr(self, "smear_w", None), getattr(self, "smear_lambda", None))
            if p is not None
        ]
        return {
            "matrix": matrix,
            "scalar": scalar,
            "embed": [cast(nn.Parameter, self.tok_emb.weight)],
            "head": [] if self.lm_head is None else [cast(nn.Parameter, self.lm_head.weight)],
        }


BUILTIN = {"gpt": "speedrun.core.model:GPT"}
"""model.arch's short names for the models that ship with speedrun ("package.module:Class" names any other)."""
