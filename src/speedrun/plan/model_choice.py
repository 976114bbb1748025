"""The model part of the resolver: the preset and explicit fields -> ModelShape, and model.arch -> the class the run
builds (checked against the pipeline's contract now, so a missing method fails before any data is built).

A model class is checked against the pipeline's contract (the protocol below) and looked up by name (the registry
below: ``model.arch`` is ``gpt`` or ``package.module:Class``).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from speedrun.config import CONF_DIR, Config, ModelConfig
from speedrun.config.tree import from_tree
from speedrun.core.model import BUILTIN, ModelShape
from speedrun.errors import ConfigError, PlanError
from speedrun.hardware.profiles import HardwareProfile

# ---- presets: an option's YAML read directly, for what ``auto`` resolves to (model=auto, the profile's preset) ----


def known_options(group: str) -> list[str]:
    """The options conf/<group>/ holds (its YAML files' names), sorted; [] for a group that does not exist."""
    folder = CONF_DIR / group
    if group not in _groups() or not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml") if p.is_file())


def _groups() -> set[str]:
    return {p.name for p in CONF_DIR.iterdir() if p.is_dir()}


def load_option(group: str, option: str) -> dict[str, Any]:
    """Read conf/<group>/<option>.yaml (without its defaults list): used to resolve ``auto`` presets. The name is
    checked against the group's own options before it becomes a path: a name read from a run dir's plan.json
    (``../../x/secret``) must never reach a file outside conf/."""
    known = known_options(group)
    if not isinstance(option, str) or option not in known:
        raise PlanError(f"{group}={option!r}: no such option (conf/{group}/ holds {', '.join(known) or 'none'})")
    from omegaconf import OmegaConf  # only for an `auto` option; an exported file's config names its preset

    data = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items() if k != "defaults"}


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
    return name, check_shape(ModelShape(vocab_size=vocab, logit_rescale=cfg.quant.logit_rescale, **values))


MLP_ACTS = ("relu2", "leaky_relu2")
PARALLEL_LANES = ("mean", "attn", "mlp")


def check_shape(shape: ModelShape) -> ModelShape:
    """Refuse a shape the GPT cannot be built with (ConfigError naming the field and the fix): what the model
    group's per-field checks cannot see, the fields against each other. Returns the shape."""
    for name in ("vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "mlp_mult", "seq_len"):
        if getattr(shape, name) < 1:
            raise ConfigError(f"model.{name} must be >= 1, got {getattr(shape, name)}")
    if shape.n_head % shape.n_kv_head:
        divisors = ", ".join(str(k) for k in range(1, shape.n_head + 1) if shape.n_head % k == 0)
        raise ConfigError(
            f"model.n_kv_head={shape.n_kv_head} must divide model.n_head={shape.n_head}; use one of {divisors}"
        )
    if shape.d_model % shape.n_head or (shape.d_model // shape.n_head) % 2:
        raise ConfigError(
            f"model.d_model={shape.d_model} must split into n_head={shape.n_head} heads of even size (RoPE)"
        )
    if shape.logit_softcap < 0:
        raise ConfigError(f"model.logit_softcap must be >= 0 (0 = off), got {shape.logit_softcap}")
    if shape.logit_rescale and not shape.logit_softcap > 0:
        raise ConfigError(
            "quant.logit_rescale=true rescales the logit softcap, which model.logit_softcap=0 turns off; set "
            "model.logit_softcap=30 or drop quant.logit_rescale"
        )

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    n = shape.n_layer
    need(shape.mlp_act in MLP_ACTS, f"model.mlp_act={shape.mlp_act} must be one of {', '.join(MLP_ACTS)}")
    need(
        math.isfinite(shape.mlp_leaky_slope) and shape.mlp_leaky_slope >= 0,
        f"model.mlp_leaky_slope={shape.mlp_leaky_slope} must be >= 0; e.g. model.mlp_leaky_slope=0.5",
    )
    rd = shape.rope_dims
    need(
        not rd or (rd >= 2 and rd % 2 == 0 and rd <= shape.head_dim),
        f"model.rope_dims={rd} must be even and in [2, head_dim={shape.head_dim}] (null or 0: every channel)",
    )
    need(math.isfinite(shape.qk_gain_init), f"model.qk_gain_init={shape.qk_gain_init} must be finite")
    need(
        shape.qk_norm or shape.qk_gain_init == 1.5,
        f"model.qk_gain_init={shape.qk_gain_init} is the gain after QK-norm; set model.qk_norm=true or drop it",
    )
    need(0 <= shape.xsa_last_n <= n, f"model.xsa_last_n={shape.xsa_last_n} must be in [0, n_layer={n}] (0: off)")
    lp = shape.loop
    if lp.on:
        need(
            0 <= lp.start <= lp.end < n,
            f"model.loop.start={lp.start} and model.loop.end={lp.end} must satisfy 0 <= start <= end < n_layer={n}",
        )
    need(lp.num >= 0, f"model.loop.num={lp.num} must be >= 0 (0: off)")
    need(0 <= lp.enable_at < 1, f"model.loop.enable_at={lp.enable_at} must be in [0, 1)")
    need(
        shape.parallel_final_lane in PARALLEL_LANES,
        f"model.parallel_final_lane={shape.parallel_final_lane} must be one of {', '.join(PARALLEL_LANES)}",
    )
    psl = shape.parallel_start_layer
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
            _, decoder = shape.layer_order(looped=True)
            need(
                psl in decoder,
                f"model.parallel_start_layer={psl} falls in the encoder half once model.loop is on; raise it",
            )
    w = shape.smear_gate.window
    need(0 <= w <= shape.d_model, f"model.smear_gate.window={w} must be in [0, d_model={shape.d_model}] (0: off)")
    g = shape.attn_out_gate
    need(
        0 <= g.window <= shape.d_model,
        f"model.attn_out_gate.window={g.window} must be in [0, d_model={shape.d_model}] (0: off)",
    )
    need(math.isfinite(g.scale), f"model.attn_out_gate.scale={g.scale} must be finite")
    need(g.init_std >= 0, f"model.attn_out_gate.init_std={g.init_std} must be >= 0 (0: zeros)")
    return shape


def resolve_arch(cfg: Config) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """(model.arch, the model's own knobs as sorted items): the class is imported and its contract checked here."""

    model_class(cfg.model.arch)
    return cfg.model.arch, tuple(sorted(own_options(cfg.model).items()))


def model_keys(shape: ModelShape) -> dict[str, Any]:
    """Every record lever's value, ``model_``-prefixed and flat, for result.json and the results row (the full
    shape is in plan.json)."""
    return {
        "model_mlp_act": shape.mlp_act,
        "model_mlp_leaky_slope": shape.mlp_leaky_slope,
        "model_rope_dims": shape.rope_dims or None,
        "model_ln_scale": shape.ln_scale,
        "model_qk_gain_init": shape.qk_gain_init,
        "model_xsa_last_n": shape.xsa_last_n,
        "model_skip_gates": shape.skip_gates,
        "model_loop_start": shape.loop.start,
        "model_loop_end": shape.loop.end,
        "model_loop_num": shape.loop.num,
        "model_loop_enable_at": shape.loop.enable_at,
        "model_parallel_start_layer": shape.parallel_start_layer or None,
        "model_parallel_final_lane": shape.parallel_final_lane,
        "model_smear_gate_window": shape.smear_gate.window,
        "model_attn_out_gate_window": shape.attn_out_gate.window,
        "model_attn_out_gate_scale": shape.attn_out_gate.scale,
        "model_attn_out_gate_init_std": shape.attn_out_gate.init_std,
    }


# ---- the contract a model class meets ----------------------------------------------------------------------------
# What the pipeline needs of a model: the contract a model named by ``model.arch`` must meet.
#
# The built-in GPT (speedrun.core.model.GPT) is one implementation; a model of your own is another (docs/extending.md).
# The registry (below) checks a class against this contract when the run starts, before any data
# is built, and names every missing piece.
#
# Who uses what:
# - training: ``forward(idx, targets)`` -> the mean loss (a 0-d tensor) to backpropagate;
# - evaluation and TTT: ``forward(idx, targets, reduction="none")`` -> per-token nats, shape (B, T);
# - the optimizers: ``param_groups()`` -> {"matrix": [...], "scalar": [...], "embed": [...], "head": [...]}; Muon
#   takes the 2-D block matrices ("matrix"), Adam the rest (an empty group is fine, an unknown key is refused);
# - ``kernel.compile_scope=blocks``: ``blocks`` (an nn.ModuleList compiled one by one) and ``head(x, targets,
#   reduction)`` (final norm, logits, loss), with ``compiled_regions(blocks, head)`` a context manager under which
#   ``forward`` calls the compiled copies; TTT also passes a head of its own that runs the model's head at a
#   chunk's columns only, so ``forward`` must return what the given head returns, and ``head`` must work position
#   by position (its input is some columns of each row, not the whole sequence);
# - optional: ``supports_pick`` True (a class attribute, or a property: the built-in GPT's depends on its attention
#   backend's ``plain_softmax``) says that ``forward(idx, targets, reduction, pick=cols)`` returns what the whole
#   forward returns at the (B, G) columns ``cols`` only, in their order: (B, G) losses, their mean with
#   reduction="mean", (B, G, V) logits without targets. Columns may repeat, and G may exceed T (TTT clamps a
#   chunk's columns to the window). TTT then asks for the chunk's columns itself, so the model may skip what no
#   picked column needs (the built-in GPT runs its last layer call's queries, output projection and MLP there only);
# - GPTQ, fp8 and TTT address the linears inside ``blocks`` by name (``<i>.attn.c_q``, ``<i>.attn.c_k``,
#   ``<i>.attn.c_v``, ``<i>.attn.proj``, ``<i>.mlp.fc``, ``<i>.mlp.proj``; GPTQ takes any 2-D weight it finds): a model whose blocks name them otherwise
#   trains and evaluates, and those features refuse it by name; TTT's bypass adapters wrap ``<i>.attn`` and
#   ``<i>.mlp``, and its ``head`` target sets a ``head_adapter`` attribute that ``head`` must add to the logits
#   (speedrun.core.model.GPT.head; a model without the attribute is refused ttt.targets=head); ttt.shared_attn_a
#   sets an ``adapter`` attribute on ``<i>.attn`` (speedrun.core.model.CausalSelfAttention.adapter), refused without;
# - the record: ``num_params()``; MFU: the FLOPs per token of the shape (speedrun.core.model.ModelShape), unless the
#   class defines ``flops_per_token(shape, seq_len)`` for a different arithmetic.
#
# A model is constructed as ``cls(shape, attention, bos_id=..., doc_bos_id=..., fused_qkv=..., options=...)``:
# ``shape`` the resolved ModelShape, ``attention`` the backend the plan picked (call it as ``attention(q, k, v,
# ctx)``; it never changes during a run), ``bos_id`` the document separator when the plan masks documents (else
# None), ``doc_bos_id`` the separator token always, ``options`` the model's own knobs (its schema's fields beyond
# speedrun.config.model.ModelConfig's) as a dict.


REQUIRED = ("forward", "head", "blocks", "param_groups", "compiled_regions", "num_params")
"""Attributes a model class must have (``blocks`` may be created in __init__: it is checked on the instance)."""
CLASS_REQUIRED = ("forward", "head", "param_groups", "compiled_regions", "num_params")
"""The methods checked on the class itself, before it is built."""
PARAM_GROUPS = ("matrix", "scalar", "embed", "head")


@runtime_checkable
class SpeedrunModel(Protocol):
    blocks: Any

    def forward(self, idx: Any, targets: Any = None, reduction: str = "mean") -> Any: ...

    def head(self, x: Any, targets: Any, reduction: str = "mean") -> Any: ...

    def param_groups(self) -> dict[str, list[Any]]: ...

    def compiled_regions(self, blocks: tuple, head: object) -> Iterator[None]: ...

    def num_params(self) -> int: ...


def missing_methods(cls: type) -> list[str]:
    """The contract's methods ``cls`` lacks (not callable or absent), in the contract's order."""
    return [name for name in CLASS_REQUIRED if not callable(getattr(cls, name, None))]


def check_instance(model: Any, arch: str) -> None:
    """After construction: ``blocks`` exists and param_groups() uses only the known groups."""
    if not hasattr(model, "blocks"):
        raise PlanError(f"model.arch={arch}: the built model has no `blocks` (an nn.ModuleList of its layers)")
    unknown = sorted(set(model.param_groups()) - set(PARAM_GROUPS))
    if unknown:
        raise PlanError(
            f"model.arch={arch}: param_groups() returned unknown groups {unknown}; use {', '.join(PARAM_GROUPS)}"
        )


# ---- the registry ------------------------------------------------------------------------------------------------
# The model registry: ``model.arch`` names a model class, looked up once when the run is built.
#
# ``model.arch`` is a registered name (``gpt``, the built-in) or ``"package.module:Class"``, like the attention
# backends' registry. A class may carry its own knobs as a ``config`` attribute: a dataclass that subclasses
# speedrun.config.model.ModelConfig and adds typed fields. ``register_model_schema`` puts that dataclass in
# Hydra's ConfigStore as the model group's schema before Hydra composes, so ``model.my_knob=3`` is checked like any
# built-in field and a misspelt key still fails at compose time; the runner hands the extra fields to the model's
# constructor as ``options``.


def class_path(arch: str) -> str:
    return BUILTIN.get(arch, arch)


def model_class(arch: str) -> type:
    """The class ``arch`` names, checked against the pipeline's contract; PlanError naming what is wrong."""
    path = class_path(arch)
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise PlanError(f"model.arch={arch}: not a registered model ({', '.join(BUILTIN)}) nor 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PlanError(f"model.arch={arch}: cannot import {module_name} ({e}); is its package installed?") from e
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise PlanError(f"model.arch={arch}: {module_name} has no class {attr}")
    missing = missing_methods(cls)
    if missing:
        raise PlanError(
            f"model.arch={arch}: {cls.__name__} lacks {', '.join(missing)}, which the pipeline calls "
            f"(speedrun.plan.model_choice says what each is for)"
        )
    return cls


def model_schema(cls: type) -> type | None:
    """The class's own config dataclass (a ModelConfig subclass), or None for a model without knobs of its own."""
    schema = getattr(cls, "config", None)
    if schema is None:
        return None
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema) and issubclass(schema, ModelConfig)):
        raise ConfigError(f"{cls.__name__}.config must be a dataclass subclassing speedrun.config.model.ModelConfig")
    return schema


def own_options(config: Any) -> dict[str, Any]:
    """The fields a model's schema adds to ModelConfig's, with their values: what the model gets as ``options``."""
    base = {f.name for f in dataclasses.fields(ModelConfig)}
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in base}


def arch_from_argv(argv: list[str]) -> str | None:
    """``model.arch=...`` on the command line (its last value), read before Hydra composes."""
    found = None
    for arg in argv[1:]:
        for prefix in ("model.arch=", "++model.arch=", "+model.arch="):
            if arg.startswith(prefix):
                found = arg[len(prefix) :].strip("'\"")
    return found


def arch_schema(arch: str | None) -> type | None:
    """``model.arch``'s own schema (None for a built-in model or one without knobs); PlanError for an arch that
    cannot be imported."""
    return None if not arch or arch in BUILTIN else model_schema(model_class(arch))


def register_model_schema(arch: str | None) -> None:
    """Make ``arch``'s own schema the model group's (``/model_schema``), so its knobs compose. A built-in model or
    one without a schema changes nothing; an arch that cannot be imported is left to the resolver's error."""
    try:
        schema = arch_schema(arch)
    except PlanError:
        return  # reported, with its reason, when the run resolves
    if schema is not None:
        from hydra.core.config_store import ConfigStore

        ConfigStore.instance().store(name="model_schema", node=schema)
