"""The model's shape, resolved: one torch-free dataclass that the Plan records and the GPT is built from.

The model group's schema (config.ModelConfig) leaves fields None for "take the preset's"; the resolver fills
them and builds a ModelShape, whose checks run here, once.
"""

from __future__ import annotations

from dataclasses import dataclass

from speedrun.errors import ConfigError


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
    rope_base: float = 10000.0
    qk_norm: bool = True
    """RMSNorm on q and k per head, then a learnable per-head q gain (qk_gain_init)."""
    tied_embed_init_std: float = 0.005
    """Std of the token embedding's normal init when tied (untied: std 1, as nn.Embedding)."""
    qk_gain_init: float = 1.5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "mlp_mult", "seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_head % self.n_kv_head:
            divisors = ", ".join(str(k) for k in range(1, self.n_head + 1) if self.n_head % k == 0)
            raise ConfigError(
                f"model.n_kv_head={self.n_kv_head} must divide model.n_head={self.n_head}; use one of {divisors}"
            )
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ConfigError(
                f"model.d_model={self.d_model} must split into n_head={self.n_head} heads of even size (RoPE)"
            )
        if self.logit_softcap < 0:
            raise ConfigError(f"model.logit_softcap must be >= 0 (0 = off), got {self.logit_softcap}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def matmul_params(self) -> int:
        """Weights of the block matmuls plus the lm_head (counted even when tied): what 6 x N FLOPs counts."""
        kv = self.n_kv_head * self.head_dim
        attn = self.d_model * (self.d_model + 2 * kv) + self.d_model * self.d_model
        mlp = 2 * self.mlp_mult * self.d_model * self.d_model
        return self.n_layer * (attn + mlp) + self.vocab_size * self.d_model

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token at context ``seq_len``: 6 x matmul_params + 12 x n_layer x d_model x seq_len
        (attention scores and values, no causal halving: the nanochat/autoresearch convention used for MFU)."""
        return 6 * self.matmul_params() + 12 * self.n_layer * self.d_model * seq_len
