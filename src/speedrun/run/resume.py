"""``python -m run resume=<run dir>``: continue a run from its latest checkpoint, to its original budget.

The resumed job runs the config its checkpoint recorded (the composed config and overrides of the original job;
overrides given beside ``resume=`` must be among those), writes into the same run dir (``hydra.run.dir`` follows
``resume`` through the ``speedrun_run_dir`` resolver in conf/config.yaml, and Hydra's own files for the resumed
invocation go to ``.hydra/resume/``, leaving the original ``.hydra/`` as it was) and completes the same results
row (run_id = the run dir). A job that starts in a run dir already holding a checkpoint of its own config (a SLURM
job requeued into its sweep dir) resumes the same way without being asked (checkpoint.auto_resume).

Several ranks: every rank runs this with the same ``resume=`` (the launching process passes its overrides on), and
rank 0 picks the checkpoint that every rank loads (run.loop_setup.ResumableExtras); a rank > 0 keeps its own
private directory. ``dist.nproc=N`` (and ``dist.nodes``) may be given beside ``resume=`` to continue on another
number of ranks: the checkpoint is one file and its data position is global (training.checkpoint), so any number
that splits the step continues with the same global batches.

A run dir is data: it may come from another machine or person. Nothing in it is imported, executed or resolved
before it is checked against this command: its checkpoint's config must hold plain values (an interpolation such
as ``${oc.env:...}`` is refused, never resolved), its ``model.arch`` must be the one this command composes (a
model class is imported only from the user's own config), and the results database and the directory relative
paths are taken from are this invocation's, never the ones the checkpoint recorded.

A refusal is a ConfigError naming the problem: the dir does not exist, is not a speedrun run dir, holds no
checkpoint, another live process owns it, the code differs from the checkpoint's (``accept_code_change=true``
continues anyway, and the row records both fingerprints), or the command line has overrides the run did not
(other than dist.nproc / dist.nodes). The resolver makes every one of these checks
before Hydra writes anything, and sends a refused resume to a new run dir, so the run it names is left byte for
byte as it was (the refusal is that new dir's failed row). An accepted resume writes nothing into the original
until its checkpoint is restored (speedrun.run.job_record).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedrun.errors import ConfigError
from speedrun.paths import REPO_ROOT
from speedrun.records.identity import AUTO_RESUME_IGNORED, code_fingerprint, config_identity
from speedrun.records.lock import RunDirLock
from speedrun.records.rundir import new_run_refusal, symlink_problem
from speedrun.records.store import ENDED, read_result, recorded_status
from speedrun.run.checkpoint import DIRNAME, latest_meta


@dataclass
class Resume:
    run_dir: Path
    config: dict[str, Any]
    """The original job's composed config (with ``resume`` set to the run dir)."""
    overrides: list[str]
    steps: int
    """Steps done at the checkpoint resumed from."""
    auto: bool
    """Found by auto-resume (no resume= given)."""
    code_change: str | None = None
    """``<checkpoint's code fingerprint> -> <this code's>`` when the code differs and accept_code_change=true."""


def is_run_dir(path: Path) -> bool:
    return (path / "plan.json").is_file() or (path / ".hydra" / "config.yaml").is_file()


def register_resolvers() -> None:
    """conf/config.yaml's ``hydra.run.dir`` and ``hydra.output_subdir`` call these: resume=<dir> runs in <dir>."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("speedrun_run_dir", run_dir_resolver, replace=True)
    OmegaConf.register_new_resolver("speedrun_hydra_subdir", hydra_subdir_resolver, replace=True)
    OmegaConf.register_new_resolver("speedrun_log_file", log_file_resolver, replace=True)


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


def _resumes(run_dir: str, resume: str | None) -> bool:
    return bool(resume) and Path(str(resume)).expanduser().resolve() == Path(run_dir).resolve()


def hydra_subdir_resolver(run_dir: str, resume: str | None) -> str | None:
    """Hydra's files for a resumed invocation go to .hydra/resume/, beside the original job's .hydra/; any other
    invocation in a dir that already has them (a requeued job) writes its own beside them, never over them. None (Hydra writes no .hydra/) in a dir a new run is refused (a finished
    run's, a folder of other files, one holding symlinks, one a live process owns): a refused command writes
    nothing there."""
    if _resumes(run_dir, resume):
        return ".hydra/resume"
    if _refused_here(run_dir):
        return None
    if (Path(run_dir) / ".hydra" / "config.yaml").exists():
        return f".hydra/{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    return ".hydra"


def log_file_resolver(run_dir: str, resume: str | None) -> str:
    """hydra.job_logging's file: <run dir>/run.log, or os.devnull in a dir a new run is refused (as above), so that a
    refused command appends nothing to a finished run's log (which an export publishes) or through a symlink."""
    if not _resumes(run_dir, resume) and _refused_here(run_dir):
        return os.devnull
    return str(Path(run_dir) / "run.log")


def _refused_here(run_dir: str) -> bool:
    """A new run in ``run_dir`` will be refused: new_run_refusal, or another live process owns the dir (a rank's
    own launching process, which holds the lock for it, does not count)."""
    if new_run_refusal(Path(run_dir)) is not None:
        return True
    lock = RunDirLock(Path(run_dir))  # this process, or the one that launched it as a rank, may own it already
    return all(lock.owner(allow=pid) is not None for pid in (os.getpid(), os.getppid()))


def training_unfinished(result: dict[str, Any]) -> bool:
    """A run that ended (failed, oom) while it trained, before any evaluation: its checkpoints continue it. A run
    that ended after training (ok, diverged, or a failure in evaluation or export) is finished for good."""
    return (
        result.get("status") in ("failed", "oom")
        and result.get("phase") in ("setup", "warmup", "train")
        and result.get("val_loss") is None
    )


def finished_refusal(asked: str, path: Path, status: str | None) -> ConfigError:
    return ConfigError(
        f"resume={asked}: {path} holds a finished run (status {status}), which is never written again; start a new "
        f"run (the same command without resume=), or export it with `python -m speedrun.export {path}`"
    )


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
    links = symlink_problem(path)
    if links is not None:
        raise ConfigError(f"resume={asked}: {links}")
    result = read_result(path) or {}
    if result.get("status") in ENDED and not training_unfinished(result):
        raise finished_refusal(asked, path, result.get("status"))
    try:
        meta = latest_meta(path)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"resume={asked}: the newest checkpoint's .json in {path / DIRNAME} is unreadable ({e})"
        ) from e
    if meta is None:
        raise ConfigError(
            f"resume={asked}: {path} holds no checkpoint ({DIRNAME}/ is empty or missing): {_why_none(path)}"
        )
    check_plain(meta.get("config"), f"resume={asked}: {path / DIRNAME}")
    # rank 0 (or a single process) decides; a run's own launching process holds the lock on its ranks' behalf
    owner = RunDirLock(path).owner(allow=os.getppid()) if os.environ.get("RANK", "0") == "0" else None
    if owner is not None:
        raise ConfigError(f"resume={asked}: {path} is in use by {owner}; wait for that run to end")
    saved = list(meta.get("overrides") or [])
    extra = [o for o in overrides if not o.startswith("resume=") and o not in saved and _key(o) not in FREE_KEYS]
    if extra:
        raise ConfigError(
            f"resume={asked} continues the run as it was configured ({' '.join(saved) or 'defaults'}); "
            f"these overrides differ from it: {' '.join(extra)}; drop them, or start a new run"
        )
    return path, meta


def _why_none(path: Path) -> str:
    """Why a run dir has no checkpoint, from its own config (read as text, never resolved)."""
    import yaml

    try:
        saved = yaml.safe_load((path / ".hydra" / "config.yaml").read_text()) or {}
        keeping = saved.get("checkpoint") or {}
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        keeping = {}
    if keeping.get("every_seconds") or keeping.get("every_steps"):
        return "the run ended before its first checkpoint was written; run it again instead"
    return (
        "the run was not stopped by a signal during training and checkpoint.every_seconds/every_steps were off; "
        "run it again instead (with checkpoint.every_seconds=600 to keep one)"
    )


def check_plain(tree: Any, where: str) -> None:
    """Refuse a stored config holding an interpolation (``${...}``): resolving it would run what a run dir says
    (read an environment variable into the record, call a resolver); a config saved by speedrun holds none."""
    if isinstance(tree, dict):
        for value in tree.values():
            check_plain(value, where)
    elif isinstance(tree, list):
        for value in tree:
            check_plain(value, where)
    elif isinstance(tree, str) and "${" in tree:
        raise ConfigError(
            f"{where}: the stored config holds an interpolation ({tree[:60]!r}); a run dir's config is never "
            f"resolved: resume a run dir written by speedrun, or start a new run"
        )


def check_code(meta: dict[str, Any], asked: str, accept: bool) -> str | None:
    """None when this code is the checkpoint's; with ``accept``, the change (recorded by the row); else a refusal."""
    saved, here = meta.get("code_fingerprint"), code_fingerprint(REPO_ROOT)
    if saved == here:
        return None
    change = f"{saved or 'unrecorded'} -> {here}"
    if not accept:
        raise ConfigError(
            f"resume={asked}: the code changed since the checkpoint (code_fingerprint {saved or 'not recorded'}, "
            f"here {here}); restore that code, or add accept_code_change=true to continue with this code"
        )
    return change


def check_arch(saved: dict[str, Any], asked: dict[str, Any], where: str) -> None:
    """The model class comes from this command's config: a checkpoint naming another is refused before any
    import (a run dir must not choose the code that runs)."""
    mine = (asked.get("model") or {}).get("arch")
    theirs = (saved.get("model") or {}).get("arch")
    if mine != theirs:
        raise ConfigError(
            f"{where} names model.arch={theirs}, this command composes model.arch={mine}; give model.arch={theirs} "
            f"beside resume= if you trust that code, or resume another run"
        )


RANK_KEYS = ("dist.nproc", "dist.nodes")
"""Overrides a resume may change: how many ranks continue the run. A checkpoint holds the whole state once (rank 0's,
training.checkpoint) and its data position is global, so any number of ranks that splits the step continues it
with the same global batches; the resolver refuses a number that does not split."""


FREE_KEYS = (*RANK_KEYS, "accept_code_change", "results_db")
"""Overrides a resume may add: the ranks, accepting changed code, and the database this command records in."""


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
    accept = bool(config.get("accept_code_change"))
    if not asked:
        # a run that ended is never continued by being started again
        if not (config.get("checkpoint") or {}).get("auto_resume", True) or recorded_status(run_dir) in ENDED:
            return None
        try:
            meta = latest_meta(run_dir)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{run_dir / DIRNAME}: {e}; move that folder aside to start afresh") from e
        # the same config, this job's own: nothing of the run dir's is used that this command did not compose
        if meta is None or config_identity(meta.get("config"), AUTO_RESUME_IGNORED) != config_identity(
            config, AUTO_RESUME_IGNORED
        ):
            return None
        change = check_code(meta, str(run_dir), accept)
        return Resume(
            run_dir.resolve(),
            {**meta["config"], "resume": str(run_dir.resolve())},
            list(meta.get("overrides") or []),
            int(meta["steps"]),
            auto=True,
            code_change=change,
        )
    path, meta = accepted_resume(str(asked), overrides, cwd)
    check_arch(meta["config"], config, f"resume={asked}: {path}")
    change = check_code(meta, str(asked), accept)
    saved_config, saved = with_ranks(meta["config"], list(meta.get("overrides") or []), overrides)
    return Resume(
        path,
        {**saved_config, "resume": str(path), "accept_code_change": accept},
        saved,
        int(meta["steps"]),
        auto=False,
        code_change=change,
    )
