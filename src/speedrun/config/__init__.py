"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Each YAML under conf/<group>/ starts its defaults list with ``/<group>_schema``, so Hydra validates it against
the dataclass here: a misspelt key or a wrong type fails at compose time with Hydra's own message, before any
work is done. ``None`` on a field means "let the resolver (speedrun.plan) pick it for the detected hardware".

Fixed value sets are Enums (config.choices), so Hydra lists the valid values when one is misspelt. Checks that
need no device sit beside their fields, in ``__post_init__`` (run by ``to_config``, before anything is built);
checks that need the device are the resolver's (speedrun.plan). One module per family of groups: training.py
(what trains), finishing.py (eval, TTT, quantization, logging).

Only run.py sees a DictConfig; the run takes its plain tree and ``config_from_tree`` turns it into these dataclasses
without OmegaConf (``to_config``, OmegaConf's own merge, serves compose-time tools), and ``speedrun.plan.resolve``
turns those into the frozen Plan that everything after it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from speedrun.config.checkpointing import CheckpointConfig
from speedrun.config.choices import *  # noqa: F403 - the Enums are part of the schema's public names
from speedrun.config.code_rule import ArtifactConfig, CodeRule
from speedrun.config.distributed import DistConfig
from speedrun.config.finishing import EvalConfig, LoggerConfig, PhasedTTTConfig, QuantConfig, TTTConfig
from speedrun.config.kernel import KernelConfig
from speedrun.config.model import ModelConfig
from speedrun.config.track import AcceptanceConfig, TrackConfig
from speedrun.config.training import (
    AttnConfig,
    BudgetConfig,
    DataConfig,
    EMAConfig,
    HardwareConfig,
    OptimConfig,
    PrecisionConfig,
    ScheduleConfig,
)
from speedrun.config.tree import from_tree
from speedrun.errors import ConfigError
from speedrun.paths import CONF_DIR, DEFAULT_RESULTS_DB

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = [
    "CONF_DIR",
    "Config",
    "GROUPS",
    "register_configs",
    "to_config",
    "config_from_tree",
    "ArtifactConfig",
    "AttnConfig",
    "BudgetConfig",
    "CheckpointConfig",
    "CodeRule",
    "DataConfig",
    "DistConfig",
    "EMAConfig",
    "EvalConfig",
    "HardwareConfig",
    "KernelConfig",
    "LoggerConfig",
    "ModelConfig",
    "OptimConfig",
    "PhasedTTTConfig",
    "PrecisionConfig",
    "QuantConfig",
    "ScheduleConfig",
    "TTTConfig",
    "TrackConfig",
    "AcceptanceConfig",
]


@dataclass
class Config:
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    attn: AttnConfig = field(default_factory=AttnConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    """Weight EMA (a plain key, not a group: ema.decay=0.9965); off by default."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    ttt: TTTConfig = field(default_factory=TTTConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    kernel: KernelConfig = field(default_factory=KernelConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    artifact: ArtifactConfig = field(default_factory=ArtifactConfig)
    """How the artifact's code is counted (a plain key, not a group: artifact.code_rule=raw); wrapped by default."""
    dist: DistConfig = field(default_factory=DistConfig)
    track: TrackConfig = field(default_factory=TrackConfig)
    """A contest's rules the run is held to (conf/track/; none by default): speedrun.config.track."""
    seed: int = 0
    """Seed for model initialisation, TTT's adapter init and document order. It does not change the training data
    order: every run reads the shards in the same order from the same position."""
    name: str = "default"
    """A label for this run, stored with its record."""
    results_db: str = DEFAULT_RESULTS_DB
    """Results database (relative paths are taken from the directory `python -m run` was started in)."""
    sweep: str | None = None
    """Sweep id, set by multirun; recorded with each run."""
    objective: str = "val_bpb"
    """The result key ``python -m run`` returns to Hydra's sweeper, for adaptive sweeps (``hydra/sweeper=optuna``),
    which minimise it; a run that is not ok returns the worst value. Checked where it is read, before any run
    (speedrun.config.objective: the keys), not here: a re-run of an exported train_gpt.py never reads it."""
    resume: str | None = None
    """A run dir to continue from its latest checkpoint, to its original budget, recorded in the same row:
    `python -m run resume=<run dir>`. The run's own config is used (speedrun.run.resume)."""
    accept_code_change: bool = False
    """With resume (or a requeued job's auto-resume): continue a checkpoint written by other code than this (another
    code_fingerprint). Off: such a resume is refused, naming both fingerprints; on: the row records the change
    (``resume_code_change``), and a sweep never reuses the run as this code's."""

    def __post_init__(self) -> None:
        # checks across groups (each group's own sit in its __post_init__, run before this one)
        target = self.budget.target
        if target is not None and not (self.eval.every_steps or self.eval.every_seconds):
            raise ConfigError(
                f"budget.target_{target[0]}={target[1]:g} is checked at periodic evaluations, and none is set: add "
                "eval.every_steps=N or eval.every_seconds=S (the clock pauses during them)"
            )
        track = self.track.compose_problems(str(self.data.name), str(self.quant.name), self.eval.max_seconds, target)
        if track:
            raise ConfigError(f"track={self.track.name} cannot accept this run: " + "; ".join(track))
        if self.track.on and self.track.eval_seconds is not None:
            # scoring the unadapted model beside TTT is a diagnostic that spends the track's evaluation time
            self.ttt.score_base = False


GROUPS = {
    "hardware": HardwareConfig,
    "attn": AttnConfig,
    "precision": PrecisionConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "eval": EvalConfig,
    "ttt": TTTConfig,
    "quant": QuantConfig,
    "logger": LoggerConfig,
    "dist": DistConfig,
    "kernel": KernelConfig,
    "track": TrackConfig,
}


def register_configs() -> None:
    """Register the top-level schema and one ``<group>_schema`` per group (idempotent).

    The group schemas are top-level configs, not options inside their groups: Hydra lists every config of a group
    as an option (``python -m run --help``, and its "available options" when a choice is misspelt), and a schema
    is no option. The group's YAMLs name theirs with an absolute path (``- /attn_schema``), which Hydra places at
    the YAML's own package, the group."""
    from hydra.core.config_store import ConfigStore  # compose time only: a re-run needs no Hydra
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for group, schema in GROUPS.items():
        cs.store(name=f"{group}_schema", node=schema)
    OmegaConf.register_new_resolver("speedrun_smoke_layers", smoke_layers, replace=True)
    OmegaConf.register_new_resolver("speedrun_half_head_dim", half_head_dim, replace=True)


def half_head_dim(d_model: int, n_head: int) -> int:
    """Half of a head's channels (d_model / n_head / 2): a recipe that rotates half of each head with RoPE, as
    modded-nanogpt does (experiment=mng_124m's model.rope_dims), keeps doing so when debug=smoke shrinks the heads."""
    return int(d_model) // int(n_head) // 2


def smoke_layers(loop_num: int, loop_start: int, loop_end: int, parallel_start: int | None) -> int:
    """debug=smoke's depth: 2 blocks, or the fewest that keep the recipe's depth levers as set (conf/debug/smoke.yaml
    calls it). A loop of layers start..end needs end + 1 blocks; parallel lanes from layer k need k after the loop
    and in the decoder half of the layer order (the looped order when the loop is on: model/shape.py's
    layer_order)."""
    for n in range(2, 2 * (max(loop_end, parallel_start or 0) + 2)):
        if loop_num and loop_end >= n:
            continue
        if parallel_start is not None:
            order = list(range(n))
            if loop_num:
                loop = list(range(loop_start, loop_end + 1))
                order = list(range(loop_start)) + loop * (loop_num + 1) + list(range(loop_end + 1, n))
            decoder = order[len(order) // 2 :]
            if not (n // 2 <= parallel_start < n and parallel_start in decoder and parallel_start > loop_end):
                continue
        return n
    return 2


def to_config(cfg: DictConfig | dict[str, Any]) -> Config:
    """A composed DictConfig (or plain dict) -> typed Config, validated against the schemas by OmegaConf (compose
    time and tools; the run's own path takes config_from_tree)."""
    from omegaconf import OmegaConf  # compose time only: the run's path builds its Config without it

    structured = OmegaConf.merge(OmegaConf.structured(Config), cfg)
    obj = OmegaConf.to_object(structured)
    assert isinstance(obj, Config)
    return obj


def config_from_tree(tree: dict[str, Any], model_schema: type | None = None) -> Config:
    """A resolved config tree (plain values, Enums as their names) -> typed Config, without OmegaConf: what the run
    builds its Config from, whether Hydra composed the tree or an exported train_gpt.py carries it. ``model_schema``:
    a model.arch's own ModelConfig subclass (speedrun.plan.model_choice.arch_schema), whose knobs the model holds."""
    if model_schema is not None and isinstance(tree.get("model"), dict):
        tree = {**tree, "model": from_tree(model_schema, tree["model"], "model")}
    return from_tree(Config, tree)
