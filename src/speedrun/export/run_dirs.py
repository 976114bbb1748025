"""The finished runs an export reads, and what it refuses to export.

A run dir gives its result.json, its resolved config (from the train_gpt.py the wrapped rule wrote, else from
.hydra/config.yaml) and its log. Several runs export as one submission only when they are seeds of one run: the
same config but for the seed (and bookkeeping such as the sweep id), made from the same code.

A run dir is data, possibly from another machine or person: nothing in it is resolved against this machine. A
stored config's interpolations are refused (unless they only do arithmetic on the config's own values,
PURE_RESOLVERS), since `${oc.env:...}` and the like would put this machine's environment or files into the
published folder; and the train_gpt.py shipped must be the file the run wrote (the sha256 in its result.json).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedrun.artifact.code_count import HUMAN_FILE, WRAPPED_FILE
from speedrun.artifact.wrap import unwrap_payload
from speedrun.config import register_configs
from speedrun.records.identity import SWEEP_REUSE_IGNORED
from speedrun.records.rundir import is_regular, read_bytes, read_text, symlink_problem
from speedrun.records.store import CONTRACT_TYPES

BOOKKEEPING = ("seed", "name", *SWEEP_REUSE_IGNORED)
"""Top-level config keys seeds of one submission may differ in: the seed, and what changes none of a run's numbers
(its label, sweep id, logger, results database, checkpointing, resume; records.identity.SWEEP_REUSE_IGNORED)."""


PURE_RESOLVERS = ("speedrun_smoke_layers", "speedrun_half_head_dim")
"""Resolvers a stored config may call (speedrun.config.register_configs): arithmetic on other values of the same
config (conf/debug/smoke.yaml's depth, conf/experiment/mng_124m.yaml's RoPE width). Any other resolver (oc.env,
oc.decode, now, hydra, ...) reads the exporting machine's environment, files or clock, and is refused."""

_INTERPOLATION = re.compile(r"\$\{")
_ALLOWED = re.compile(r"\$\{(?:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\}|(?:" + "|".join(PURE_RESOLVERS) + r"):)")
"""Where an interpolation starts, and the starts allowed there: a plain reference to another key (``${model.n_layer}``)
or a call of a PURE_RESOLVERS resolver (its arguments are checked at their own ``${``)."""

CODE_SHA_KEY = "artifact_code_sha256"
"""The result key holding the sha256 of the train_gpt.py the run wrote (speedrun.artifact.code_count)."""


NUMERIC = tuple(k for k, t in CONTRACT_TYPES.items() if t in ("REAL", "INTEGER"))
"""result.json keys the export computes with (and *_bytes): a number or null in a record speedrun wrote."""


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
    code_problem: str | None = None
    """Why the shipped train_gpt.py is not shown to be the run's, when --force exported it anyway (check_runs)."""

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

        # as typed on the command line, never resolved: iterating the loaded list would resolve `${...}` here
        listed = OmegaConf.to_container(OmegaConf.create(read_text(path)), resolve=False)
        return [str(o) for o in listed] if isinstance(listed, list) else []

    def env(self) -> dict[str, Any]:
        try:
            return json.loads(read_text(self.dir / "env.json"))
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
    links = symlink_problem(path)
    if links is not None:  # a link would publish (or read) a file from outside the run dir
        raise ExportError(links)
    try:
        result = json.loads(read_text(path / "result.json"))
    except (OSError, ValueError) as e:
        raise ExportError(f"{path / 'result.json'} cannot be read ({e}); export another run") from None
    if not isinstance(result, dict):
        raise ExportError(f"{path / 'result.json'} is not a result record (a JSON object); export another run")
    for key, value in result.items():
        if (key in NUMERIC or key.endswith("_bytes")) and value is not None:
            if not isinstance(value, (int, float)):  # emulated is a bool, an int too
                raise ExportError(
                    f"{path / 'result.json'}: {key} is {_show(str(value))}, not a number; export an untouched run dir"
                )
    wrapped, config = path / WRAPPED_FILE, _hydra_config(path)
    if wrapped.is_file():
        data = read_bytes(wrapped)
        try:
            unwrap_payload(data)
        except ValueError as e:  # another tool's file, or one from another speedrun format
            raise ExportError(f"{wrapped} cannot be read ({e}); re-run {path} with this speedrun") from None
        human = path / HUMAN_FILE
        # the code without its settings (seeds differ there): what "ran the same code" compares
        code = read_text(human).partition("\nPLAN = ")[0] if is_regular(human) else ""
        return Run(path, result, config, data, {HUMAN_FILE: code} if code else {})
    return Run(path, result, config)


def _hydra_config(path: Path) -> dict[str, Any]:
    """The composed config of a run that wrote no train_gpt.py. Its interpolations are resolved only when each one
    refers to another key or calls a PURE_RESOLVERS resolver; any other is refused, naming the key."""
    composed = path / ".hydra" / "config.yaml"
    if not composed.is_file():
        raise ExportError(f"{path} has neither {WRAPPED_FILE} nor .hydra/config.yaml: no config to re-run")
    import yaml  # omegaconf's YAML parser (PyYAML)
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        stored = OmegaConf.create(read_text(composed))
        raw = OmegaConf.to_container(stored, resolve=False, enum_to_str=True)
    except (OmegaConfBaseException, yaml.YAMLError, OSError, ValueError) as e:
        raise ExportError(f"{composed} cannot be read ({_first_line(e)}); export another run") from None
    if not isinstance(raw, dict):
        raise ExportError(f"{composed} is not a config (a mapping); export another run")
    for key, value in _strings(raw):
        for start in _INTERPOLATION.finditer(value):
            if not _ALLOWED.match(value, start.start()):
                raise ExportError(
                    f"{composed}: {key} is {_show(value)}, an interpolation the export never resolves (it would put "
                    f"this machine's environment or files into the submission); write the value it stands for into "
                    f"that file, or re-run with {key} set to a plain value"
                )
    register_configs()  # PURE_RESOLVERS, the only resolvers the checks above let through
    try:
        tree = OmegaConf.to_container(stored, resolve=True, enum_to_str=True)
    except OmegaConfBaseException as e:  # a reference to a key the file lacks (hydra.*, say)
        raise ExportError(f"{composed}: {_first_line(e)}; write the value it stands for into that file") from None
    assert isinstance(tree, dict)
    for key, value in _strings(tree):
        if _INTERPOLATION.search(value):  # an escaped \${...}: text now, but the re-run's OmegaConf would resolve it
            raise ExportError(
                f"{composed}: {key} resolves to {_show(value)}, an interpolation that `python {WRAPPED_FILE}` would "
                f"resolve on the machine that runs it; set {key} to a plain value and re-run"
            )
    return {str(k): v for k, v in tree.items()}


def _strings(tree: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every string in a config tree, in lists too (``key[0]``)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _strings(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _strings(value, f"{prefix}[{i}]")
    elif isinstance(tree, str):
        yield prefix, tree


def _show(value: str, limit: int = 80) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def code_problem(run: Run) -> tuple[str, str] | None:
    """(why, fix) when the run's train_gpt.py cannot be shown to be the file the run wrote: its sha256 and length
    against result.json's artifact_code_sha256 and artifact_code_bytes; None when it is (or the run wrote none: the
    export builds that one, checked by cli.wrapper_for)."""
    if run.wrapper is None:
        return None
    path = run.dir / WRAPPED_FILE
    recorded, count = run.result.get(CODE_SHA_KEY), run.result.get("artifact_code_bytes")
    if not recorded:
        return (
            f"{run.dir}: result.json records no {CODE_SHA_KEY} (the run predates it), so {WRAPPED_FILE} cannot be "
            "checked against the file the run wrote",
            "re-run it",
        )
    actual = hashlib.sha256(run.wrapper).hexdigest()
    if actual != recorded or count != len(run.wrapper):
        return (
            f"{path} is not the file the run wrote: sha256 {actual} ({len(run.wrapper):,} bytes), the run recorded "
            f"{recorded} ({count} bytes)",
            "export an untouched copy of the run dir",
        )
    return None


def check_runs(runs: list[Run], force: bool) -> None:
    """Raise ExportError for what must not become a submission: a run not ok, over its cap, scored in part or whose
    train_gpt.py is not the one it wrote (unless ``force``, which notes the last in run.code_problem), runs that are
    not seeds of one config, two runs of one seed, code the file cannot carry."""
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
        problem = code_problem(run)
        if problem is not None:
            if not force:
                raise ExportError(f"{problem[0]}; {problem[1]}, or pass --force to ship it anyway")
            run.code_problem = problem[0]
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
