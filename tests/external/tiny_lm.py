"""A model of one's own, outside the speedrun package: what `model.arch=external.tiny_lm:TinyLM` builds in
tests/e2e/test_external_model.py. Deliberately not the built-in GPT: plain pre-norm blocks, learned positions, no
RoPE, no U-Net skips, and one knob of its own (``model.mlp_gain``) declared in its config schema."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.config.model import ModelConfig


@dataclass
class TinyLMConfig(ModelConfig):
    mlp_gain: float = 1.0
    """Scales each block's MLP output (a knob of this model alone)."""


class Attention(nn.Module):
    def __init__(self, d: int, n_head: int, attention):
        super().__init__()
        self.n_head, self.attention = n_head, attention
        self.c_q, self.c_k, self.c_v = (
            nn.Linear(d, d, bias=False),
            nn.Linear(d, d, bias=False),
            nn.Linear(d, d, bias=False),
        )
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, ctx: object) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (
            lin(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for lin in (self.c_q, self.c_k, self.c_v)
        )
        y = self.attention(q, k, v, ctx)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, d: int, mult: int, gain: float):
        super().__init__()
        self.fc, self.proj, self.gain = nn.Linear(d, mult * d, bias=False), nn.Linear(mult * d, d, bias=False), gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gain * self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d: int, n_head: int, mult: int, gain: float, attention):
        super().__init__()
        self.attn, self.mlp = Attention(d, n_head, attention), MLP(d, mult, gain)

    def forward(self, x: torch.Tensor, ctx: object) -> torch.Tensor:
        x = x + self.attn(F.rms_norm(x, x.shape[-1:]), ctx)
        return x + self.mlp(F.rms_norm(x, x.shape[-1:]))


class TinyLM(nn.Module):
    config = TinyLMConfig

    def __init__(self, shape, attention, bos_id=None, fused_qkv=False, doc_bos_id=None, options=None):
        super().__init__()
        gain = (options or {}).get("mlp_gain", 1.0)
        d = shape.d_model
        self.attention, self.bos_id = attention, bos_id
        self.tok_emb = nn.Embedding(shape.vocab_size, d)
        nn.init.normal_(self.tok_emb.weight, std=0.02)  # tied to the output: small logits at the start
        self.pos_emb = nn.Parameter(torch.zeros(shape.seq_len, d))
        self.blocks = nn.ModuleList(
            [Block(d, shape.n_head, shape.mlp_mult, gain, attention) for _ in range(shape.n_layer)]
        )
        for block in self.blocks:  # each block starts as the identity
            nn.init.zeros_(block.attn.proj.weight)
            nn.init.zeros_(block.mlp.proj.weight)
        self._regions: tuple | None = None

    @contextlib.contextmanager
    def compiled_regions(self, blocks: tuple, head: object) -> Iterator[None]:
        self._regions = (blocks, head)
        try:
            yield
        finally:
            self._regions = None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, reduction: str = "mean"):
        blocks, head = self._regions or (self.blocks, self.head)
        ctx = self.attention.prepare(idx, self.bos_id)
        x = self.tok_emb(idx) + self.pos_emb[: idx.shape[1]]
        for block in blocks:
            x = block(x, ctx)
        return head(x, targets, reduction)

    def head(self, x: torch.Tensor, targets: torch.Tensor | None, reduction: str = "mean"):
        logits = F.linear(F.rms_norm(x, x.shape[-1:]), self.tok_emb.weight).float()
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)
        return loss if reduction == "mean" else loss.view(targets.shape)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {
            "matrix": [p for p in self.blocks.parameters() if p.ndim == 2],
            "scalar": [self.pos_emb],
            "embed": [self.tok_emb.weight],
            "head": [],
        }

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class Incomplete(nn.Module):
    """Lacks head and param_groups: the registry names both."""

    def forward(self, idx, targets=None, reduction="mean"):
        raise NotImplementedError

    def compiled_regions(self, blocks, head):
        raise NotImplementedError

    def num_params(self) -> int:
        return 0
