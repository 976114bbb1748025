"""W&B (logger=wandb) with a stand-in wandb module: a sweep job's display name is its run name and job number, not
the group again (W&B shows the group beside it); and `python -m speedrun.export` logs the submission folder as an
artifact of the same W&B run (resumed by its id), only for a run that logged to W&B, with a W&B failure a warning."""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

from speedrun.config import LoggerConfig
from speedrun.run.job import make_logger
from speedrun.run.wandb_logger import WandbLogger, log_export, wandb_run_id


class FakeWandb:
    def __init__(self, fail: bool = False):
        self.inits: list[dict] = []
        self.artifacts: list[dict] = []
        self.finished = 0
        self.fail = fail
        outer = self

        class Run:
            dir, id, summary = "files", "abc", {}

            def define_metric(self, *a, **k):
                pass

            def log_artifact(self, art, aliases):
                if outer.fail:
                    raise OSError("no space left on device")
                outer.artifacts.append({**art.__dict__, "aliases": aliases})

            def finish(self, **k):
                outer.finished += 1

        class Artifact:
            def __init__(self, name, type, description, metadata=None):
                self.name, self.type, self.dirs = name, type, []

            def add_dir(self, path):
                self.dirs.append(path)

        self.Artifact = Artifact
        self._run = Run

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self._run()

    def Settings(self, **k):  # noqa: N802 - wandb's own spelling
        return None


def _install(monkeypatch, fake: FakeWandb) -> None:
    monkeypatch.setitem(
        sys.modules, "wandb", types.SimpleNamespace(init=fake.init, Artifact=fake.Artifact, Settings=fake.Settings)
    )


def test_a_sweep_jobs_name_does_not_repeat_its_group(monkeypatch, tmp_path):
    fake = FakeWandb()
    _install(monkeypatch, fake)
    job = tmp_path / "12-00-00-000000_mine" / "3"
    job.mkdir(parents=True)
    lg = make_logger(LoggerConfig(name="wandb", mode="offline"), job, "12-00-00-000000_mine", "mine")
    assert isinstance(lg, WandbLogger)
    lg.start({}, None)
    single = tmp_path / "12-05-00-000000_mine"
    single.mkdir()
    make_logger(LoggerConfig(name="wandb", mode="offline"), single, None, "mine").start({}, None)
    (swept, alone) = fake.inits
    assert (swept["group"], swept["name"]) == ("12-00-00-000000_mine", "mine/3")
    assert (alone["group"], alone["name"]) == (None, "12-05-00-000000_mine")


def _run_dir(root: Path, logger: str) -> Path:
    run_dir = root / "run"
    run_dir.mkdir()
    plan = {"logger": {"name": logger, "mode": "offline", "project": "p", "entity": None}}
    (run_dir / "plan.json").write_text(json.dumps(plan))
    return run_dir


def test_the_export_folder_is_logged_to_the_runs_wandb_run(monkeypatch, tmp_path):
    fake = FakeWandb()
    _install(monkeypatch, fake)
    run_dir, folder = _run_dir(tmp_path, "wandb"), tmp_path / "submission"
    folder.mkdir()
    said: list[str] = []
    assert log_export(run_dir, folder, say=said.append) is True
    (init,) = fake.inits
    assert init["id"] == wandb_run_id(run_dir) and init["resume"] == "allow" and init["project"] == "p"
    (art,) = fake.artifacts
    assert art["type"] == "submission" and art["dirs"] == [str(folder)] and "latest" in art["aliases"]
    assert fake.finished == 1 and len(said) == 1 and str(folder) in said[0]


def test_a_run_without_wandb_logs_nothing_and_a_wandb_failure_is_a_warning(monkeypatch, tmp_path, caplog):
    fake = FakeWandb(fail=True)
    _install(monkeypatch, fake)
    console = _run_dir(tmp_path / "a", "console") if (tmp_path / "a").mkdir() is None else None
    assert console is not None and log_export(console, tmp_path) is False and fake.inits == []
    wandb_run = _run_dir(tmp_path / "b", "wandb") if (tmp_path / "b").mkdir() is None else None
    assert wandb_run is not None
    with caplog.at_level(logging.WARNING):
        assert log_export(wandb_run, tmp_path) is False
    assert "logging the export folder failed (OSError: no space left on device)" in caplog.text
