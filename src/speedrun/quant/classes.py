"""Which class a state-dict tensor belongs to, by its name: what picks its clip sigma (quant.sigmas), its bits, the
group its bytes are compressed in (quant.compressor=pergroup) and its line in the per-tensor report.

    attn    a linear inside an attention module: ``blocks.<i>.attn.{c_q,c_k,c_v,proj}.weight``
    mlp     a linear inside an MLP module: ``blocks.<i>.mlp.{fc,proj}.weight``
    embed   the token embedding ``tok_emb.weight`` and an untied ``lm_head.weight``
    gate    the small gate tensors: a name containing ``gate`` (``blocks.<i>.attn.attn_gate_w``, ``skip_gates``)
            and the smear gate's ``smear_w``; checked before attn, whose module holds attn_gate_w
    matrix  any other 2-D tensor the export quantizes (a model of one's own may name its linears otherwise)

The names are the built-in GPT's and the protocol's (speedrun.model.protocol): blocks address their linears as
``attn.*`` and ``mlp.*``. Everything else small stays float and is reported as ``float``.
"""

from __future__ import annotations

EMBED_NAMES = ("tok_emb.weight", "lm_head.weight")
"""The embedding class: input and (untied) output embedding tables."""
GATE_MARKERS = ("gate", "smear_w")
"""Substrings that make a parameter a gate (quant.gate_bits): the record's quantized gates are its attn_gate_w; the
smear gate's weight is called smear_w here (the record's smear_gate.weight)."""


def is_gate(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return any(marker in leaf for marker in GATE_MARKERS)


def tensor_class(name: str) -> str:
    """attn, mlp, embed, gate or matrix (see the module docstring); the caller decides whether it is quantized."""
    if is_gate(name):
        return "gate"
    if name in EMBED_NAMES:
        return "embed"
    if ".attn." in f".{name}":
        return "attn"
    if ".mlp." in f".{name}":
        return "mlp"
    return "matrix"
