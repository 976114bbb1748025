"""``python -m run resume=<run dir>``: continue a run from its latest checkpoint, to its original budget.

The resumed job runs the config its checkpoint recorded (the composed config and overrides of the original job;
overrides given beside ``resume=`` must be among those), writes into the same run dir (``hydra.run.dir`` follows
``resume`` through the ``speedrun_run_dir`` resolver in conf/config.yaml, and Hydra's own files for the resumed
invocation go to ``.hydra/resume/``, leaving the original ``.hydra/`` as it was) and completes the same results
row (run_id = the run dir). A job that starts in a run dir already holding a checkpoint of its own config (a SLURM
job requeued into its sweep dir) resumes the same way without being asked (checkpoint.auto_resume).

Several ranks: every rank runs this with the same ``resume=`` (the launching process passes its overrides on), and
rank 0 picks the checkpoint that every rank loads (training.loop_setup.ResumableExtras); a rank > 0 keeps its own
private directory. ``dist.nproc=N`` (and ``dist.nodes``) may be given beside ``resume=`` to continue on another
number of ranks: the checkpoint is one file and its data position is global (training.checkpoint), so any number
that splits the step continues with the same global batches.

A refusal is a ConfigError naming the problem: the dir does not exist, is not a speedrun run dir, holds no
checkpoint, or the command line has overrides the run did not (other than dist.nproc / dist.nodes). The resolver makes every one of these checks
before Hydra writes anything, and sends a refused resume to a new run dir, so the run it names is left byte for
byte as it was (the refusal is that new dir's failed row). An accepted resume writes nothing into the original
until its checkpoint is restored (speedrun.run.record).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedrun.errors import ConfigError
from speedrun.records.identity import AUTO_RESUME_IGNORED, config_identity
from speedrun.training.checkpoint import DIRNAME, latest_meta


@dataclass
class Resume:
    run_dir: Path
    config: dict[str, Any]
    """The original job's composed config (with ``resume`` set to the run dir)."""
    overrides: list[str]
    cwd: Path
    """Where the original job started (relative paths in its config are taken from there)."""
    steps: int
    """Steps done at the checkpoint resumed from."""
    auto: bool
    """Found by auto-resume (no resume= given)."""


def is_run_dir(path: Path) -> bool:
    return (path / "plan.json").is_file() or (path / ".hydra" / "config.yaml").is_file()


def register_resolvers() -> None:
    """conf/config.yaml's ``hydra.run.dir`` and ``hydra.output_subdir`` call these: resume=<dir> runs in <dir>."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("speedrun_run_dir", run_dir_resolver, replace=True)
    OmegaConf.register_new_resolver("speedrun_hydra_subdir", hydra_subdir_resolver, replace=True)


def run_dir_resolver(resume: str | None, overrides: Any, default: str) -> str:
    """hydra.run.dir: the resumed run's own dir when ``resume=`` names a run this job may continue, else the usual
    new one. Every check that can refuse the resume runs here, before Hydra writes anything, so a refused resume
    is recorded in a new run dir and row of its own and leaves the original byte for byte as it was."""
    if resume:
        try:
            return str(accepted_resume(resume, [str(o) for o in overrides or ()], Path.cwd())[0])
        except ConfigError:
            pass  # the runner raises it again, into the new run's record
    return default


def hydra_subdir_resolver(run_dir: str, resume: str | None) -> str:
    """Hydra's files for a resumed invocation go to .hydra/resume/, beside the original job's .hydra/."""
    if resume and Path(str(resume)).expanduser().resolve() == Path(run_dir).resolve():
        return ".hydra/resume"
    return ".hydra"


def accepted_resume(asked: str, overrides: list[str], cwd: Path) -> tuple[Path, dict[str, Any]]:
    """(the run dir, its newest checkpoint's meta) for ``resume=<asked>``, or a ConfigError naming the problem."""
    path = Path(str(asked)).expanduser()
    path = (path if path.is_absolute() else cwd / path).resolve()
    if not path.is_dir():
        raise ConfigError(
            f"resume={asked}: no such directory ({path}); give the dir of an earlier run, e.g. "
            f"outputs/runs/<date>/<time>_<name> (the run_dir column of results.sqlite)"
        )
    if not is_run_dir(path):
        raise ConfigError(
            f"resume={asked}: {path} is not a speedrun run dir (it has no plan.json or .hydra/"
            f"config.yaml); give the dir a `python -m run` job wrote"
        )
    try:
        meta = latest_meta(path)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"resume={asked}: the newest checkpoint's .json in {path / DIRNAME} is unreadable ({e})"
        ) from e
    if meta is None:
        raise ConfigError(
            f"resume={asked}: {path} holds no checkpoint ({DIRNAME}/ is empty or missing): the run was "
            f"not stopped by a signal during training and checkpoint.every_seconds/every_steps were "
            f"off; run it again instead (with checkpoint.every_seconds=600 to keep one)"
        )
    saved = list(meta.get("overrides") or [])
    extra = [o for o in overrides if not o.startswith("resume=") and o not in saved and _key(o) not in RANK_KEYS]
    if extra:
        raise ConfigError(
            f"resume={asked} continues the run as it was configured ({' '.join(saved) or 'defaults'}); "
            f"these overrides differ from it: {' '.join(extra)}; drop them, or start a new run"
        )
    return path, meta


RANK_KEYS = ("dist.nproc", "dist.nodes")
"""Overrides a resume may change: how many ranks continue the run. A checkpoint holds the whole state once (rank 0's,
training.checkpoint) and its data position is global, so any number of ranks that splits the step continues it
with the same global batches; the resolver refuses a number that does not split."""


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def with_ranks(config: dict[str, Any], saved: list[str], given: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The resumed job's config and overrides, with the ranks given beside ``resume=`` (RANK_KEYS) in place of the
    original job's."""
    ranks = [o for o in given if _key(o) in RANK_KEYS]
    if not ranks:
        return config, saved
    dist = dict(config.get("dist") or {})
    for o in ranks:
        key, value = o.split("=", 1)
        dist[_key(key).split(".", 1)[1]] = int(value)
    changed = {_key(o) for o in ranks}
    return {**config, "dist": dist}, [*(o for o in saved if _key(o) not in changed), *ranks]


def find_resume(config: dict[str, Any], overrides: list[str], run_dir: Path, cwd: Path) -> Resume | None:
    """The resume this job asks for (``resume=``) or may do (auto_resume), or None; ConfigError when refused."""
    asked = config.get("resume")
    if not asked:
        meta = latest_meta(run_dir) if (config.get("checkpoint") or {}).get("auto_resume", True) else None
        if meta is None or config_identity(meta.get("config"), AUTO_RESUME_IGNORED) != config_identity(
            config, AUTO_RESUME_IGNORED
        ):
            return None
        return Resume(
            run_dir.resolve(),
            {**meta["config"], "resume": str(run_dir.resolve())},
            list(meta.get("overrides") or []),
            Path(meta.get("cwd") or cwd),
            int(meta["steps"]),
            auto=True,
        )
    path, meta = accepted_resume(str(asked), overrides, cwd)
    config, saved = with_ranks(meta["config"], list(meta.get("overrides") or []), overrides)
    return Resume(
        path,
        {**config, "resume": str(path)},
        saved,
        Path(meta.get("cwd") or cwd),
        int(meta["steps"]),
        auto=False,
    )
