"""The GPT of parameter-golf's baseline family.

Per block (pre-norm, no biases, parameter-free RMSNorm):
    x = resid_mix[0] * x + resid_mix[1] * x0            # learnable mix with the embedding x0
    x = x + attn_scale * attn(norm(x))                  # GQA, QK-norm, RoPE, per-head q gain
    x = x + mlp_scale * mlp(norm(x))                    # relu(x W_fc)^2 W_proj
The first half of the blocks ("encoder") pushes its outputs on a stack; each block of the second half first adds
skip_weights[i] * stack.pop() (U-Net style). Output projections (attn proj, mlp proj, untied lm_head) start at zero.
logits = softcap * tanh(logits / softcap), cross-entropy in fp32. The block, its attention and its MLP are in
speedrun.model.blocks; this module is the model around them.

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
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from speedrun.model.attention.base import AttentionBackend, allowed_keys, document_ids
from speedrun.model.blocks import MLP, Block, CausalSelfAttention, Columns, bias_free_linear
from speedrun.model.layers import apply_partial_rope, apply_rope, rms_norm, rope_tables, xsa
from speedrun.model.shape import ModelShape


def _residual_dtype(device_type: str) -> torch.dtype:
    """bf16 under bf16 autocast (as parameter-golf), else fp32. Reads autocast state, not tensor values, so it
    is compile-safe. A bf16 stream halves the traffic of every elementwise kernel."""
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16:
        return torch.bfloat16
    return torch.float32


class GPT(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(
        self,
        shape: ModelShape,
        attention: AttentionBackend,
        bos_id: int | None = None,
        fused_qkv: bool = False,
        doc_bos_id: int | None = None,
        options: dict | None = None,
    ):
        """attention: the backend every layer calls (speedrun.model.attention.get_backend). bos_id: mask attention at
        document boundaries (documents start at BOS); None attends across documents, as parameter-golf does.
        fused_qkv: one q/k/v matmul per block in training mode (CausalSelfAttention.fused_qkv). doc_bos_id: the BOS
        token, for what must not cross documents without masking attention (model.smear_gate; bos_id if None).
        options: a registered model's own knobs (speedrun.model.registry); the built-in GPT's levers are ModelShape
        fields, so it takes none."""
        super().__init__()
        if options:
            raise ValueError(f"the built-in GPT takes no options of its own: {sorted(options)}")
        if bos_id is not None and not attention.supports_doc_mask:
            raise ValueError(
                f"document masking (bos_id={bos_id}) needs an attention backend that supports it "
                f"(flex, math); {attention.kernel!r} does not"
            )
        self.shape, self.attention, self.bos_id = shape, attention, bos_id
        self.tok_emb = nn.Embedding(shape.vocab_size, shape.d_model)
        self.num_encoder_layers = shape.n_layer // 2
        self.num_decoder_layers = shape.n_layer - self.num_encoder_layers
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
            if self.smear_bos_id is None:
                raise ValueError(
                    "model.smear_gate needs the BOS token id (GPT(doc_bos_id=...)): it must not smear a document's "
                    "last token into the next document's first"
                )
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
        on the output head (speedrun.ttt.lora), set only on TTT's own copy of the model. The head's weight is
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
        to 2,048 of context (speedrun.ttt.score_first), so that call runs at 48 columns instead of up to 2,048."""
        B, T = idx.shape
        if T > self.shape.seq_len:
            raise ValueError(f"sequence length {T} exceeds model.seq_len {self.shape.seq_len}")
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
        """forward takes ``pick`` (speedrun.model.protocol, an optional part of the contract): over a backend whose
        attention an explicit mask rebuilds exactly (AttentionBackend.plain_softmax; the built-in ones)."""
        return bool(getattr(self.attention, "plain_softmax", False))

    def _columns(self, idx: torch.Tensor, pick: torch.Tensor) -> Columns:
        """The picked columns with the mask their queries attend with: the backend's rule (allowed_keys: causal,
        its window, the document when bos_id masks documents), for queries at those columns."""
        if not self.supports_pick:
            raise ValueError(
                f"GPT.forward(pick=...) rebuilds attention with an explicit mask, which attention backend "
                f"{self.attention.kernel!r} does not declare exact (AttentionBackend.plain_softmax); call forward "
                "without pick and take the columns after"
            )
        pos = torch.arange(idx.size(1), device=idx.device)
        q_docs = k_docs = None
        if self.bos_id is not None:
            doc = document_ids(idx, self.bos_id)
            q_docs, k_docs = doc.gather(1, pick)[:, :, None], doc[:, None, :]
        allowed = allowed_keys(pick[:, :, None], pos[None, None, :], self.attention.window, q_docs, k_docs)
        return Columns(pick, allowed[:, None])

    def head(self, x: torch.Tensor, targets: torch.Tensor | None, reduction: str = "mean"):
        """Final norm, logits, softcap and loss of the residual stream x (B, T, C): forward's return value."""
        B, T = x.shape[:2]
        x = rms_norm(x)
        weight = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
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
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
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


__all__ = [
    "GPT",
    "MLP",
    "Block",
    "CausalSelfAttention",
    "Columns",
    "rms_norm",
    "apply_rope",
    "apply_partial_rope",
    "rope_tables",
    "xsa",
]
