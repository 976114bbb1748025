"""The finished runs an export reads, and what it refuses to export.

A run dir gives its result.json, its resolved config (from the train_gpt.py the wrapped rule wrote, else from
.hydra/config.yaml) and its log. Several runs export as one submission only when they are seeds of one run: the
same config but for the seed (and bookkeeping such as the sweep id), made from the same code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedrun.finishing.artifact import WRAPPED_FILE
from speedrun.finishing.wrap import read_wrapper
from speedrun.records.identity import SWEEP_REUSE_IGNORED

BOOKKEEPING = ("seed", "name", *SWEEP_REUSE_IGNORED)
"""Top-level config keys seeds of one submission may differ in: the seed, and what changes none of a run's numbers
(its label, sweep id, logger, results database, checkpointing, resume; records.identity.SWEEP_REUSE_IGNORED)."""


class ExportError(ValueError):
    """A run that cannot be exported as asked; the message names the run and the fix."""


@dataclass
class Run:
    dir: Path
    result: dict[str, Any]
    config: dict[str, Any]
    wrapper: bytes | None = None
    """<run>/train_gpt.py (the wrapped rule), or None (a raw-rule run: the export builds one)."""
    files: dict[str, str] = field(default_factory=dict)
    """The code packed in ``wrapper`` ({path: minified source}); empty without one."""

    @property
    def seed(self) -> int:
        return int(self.config["seed"])

    @property
    def log(self) -> Path:
        return self.dir / "run.log"

    def overrides(self) -> list[str]:
        """The command-line overrides `python -m run` was given (.hydra/overrides.yaml), [] when unknown."""
        path = self.dir / ".hydra" / "overrides.yaml"
        if not path.is_file():
            return []
        from omegaconf import OmegaConf

        return [str(o) for o in OmegaConf.load(path)]

    def env(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / "env.json").read_text())
        except (OSError, ValueError):
            return {}


def expand(paths: list[Path]) -> list[Path]:
    """Run dirs from the command line: a run dir as it is, a sweep dir as its jobs' run dirs (in job order)."""
    out: list[Path] = []
    for path in paths:
        if (path / "result.json").is_file():
            out.append(path)
            continue
        found = [p.parent for p in path.glob("*/result.json")]
        jobs = sorted(found, key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name))
        if not path.is_dir() or not jobs:
            raise ExportError(f"{path} is neither a run dir (no result.json) nor a sweep dir of run dirs")
        out.extend(jobs)
    return out


def load_run(path: Path) -> Run:
    result = json.loads((path / "result.json").read_text())
    wrapped = path / WRAPPED_FILE
    if wrapped.is_file():
        data = wrapped.read_bytes()
        try:
            files, meta = read_wrapper(data)
        except (ValueError, SyntaxError) as e:  # another tool's file, or one from another speedrun format
            raise ExportError(f"{wrapped} cannot be read ({e}); re-run {path} with this speedrun") from None
        if not meta.get("config"):
            raise ExportError(f"{wrapped} carries no config; re-run {path} or export another run")
        return Run(path, result, meta["config"], data, files)
    return Run(path, result, _hydra_config(path))


def _hydra_config(path: Path) -> dict[str, Any]:
    """The composed config of a run that wrote no train_gpt.py, resolved as the run resolved it."""
    composed = path / ".hydra" / "config.yaml"
    if not composed.is_file():
        raise ExportError(f"{path} has neither {WRAPPED_FILE} nor .hydra/config.yaml: no config to re-run")
    from omegaconf import OmegaConf

    from speedrun.config import register_configs
    from speedrun.training.resume import register_resolvers

    register_configs()  # the resolvers the composed YAML may still name (debug=smoke's depth, resume's paths)
    register_resolvers()
    tree = OmegaConf.to_container(OmegaConf.load(composed), resolve=True, enum_to_str=True)
    assert isinstance(tree, dict)
    return {str(k): v for k, v in tree.items()}


def check_runs(runs: list[Run], force: bool) -> None:
    """Raise ExportError for what must not become a submission: a run not ok, over its cap or scored in part (unless
    ``force``), runs that are not seeds of one config, two runs of one seed, code the file cannot carry."""
    for run in runs:
        r = run.result
        if r.get("status") != "ok" and not force:
            raise ExportError(
                f"{run.dir}: status {r.get('status')} ({r.get('error')}); export finished runs, or pass --force to "
                "export it anyway"
            )
        if r.get("artifact_ok") is not True and not force:
            why = (
                f"its artifact is {r.get('artifact_bytes'):,} bytes, over its cap"
                if r.get("artifact_ok") is False
                else "it wrote no artifact (quant=off)"
            )
            raise ExportError(f"{run.dir}: {why}; a submission must fit the cap, or pass --force to export it anyway")
        partial = [k for k in ("eval_complete", "eval_complete_quant") if r.get(k) is False]
        if partial and not force:
            raise ExportError(
                f"{run.dir}: its score is partial ({', '.join(partial)} false: eval.max_seconds ran out after "
                f"{r.get('val_tokens_scored')} of {r.get('val_tokens_total')} tokens); a submission scores the whole "
                "split: raise eval.max_seconds and run again, or pass --force to export it anyway"
            )
        arch = run.config.get("model", {}).get("arch", "gpt")
        if arch != "gpt":
            raise ExportError(
                f"{run.dir}: model.arch={arch} lives outside speedrun, and train_gpt.py carries speedrun's code only; "
                "export runs of the built-in model (model.arch=gpt)"
            )
    first = runs[0]
    for run in runs[1:]:
        differing = config_diff(first.config, run.config)
        if differing:
            raise ExportError(
                f"{run.dir} and {first.dir} differ in {', '.join(differing)}: a submission's runs are seeds of one "
                "config; export them apart"
            )
        if run.files and first.files and run.files != first.files:
            raise ExportError(f"{run.dir} and {first.dir} ran different code; export them apart")
    seeds = [run.seed for run in runs]
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise ExportError(f"seed(s) {twice} appear in more than one run; export one run per seed")


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two config trees, BOOKKEEPING keys left out."""
    flat_a, flat_b = _flatten(a), _flatten(b)
    keys = sorted(set(flat_a) | set(flat_b))
    return [k for k in keys if k.split(".")[0] not in BOOKKEEPING and flat_a.get(k) != flat_b.get(k)]


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flatten(value, f"{prefix}{key}."[: None if isinstance(value, dict) else -1]))
    return out
