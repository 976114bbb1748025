"""A block of the built-in GPT (speedrun.model.gpt), and its attention and MLP: pre-norm, no biases, GQA with
QK-norm, RoPE and a per-head q gain, relu^2 MLP, each block's outputs scaled and mixed with the embedding. The
record levers a block carries (leaky relu^2, partial RoPE, ln_scale, XSA, the attention output gate, parallel
residual lanes) are off by default; gpt.py's docstring says what each does. ``Columns`` is a forward at some
columns only (GPT.forward's pick)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.attention.base import AttentionBackend
from speedrun.model.layers import apply_partial_rope, apply_rope, rms_norm, xsa
from speedrun.model.shape import ModelShape


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
        """Low-rank deltas from this attention's input, set only on TTT's own copy of the model (speedrun.ttt.
        lora.InputAdapters, ttt.shared_attn_a): ``adapter(x, at)`` -> the deltas of q, k, v and of the output
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
