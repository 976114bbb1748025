"""The GPT of parameter-golf's baseline family.

Per block (pre-norm, no biases, parameter-free RMSNorm):
    x = resid_mix[0] * x + resid_mix[1] * x0            # learnable mix with the embedding x0
    x = x + attn_scale * attn(norm(x))                  # GQA, QK-norm, RoPE, per-head q gain
    x = x + mlp_scale * mlp(norm(x))                    # relu(x W_fc)^2 W_proj
The first half of the blocks ("encoder") pushes its outputs on a stack; each block of the second half first adds
skip_weights[i] * stack.pop() (U-Net style). Output projections (attn proj, mlp proj, untied lm_head) start at zero.
logits = softcap * tanh(logits / softcap), cross-entropy in fp32.

Parameter names follow parameter-golf's train_gpt.py (tok_emb, blocks.N.attn.c_q, ..., skip_weights,
lm_head) so state dicts and its name-based rules (control tensors kept in fp32 by the quantizer) carry over.
Weights are fp32 masters; run under torch.autocast for bf16/fp16 matmuls. Under bf16 autocast the residual
stream is bf16 (as in parameter-golf, whose model is cast to bf16); otherwise it stays fp32 (fp16's range is
too narrow for it). Norms, the q/k path before attention, the softcap and the loss are computed in fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.attention.base import AttentionBackend
from speedrun.model.shape import ModelShape


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dim, computed in fp32, returned in x's dtype."""
    return F.rms_norm(x.float(), (x.size(-1),)).to(x.dtype)


def rope_tables(seq_len: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (seq_len, head_dim // 2), fp32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) by position; halves convention (x1 = first D/2 dims), as parameter-golf."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


def _linear(d_in: int, d_out: int, zero_init: bool = False) -> nn.Linear:
    layer = nn.Linear(d_in, d_out, bias=False)  # default init: U(-1/sqrt(d_in), 1/sqrt(d_in)), as theirs
    if zero_init:
        nn.init.zeros_(layer.weight)
    return layer


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: ModelShape, attention: AttentionBackend, fused_qkv: bool = False):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = shape.n_head, shape.n_kv_head, shape.head_dim
        kv_dim = shape.n_kv_head * shape.head_dim
        self.split = (shape.d_model, kv_dim, kv_dim)
        self.fused_qkv = fused_qkv
        """In training mode, q, k and v come from one matmul over their concatenated weights (kernel.fused_qkv):
        the input is read once, and the backward's input gradient is one GEMM instead of three plus two adds (yet
        on an H100 it measured 0.99x, so it is off unless asked for). The three Linear modules stay (their names,
        Muon's matrices, fp8, GPTQ's hooks and TTT's adapters see them); eval mode, which GPTQ, TTT and evaluation
        use, always calls them one by one."""
        self.c_q = _linear(shape.d_model, shape.d_model)
        self.c_k = _linear(shape.d_model, kv_dim)
        self.c_v = _linear(shape.d_model, kv_dim)
        self.proj = _linear(shape.d_model, shape.d_model, zero_init=True)
        self.qk_norm = shape.qk_norm
        if shape.qk_norm:
            self.q_gain = nn.Parameter(torch.full((shape.n_head,), shape.qk_gain_init, dtype=torch.float32))
        self.attention = attention  # a plain object, not a module: no parameters, not in state_dict

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: object) -> torch.Tensor:
        B, T, C = x.shape
        if self.fused_qkv and self.training:
            # the concatenated weight is rebuilt every call (0.5-1 MB here): no second copy of the weights to keep
            # in step with the optimizer, and autograd splits its gradient back onto c_q, c_k and c_v
            weight = torch.cat((self.c_q.weight, self.c_k.weight, self.c_v.weight))
            q, k, v = F.linear(x, weight).split(self.split, dim=-1)
        else:
            q, k, v = self.c_q(x), self.c_k(x), self.c_v(x)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        dtype = v.dtype  # the matmul dtype (bf16/fp16 under autocast)
        # norm, rotation and gain in fp32 (one fused kernel under compile), then back to the matmul dtype
        q, k = q.float(), k.float()
        if self.qk_norm:
            q = F.rms_norm(q, (self.head_dim,))
            k = F.rms_norm(k, (self.head_dim,))
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if self.qk_norm:
            q = q * self.q_gain[None, :, None, None]
        y = self.attention(q.to(dtype), k.to(dtype), v, ctx)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.fc = _linear(shape.d_model, shape.mlp_mult * shape.d_model)
        self.proj = _linear(shape.mlp_mult * shape.d_model, shape.d_model, zero_init=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.fc(x)).square())


class Block(nn.Module):
    # 1-D/0-D and mixing parameters: Adam, kept fp32; everything else in a block is a matrix for Muon.
    CONTROL = ("attn_scale", "mlp_scale", "resid_mix", "q_gain")

    def __init__(self, shape: ModelShape, attention: AttentionBackend, fused_qkv: bool = False):
        super().__init__()
        self.attn = CausalSelfAttention(shape, attention, fused_qkv)
        self.mlp = MLP(shape)
        self.attn_scale = nn.Parameter(torch.ones(shape.d_model))
        self.mlp_scale = nn.Parameter(torch.ones(shape.d_model))
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(shape.d_model), torch.zeros(shape.d_model))))

    def forward(self, x, x0, cos, sin, ctx):
        dt = x.dtype
        mix = self.resid_mix.to(dt)
        x = mix[0] * x + mix[1] * x0
        x = x + self.attn_scale.to(dt) * self.attn(rms_norm(x), cos, sin, ctx).to(dt)
        x = x + self.mlp_scale.to(dt) * self.mlp(rms_norm(x)).to(dt)
        return x


def _residual_dtype(device_type: str) -> torch.dtype:
    """bf16 under bf16 autocast (as parameter-golf), else fp32. Reads autocast state, not tensor values, so it
    is compile-safe. A bf16 stream halves the traffic of every elementwise kernel: pgolf_baseline trained
    ~17% faster with it than with an fp32 stream (H200, compiled, sdpa flash)."""
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16:
        return torch.bfloat16
    return torch.float32


class GPT(nn.Module):
    def __init__(
        self, shape: ModelShape, attention: AttentionBackend, bos_id: int | None = None, fused_qkv: bool = False
    ):
        """attention: the backend every layer calls (speedrun.model.attention.get_backend). bos_id: mask attention at
        document boundaries (documents start at BOS); None attends across documents, as parameter-golf does.
        fused_qkv: one q/k/v matmul per block in training mode (CausalSelfAttention.fused_qkv)."""
        super().__init__()
        if bos_id is not None and not attention.supports_doc_mask:
            raise ValueError(
                f"document masking (bos_id={bos_id}) needs an attention backend that supports it "
                f"(flex, math); {attention.kernel!r} does not"
            )
        self.shape, self.attention, self.bos_id = shape, attention, bos_id
        self.tok_emb = nn.Embedding(shape.vocab_size, shape.d_model)
        self.num_encoder_layers = shape.n_layer // 2
        self.num_decoder_layers = shape.n_layer - self.num_encoder_layers
        n_skip = min(self.num_encoder_layers, self.num_decoder_layers)
        self.skip_weights = nn.Parameter(torch.ones(n_skip, shape.d_model))
        self.blocks = nn.ModuleList([Block(shape, attention, fused_qkv) for _ in range(shape.n_layer)])
        self.lm_head = None if shape.tie_embeddings else _linear(shape.d_model, shape.vocab_size, zero_init=True)
        if shape.tie_embeddings:
            nn.init.normal_(self.tok_emb.weight, mean=0.0, std=shape.tied_embed_init_std)
        cos, sin = rope_tables(shape.seq_len, shape.head_dim, shape.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # Callables that stand in for the blocks and the head inside compiled_regions() (kernel.compile_scope=blocks);
        # a plain tuple, not a ModuleList, so they are not registered as submodules or saved.
        self._region_calls: tuple[tuple, object] | None = None

    @contextlib.contextmanager
    def compiled_regions(self, blocks: tuple, head: object) -> Iterator[None]:
        """Run forward with these callables (compiled copies of the blocks and of head) in place of the modules'
        own calls. Only the callers that ask get the compiled regions: GPTQ's hooks and TTT call the model itself."""
        self._region_calls = (blocks, head)
        try:
            yield
        finally:
            self._region_calls = None

    # ---- forward -----------------------------------------------------------------------------------

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, reduction: str = "mean"):
        """idx (B, T) token ids. Returns the mean cross-entropy (fp32 scalar) when targets are given and
        reduction == "mean", the per-token loss (B, T) fp32 for reduction == "none", else logits (B, T, V)."""
        B, T = idx.shape
        if T > self.shape.seq_len:
            raise ValueError(f"sequence length {T} exceeds model.seq_len {self.shape.seq_len}")
        ctx = self.attention.prepare(idx, self.bos_id)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]

        blocks, head = self._region_calls or (self.blocks, self.head)
        x = rms_norm(self.tok_emb(idx)).to(_residual_dtype(idx.device.type))
        x0 = x
        skips: list[torch.Tensor] = []
        for i in range(self.num_encoder_layers):
            x = blocks[i](x, x0, cos, sin, ctx)
            skips.append(x)
        for i in range(self.num_decoder_layers):
            if skips:
                x = x + self.skip_weights[i].to(x.dtype) * skips.pop()
            x = blocks[self.num_encoder_layers + i](x, x0, cos, sin, ctx)
        return head(x, targets, reduction)

    def head(self, x: torch.Tensor, targets: torch.Tensor | None, reduction: str = "mean"):
        """Final norm, logits, softcap and loss of the residual stream x (B, T, C): forward's return value."""
        B, T = x.shape[:2]
        x = rms_norm(x)
        weight = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, weight).float()
        if self.shape.logit_softcap > 0:
            cap = self.shape.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        if targets is None:
            return logits
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
        loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), reduction=reduction)
        return loss if reduction == "mean" else loss.view(B, T)

    # ---- accounting --------------------------------------------------------------------------------

    def num_params(self) -> int:
        """All parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Optimizer partition: matrix (2-D block weights, Muon), scalar (gains, scales, mixes, skip weights:
        Adam), embed (token embedding: Adam), head (untied lm_head: Adam; empty when tied)."""
        matrix: list[nn.Parameter] = []
        scalar: list[nn.Parameter] = []
        for name, p in self.blocks.named_parameters():
            control = p.ndim < 2 or name.rsplit(".", 1)[-1] in Block.CONTROL
            (scalar if control else matrix).append(p)
        scalar.append(self.skip_weights)
        return {
            "matrix": matrix,
            "scalar": scalar,
            "embed": [self.tok_emb.weight],
            "head": [] if self.lm_head is None else [self.lm_head.weight],
        }


__all__ = ["GPT", "rms_norm", "apply_rope", "rope_tables"]
