"""The model part of the resolver: the preset and explicit fields -> ModelShape, and model.arch -> the class the run
builds (checked against the pipeline's contract now, so a missing method fails before any data is built)."""

from __future__ import annotations

import dataclasses
from typing import Any

from speedrun.config import Config, ModelConfig
from speedrun.config.tree import from_tree
from speedrun.errors import PlanError
from speedrun.hardware.profiles import HardwareProfile
from speedrun.model.registry import model_class, own_options
from speedrun.model.shape import ModelShape
from speedrun.plan.options import load_option


def resolve_model(cfg: Config, profile: HardwareProfile) -> tuple[str, ModelShape]:
    name = cfg.model.name
    model_cfg = cfg.model
    if name == "auto":
        # The profile's preset, with whatever the user set explicitly on top (set fields are not None).
        name = profile.model
        preset = from_tree(ModelConfig, load_option("model", name), f"conf/model/{name}.yaml")
        explicit = {
            f.name: getattr(cfg.model, f.name)
            for f in dataclasses.fields(ModelConfig)
            if f.name != "name" and getattr(cfg.model, f.name) is not None
        }
        model_cfg = dataclasses.replace(preset, **explicit)
    missing = [
        f
        for f in ("n_layer", "d_model", "n_head", "n_kv_head", "mlp_mult", "seq_len", "tie_embeddings")
        if getattr(model_cfg, f) is None
    ]
    if missing:
        raise PlanError(
            f"model={name} leaves {', '.join(missing)} unset; set model.<field>=... or use a preset "
            f"(model=tiny, pgolf_baseline, ...)"
        )
    # Padding only adds ids that never occur in the data: their logits are trained towards -inf like any unused
    # token's, and byte accounting never looks them up (it is indexed by the data's tokens).
    multiple = model_cfg.vocab_multiple
    padded = -(-cfg.data.vocab_size // multiple) * multiple
    vocab = model_cfg.vocab_size or padded
    if vocab != padded:
        padding = (
            f" padded to a multiple of model.vocab_multiple={multiple}: {padded}"
            if padded != cfg.data.vocab_size
            else ""
        )
        raise PlanError(
            f"model.vocab_size={vocab} differs from data.vocab_size={cfg.data.vocab_size}{padding}; leave "
            f"model.vocab_size unset to take the data's"
        )
    shared = {f.name for f in dataclasses.fields(ModelShape)} & {f.name for f in dataclasses.fields(ModelConfig)}
    values = {k: getattr(model_cfg, k) for k in shared if k != "vocab_size"}
    if cfg.quant.logit_rescale and cfg.model.arch != "gpt":
        raise PlanError(
            f"quant.logit_rescale=true rescales the built-in GPT's softcap; model.arch={cfg.model.arch} has none it "
            "knows of: drop quant.logit_rescale"
        )
    return name, ModelShape(vocab_size=vocab, logit_rescale=cfg.quant.logit_rescale, **values)


def resolve_arch(cfg: Config) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """(model.arch, the model's own knobs as sorted items): the class is imported and its contract checked here."""

    model_class(cfg.model.arch)
    return cfg.model.arch, tuple(sorted(own_options(cfg.model).items()))
