"""The model group's schema: the GPT's shape and its levers (parameter-golf's April record stack), each documented
beside its field; `model.arch` names the class that is built (speedrun.plan.model_choice)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from speedrun.config.choices import MlpAct, ParallelLane, _require


@dataclass
class LoopConfig:
    """model.loop: depth recurrence, the record's NUM_LOOPS / LOOP_START / LOOP_END / ENABLE_LOOPING_AT."""

    start: int = 0
    """First layer (0-based) of the looped segment. The record: 3."""
    end: int = 0
    """Last layer of the looped segment, inclusive (< n_layer). The record: 5."""
    num: int = 0
    """Extra passes over layers start..end while the loop is on: the segment runs 1 + num times in a row with the
    same weights, and the U-Net skips pair the first and second half of that longer sequence of layer calls.
    0: off. The record: 2 (layers 3-5 three times: 17 layer calls for 11 layers)."""
    enable_at: float = 0.0
    """Fraction of the training budget (measured as the context stages are: schedule.progress) at which the loop
    switches on; before it every layer runs once. 0: looped from the first step. Both graphs (loop off and on) are
    compiled in the untimed warm-up, so the switch recompiles nothing. Evaluation, the artifact's round trip and
    TTT run the model as training left it (looped once the switch has happened). The record: 0.35."""

    def __post_init__(self) -> None:
        _require(self.num >= 0, f"model.loop.num={self.num} must be >= 0 (0: off); e.g. model.loop.num=2")
        _require(
            self.num == 0 or 0 <= self.start <= self.end,
            f"model.loop.start={self.start} and model.loop.end={self.end} must satisfy 0 <= start <= end; e.g. "
            f"model.loop.start=3 model.loop.end=5",
        )
        _require(
            0 <= self.enable_at < 1,
            f"model.loop.enable_at={self.enable_at} must be in [0, 1) (a fraction of the budget); e.g. 0.35",
        )


@dataclass
class SmearGateConfig:
    """model.smear_gate: the record's SmearGate (SMEAR_GATE_ENABLED, GATE_WINDOW) with its BOS fix."""

    window: int = 0
    """Before the first block, each token's embedding e_t gets lambda * sigmoid(w . e_t[:window]) * e_{t-1} added
    (w of size window and the scalar lambda learned, both 0 at init: the identity); a token that is BOS takes
    nothing from the one before it, so no document mixes into the next. window: embedding channels that drive the
    gate, <= d_model. 0: off. The record: 12."""

    def __post_init__(self) -> None:
        _require(self.window >= 0, f"model.smear_gate.window={self.window} must be >= 0 (0: off); e.g. 12")


@dataclass
class AttnOutGateConfig:
    """model.attn_out_gate: the record's sparse attention output gate (SPARSE_ATTN_GATE_*)."""

    window: int = 0
    """Each head's attention output (after XSA, before attn.proj) is multiplied by sigmoid(scale * W_h . x[:window]),
    x the attention's input at that position and W (n_head, window) learned. window: input channels that drive it,
    <= d_model. 0: off. The record: 12 (its GATE_WINDOW)."""
    scale: float = 1.0
    """Multiplier of the gate's logit. The record: 1.0 (PR #2014: 0.5)."""
    init_std: float = 0.0
    """Std of W's normal init; 0: zeros, every gate sigmoid(0) = 0.5 at init (the record's)."""

    def __post_init__(self) -> None:
        _require(self.window >= 0, f"model.attn_out_gate.window={self.window} must be >= 0 (0: off); e.g. 12")
        _require(math.isfinite(self.scale), f"model.attn_out_gate.scale={self.scale} must be finite; e.g. 1.0")
        _require(
            self.init_std >= 0 and math.isfinite(self.init_std),
            f"model.attn_out_gate.init_std={self.init_std} must be >= 0 (0: zeros); e.g. 0.0",
        )


@dataclass
class ModelConfig:
    name: str = "auto"
    """Preset name. auto: the hardware profile's default model (tiny on CPU, pgolf_baseline on a GPU); shape
    fields set on the command line (model.n_layer=6) override the preset's."""
    arch: str = "gpt"
    """The model class: a registered name (gpt: the built-in GPT) or "package.module:Class" of your own, which
    must meet the pipeline's contract (speedrun/plan/model_choice.py, docs/extending.md). A class with a `config`
    dataclass (a ModelConfig subclass) adds its own typed knobs: `model.arch=pkg.mod:MyGPT model.my_knob=3`."""
    vocab_size: int | None = None
    """Token vocabulary. None: the data's tokenizer vocabulary, padded up to a multiple of vocab_multiple."""
    vocab_multiple: int = 1
    """Pad the data's vocabulary up to a multiple of this (the extra rows are ids no data holds): modded-nanogpt
    pads GPT-2's 50,257 to 50,304 (128) so the embedding and head matmuls tile evenly. 1: no padding."""
    n_layer: int | None = None
    """Transformer blocks (None: from the preset)."""
    d_model: int | None = None
    """Residual width (None: from the preset)."""
    n_head: int | None = None
    """Query heads (None: from the preset)."""
    n_kv_head: int | None = None
    """Key/value heads (grouped-query attention); must divide n_head (None: from the preset)."""
    mlp_mult: int | None = None
    """MLP hidden width = mlp_mult * d_model, ReLU^2 (None: from the preset)."""
    seq_len: int | None = None
    """Training context length in tokens (None: from the preset)."""
    tie_embeddings: bool | None = None
    """Share the token embedding with the output head (None: from the preset)."""
    logit_softcap: float = 30.0
    """softcap * tanh(logits / softcap); 0 turns it off."""
    rope_base: float = 10000.0
    """RoPE base frequency."""
    qk_norm: bool = True
    """RMS-normalise queries and keys per head."""
    qk_gain_init: float = 1.5
    """Initial value of the learned per-head gain on the queries after QK-norm (attention logits scale with it).
    Needs qk_norm. The record: 5.0."""
    # parameter-golf's April 2026 record stack (records/track_10min_16mb/2026-04-29_*/train_gpt.py): each lever is
    # off by default, and with all of them off the model is today's, bit for bit (tests/model/test_model_levers.py).
    mlp_act: MlpAct = MlpAct.relu2
    """MLP activation: relu2 = relu(x)^2, leaky_relu2 = leaky_relu(x, mlp_leaky_slope)^2. The record: leaky_relu2."""
    mlp_leaky_slope: float = 0.5
    """Negative slope of leaky_relu2 (unused by relu2). The record: 0.5."""
    rope_dims: int | None = None
    """Partial RoPE: rotate only the first rope_dims channels of each head (frequencies spread over those
    channels), the rest carry no position. Even, <= head_dim. null or 0: every channel. The record: 16 (of 64)."""
    ln_scale: bool = False
    """Multiply each block's two norm outputs (before attention and before the MLP) by 1 / sqrt(layer + 1), layer
    the 0-based block index (a looped block keeps its own). The record: true."""
    xsa_last_n: int = 0
    """XSA in the last xsa_last_n layers: each head's attention output y at each position loses its component
    along that position's normalized value vector, y - (y . v_hat) v_hat (v of the head's KV group). 0: off. The
    record: 11 (every layer)."""
    skip_gates: bool = False
    """Learned gates on the U-Net skips: x = lerp(w * skip, x, sigmoid(g)), g per channel, 0 at init (an even mix
    of the stream and the weighted skip, where today adds them). The record: true."""
    loop: LoopConfig = field(default_factory=LoopConfig)
    """Depth recurrence (model.loop.start, .end, .num, .enable_at); off by default (num 0)."""
    parallel_start_layer: int | None = None
    """Parallel residual lanes from this (decoder) layer on: attention reads lane 0, the MLP reads lane 1 in
    parallel, and both outputs go into both lanes with learned weights (lane = r * lane + a * attn + m * mlp; r
    1.1, a and m 1 at init); skips go into lane 0; parallel_final_lane picks what reaches the head. null or 0:
    off. The record: 8."""
    parallel_final_lane: ParallelLane = ParallelLane.mean
    """What the head gets from the parallel lanes: mean (of the two), attn (lane 0) or mlp (lane 1). The record:
    mean."""
    smear_gate: SmearGateConfig = field(default_factory=SmearGateConfig)
    """The record's SmearGate with its BOS fix (model.smear_gate.window); off by default (window 0)."""
    attn_out_gate: AttnOutGateConfig = field(default_factory=AttnOutGateConfig)
    """The record's sparse attention output gate (model.attn_out_gate.window, .scale, .init_std); off by default
    (window 0)."""

    def __post_init__(self) -> None:
        # Each set field alone; how they fit together (divisibility, RoPE) is ModelShape's check, once resolved.
        for key in ("vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "mlp_mult", "seq_len"):
            value = getattr(self, key)
            _require(value is None or value >= 1, f"model.{key}={value} must be >= 1 (or null: from the preset)")
        _require(self.vocab_multiple >= 1, f"model.vocab_multiple={self.vocab_multiple} must be >= 1 (1: no padding)")
        _require(self.logit_softcap >= 0, f"model.logit_softcap={self.logit_softcap} must be >= 0 (0 turns it off)")
        _require(math.isfinite(self.qk_gain_init), f"model.qk_gain_init={self.qk_gain_init} must be finite; e.g. 5.0")
        _require(
            self.mlp_leaky_slope >= 0 and math.isfinite(self.mlp_leaky_slope),
            f"model.mlp_leaky_slope={self.mlp_leaky_slope} must be >= 0; e.g. model.mlp_leaky_slope=0.5",
        )
        _require(
            self.rope_dims is None or (self.rope_dims >= 0 and self.rope_dims % 2 == 0),
            f"model.rope_dims={self.rope_dims} must be even and >= 0 (null or 0: every channel); e.g. 16",
        )
        _require(self.xsa_last_n >= 0, f"model.xsa_last_n={self.xsa_last_n} must be >= 0 (0: off); e.g. 11")
        _require(
            self.parallel_start_layer is None or self.parallel_start_layer >= 0,
            f"model.parallel_start_layer={self.parallel_start_layer} must be >= 0 (null or 0: off); e.g. 8",
        )
