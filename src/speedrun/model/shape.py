"""The model's shape, resolved: one torch-free dataclass that the Plan records and the GPT is built from.

The model group's schema (config.ModelConfig) leaves fields None for "take the preset's"; the resolver fills
them and builds a ModelShape, whose checks run here, once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from speedrun.errors import ConfigError

MLP_ACTS = ("relu2", "leaky_relu2")
PARALLEL_LANES = ("mean", "attn", "mlp")


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
    if not isinstance(value, dict):
        raise ConfigError(f"model lever {cls.__name__} must be a mapping, got {value!r}")
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
        if self.logit_rescale and not self.logit_softcap > 0:
            raise ConfigError(
                "quant.logit_rescale=true rescales the logit softcap, which model.logit_softcap=0 turns off; set "
                "model.logit_softcap=30 or drop quant.logit_rescale"
            )
        self._check_levers()

    def _check_levers(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message)

        n = self.n_layer
        need(self.mlp_act in MLP_ACTS, f"model.mlp_act={self.mlp_act} must be one of {', '.join(MLP_ACTS)}")
        need(
            math.isfinite(self.mlp_leaky_slope) and self.mlp_leaky_slope >= 0,
            f"model.mlp_leaky_slope={self.mlp_leaky_slope} must be >= 0; e.g. model.mlp_leaky_slope=0.5",
        )
        rd = self.rope_dims
        need(
            not rd or (rd >= 2 and rd % 2 == 0 and rd <= self.head_dim),
            f"model.rope_dims={rd} must be even and in [2, head_dim={self.head_dim}] (null or 0: every channel)",
        )
        need(math.isfinite(self.qk_gain_init), f"model.qk_gain_init={self.qk_gain_init} must be finite")
        need(
            self.qk_norm or self.qk_gain_init == 1.5,
            f"model.qk_gain_init={self.qk_gain_init} is the gain after QK-norm; set model.qk_norm=true or drop it",
        )
        need(0 <= self.xsa_last_n <= n, f"model.xsa_last_n={self.xsa_last_n} must be in [0, n_layer={n}] (0: off)")
        lp = self.loop
        if lp.on:
            need(
                0 <= lp.start <= lp.end < n,
                f"model.loop.start={lp.start} and model.loop.end={lp.end} must satisfy 0 <= start <= end < n_layer={n}",
            )
        need(lp.num >= 0, f"model.loop.num={lp.num} must be >= 0 (0: off)")
        need(0 <= lp.enable_at < 1, f"model.loop.enable_at={lp.enable_at} must be in [0, 1)")
        need(
            self.parallel_final_lane in PARALLEL_LANES,
            f"model.parallel_final_lane={self.parallel_final_lane} must be one of {', '.join(PARALLEL_LANES)}",
        )
        psl = self.parallel_start_layer
        if psl:
            need(
                n // 2 <= psl < n,
                f"model.parallel_start_layer={psl} must be a decoder layer, in [{n // 2}, {n - 1}] (null: off)",
            )
            if lp.on:
                need(
                    psl > lp.end,
                    f"model.parallel_start_layer={psl} must come after the looped layers (model.loop.end={lp.end})",
                )
                _, decoder = self.layer_order(looped=True)
                need(
                    psl in decoder,
                    f"model.parallel_start_layer={psl} falls in the encoder half once model.loop is on; raise it",
                )
        w = self.smear_gate.window
        need(0 <= w <= self.d_model, f"model.smear_gate.window={w} must be in [0, d_model={self.d_model}] (0: off)")
        g = self.attn_out_gate
        need(
            0 <= g.window <= self.d_model,
            f"model.attn_out_gate.window={g.window} must be in [0, d_model={self.d_model}] (0: off)",
        )
        need(math.isfinite(g.scale), f"model.attn_out_gate.scale={g.scale} must be finite")
        need(g.init_std >= 0, f"model.attn_out_gate.init_std={g.init_std} must be >= 0 (0: zeros)")

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

    def result_keys(self) -> dict[str, Any]:
        """Every record lever's value, ``model_``-prefixed and flat, for result.json and the results row (the full
        shape is in plan.json)."""
        return {
            "model_mlp_act": self.mlp_act,
            "model_mlp_leaky_slope": self.mlp_leaky_slope,
            "model_rope_dims": self.rope_dims or None,
            "model_ln_scale": self.ln_scale,
            "model_qk_gain_init": self.qk_gain_init,
            "model_xsa_last_n": self.xsa_last_n,
            "model_skip_gates": self.skip_gates,
            "model_loop_start": self.loop.start,
            "model_loop_end": self.loop.end,
            "model_loop_num": self.loop.num,
            "model_loop_enable_at": self.loop.enable_at,
            "model_parallel_start_layer": self.parallel_start_layer or None,
            "model_parallel_final_lane": self.parallel_final_lane,
            "model_smear_gate_window": self.smear_gate.window,
            "model_attn_out_gate_window": self.attn_out_gate.window,
            "model_attn_out_gate_scale": self.attn_out_gate.scale,
            "model_attn_out_gate_init_std": self.attn_out_gate.init_std,
        }
