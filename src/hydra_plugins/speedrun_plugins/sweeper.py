"""The speedrun sweeper, ``hydra/sweeper=speedrun`` (conf/hydra/sweeper/speedrun.yaml; the project default).

Hydra's basic sweeper (the same Cartesian product of ``key=a,b`` overrides, ``params``, ``max_batch_size``),
plus what a long sweep needs, with any launcher (pool, submitit, basic):

- keep going: a failed job is collected, never raised, so every combination runs and ``on_multirun_end``
  callbacks (the summary) always run; the summary callback then sets the exit status.
- ``fail_fast``: stop after the first batch with a failure (the pool launcher also stops inside a batch).
- ``resume``: skip the combinations that already completed with status ok: a run in results.sqlite with the
  same composed config (see speedrun.records.identity.config_identity: same name, overrides and conf/ defaults), on the same
  card (its ``device_name`` is speedrun.records.identity.current_device_name() here; ``$SPEEDRUN_DEVICE_NAME`` overrides
  it) and of the same code (its ``code_fingerprint`` is code_fingerprint(REPO_ROOT) here, unless
  ``resume_across_code``). A combination done only elsewhere runs again, and the summary says why.
- ``sweep.json`` in the sweep dir: every combination and what became of it (launched, reused, not_run), and why
  the sweep stopped early, if it did (``stopped``: fail_fast, interrupted).
"""

import copy
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from omegaconf import OmegaConf, open_dict, read_write

from speedrun.errors import ConfigError
from speedrun.paths import REPO_ROOT, results_db_path
from speedrun.records.identity import SWEEP_REUSE_IGNORED, code_fingerprint, config_identity, current_device_name

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass
class SpeedrunSweeperConf:
    _target_: str = "hydra_plugins.speedrun_plugins.sweeper.SpeedrunSweeper"
    resume: bool = False
    """Skip combinations that already completed with status ok (same composed config in results.sqlite, same card,
    same code)."""
    resume_across_code: bool = False
    """With resume: also reuse runs made by other code (another code_fingerprint), e.g. after a change that cannot
    affect results. The card must still match."""
    fail_fast: bool = False
    """Stop at the first failed job (no new job starts; the pool launcher also stops the running ones)."""
    max_batch_size: int | None = None
    """Jobs handed to the launcher at once (null: all)."""
    params: dict[str, str] | None = None
    """Sweep parameters as in Hydra's basic sweeper, e.g. {seed: 0,1,2}."""


ConfigStore.instance().store(group="hydra/sweeper", name="speedrun", node=SpeedrunSweeperConf, provider="speedrun")


class SpeedrunSweeper(BasicSweeper):
    def __init__(
        self,
        resume: bool = False,
        fail_fast: bool = False,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        resume_across_code: bool = False,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.resume, self.fail_fast = bool(resume), bool(fail_fast)
        self.resume_across_code = bool(resume_across_code)

    def sweep(self, arguments: list[str]) -> Any:
        # here, not at the top: Hydra imports its plugins on every start, and the report package is a sweep's alone
        from speedrun.report.manifest import JobEntry, Manifest

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        params = self._parse_config() + list(arguments)
        combos = self.split_arguments(parser.parse_overrides(params), None)[0]
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        own_sweep_dir(sweep_dir)  # before anything is written there: one sweep per sweep dir
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        manifest = Manifest(
            sweep=sweep_dir.name,
            sweep_dir=str(sweep_dir),
            name=str(self.config.get("name")),
            resume=self.resume,
            fail_fast=self.fail_fast,
            resume_across_code=self.resume_across_code,
            code_fingerprint=code_fingerprint(REPO_ROOT),
            jobs=[JobEntry(index=i, overrides=list(c)) for i, c in enumerate(combos)],
        )
        # compose every job now: a composition error fails the sweep before any job runs (as the basic sweeper)
        identities = [self._identity(c) for c in combos]
        if self.resume:
            self._mark_reused(manifest, identities)
        manifest.save()

        todo = [j for j in manifest.jobs if j.state == "pending"]
        returns: list[list[JobReturn]] = []
        num = 0
        for batch in _chunks(todo, self.max_batch_size) if todo else []:
            results = self.launcher.launch([j.overrides for j in batch], initial_job_idx=num)
            num += len(batch)
            returns.append(list(results))
            failed = [_record(j, r) for j, r in zip(batch, results)]
            manifest.save()
            stop = None
            if getattr(self.launcher, "interrupted", False):
                stop = "interrupted"
            elif self.fail_fast and any(failed):
                stop = "fail_fast"
            if stop:
                manifest.stopped = stop
                for j in todo:
                    if j.state == "pending":
                        j.state, j.status, j.error = "not_run", "not_run", f"not run: {stop}"
                break
        manifest.finished_at = time.time()
        manifest.save()
        return returns

    def _mark_reused(self, manifest: Any, identities: list[str | None]) -> None:
        """Mark the jobs an earlier ok run (same config, this card, this code) already did; note why the others
        that were done elsewhere run again."""
        from speedrun.report.manifest import completed_runs  # here: as in sweep(), a sweep's alone

        manifest.device_name = current_device_name()
        code = None if self.resume_across_code else manifest.code_fingerprint
        done = completed_runs(self._db_path(), device_name=manifest.device_name, code=code)
        unchecked = 0
        for job, ident in zip(manifest.jobs, identities):
            row = done.reusable.get(ident) if ident is not None else None
            if row is not None:
                job.state, job.status, job.run_dir = "reused", "ok", row.get("run_dir") or row.get("run_id")
                unchecked += row.get("code_fingerprint") is None
            elif ident in done.refused:
                job.note = done.refused[ident]
        reused = sum(j.state == "reused" for j in manifest.jobs)
        across = ", any code" if self.resume_across_code else f", code {manifest.code_fingerprint}"
        log.info(
            f"resume: {reused} of {len(identities)} combination(s) already completed ok (on "
            f"{manifest.device_name}{across}) and are skipped; {len(identities) - reused} to run"
        )
        for why, n in Counter(j.note for j in manifest.jobs if j.note).items():
            log.info(f"resume: {n} combination(s) run again: their earlier ok run {why}")
        if unchecked:
            log.warning(
                f"resume: {unchecked} reused run(s) have no code_fingerprint (recorded before runs kept it): "
                f"that they ran this code cannot be checked"
            )

    def _identity(self, overrides: list[str]) -> str | None:
        assert self.config is not None and self.hydra_context is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        saved = HydraConfig.instance().cfg
        try:
            HydraConfig.instance().set_config(cfg)
            task = copy.deepcopy(cfg)
            with read_write(task), open_dict(task):
                del task["hydra"]
            return config_identity(OmegaConf.to_container(task, resolve=True), SWEEP_REUSE_IGNORED)
        except Exception as e:  # noqa: BLE001 - an unresolvable config cannot be matched; it just runs
            log.warning(f"resume: cannot resolve the config of {' '.join(overrides)} ({e}); it will run")
            return None
        finally:
            HydraConfig.instance().cfg = saved

    def _db_path(self) -> Path:
        assert self.config is not None
        db = results_db_path(self.config.get("results_db"))
        if db.is_absolute():
            return db
        return Path(str(OmegaConf.select(self.config, "hydra.runtime.cwd", default=".") or ".")) / db


SWEEP_LOCK = ".sweep.lock"


class SweepDirRefused(ConfigError, CompactHydraException):
    """A sweep dir another live sweep owns: Hydra prints a CompactHydraException as its message alone (one line)."""


def own_sweep_dir(sweep_dir: Path) -> None:
    """Hold ``<sweep dir>/.sweep.lock`` (speedrun.records.lock) until this process ends, or raise a ConfigError naming
    the sweep that holds it: two sweeps on one dir would run each other's job dirs, overwrite each other's
    console.log and summarise the other's rows as their own."""
    import atexit

    from speedrun.records.lock import RunDirBusy, RunDirLock

    lock = RunDirLock(sweep_dir, SWEEP_LOCK, "wait for that sweep to end, or give this one another hydra.sweep.dir=...")
    try:
        warning = lock.acquire()
    except (RunDirBusy, OSError) as e:
        raise SweepDirRefused(f"error: sweep dir {e}" if isinstance(e, RunDirBusy) else f"error: {e}") from None
    if warning:
        log.warning("%s", warning.replace("the run dir", "the sweep dir"))
    atexit.register(lock.release)  # after the summary callback, which writes into the dir too


def _chunks(items: list[_T], n: int | None) -> Iterator[list[_T]]:
    """BasicSweeper.split_overrides_to_chunks, typed for any list (Hydra's is annotated for lists of overrides
    only): batches of ``n`` (hydra.sweeper.max_batch_size), all in one for None or -1."""
    if n is None or n == -1:
        n = len(items)
    assert n > 0
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _record(job: Any, ret: JobReturn) -> bool:
    """Fill a manifest entry from a JobReturn; True when the job failed."""
    job.num = OmegaConf.select(ret.hydra_cfg, "hydra.job.num", default=None) if ret.hydra_cfg else None
    out = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir", default=None) if ret.hydra_cfg else None
    job.run_dir = str(Path(out).resolve()) if out else None
    job.state = "launched"
    if ret.status == JobStatus.COMPLETED:
        value = getattr(ret.return_value, "record", ret.return_value)  # an Objective carries the result record
        job.status = str(value.get("status", "ok")) if isinstance(value, dict) else "ok"
        job.error = value.get("error") if isinstance(value, dict) else None
        return job.status not in ("ok", "diverged")
    exc = ret._return_value
    job.status = getattr(exc, "status", "failed")
    job.error = f"{type(exc).__name__}: {exc}" if exc is not None else "failed"
    if job.status == "not_run":
        job.state = "not_run"
        return False
    return True
