"""SLURM preemption on CPU: submitit's USR2 becomes a checkpoint at the end of the step, then submitit's own handler
(requeue) whose exit is recorded as interrupted; the launcher's checkpoint() requeues the job with resume=<run dir>;
under submitit a SIGTERM writes a checkpoint and training goes on (submitit's convention)."""

from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path

import pytest

from speedrun.run.preempt import Preempted

RUN = [
    "debug=smoke",
    "budget.max_steps=8",
    "budget.train_seconds=600",
    "budget.tokens_per_step=1024",
    "eval.tokens=2048",
    "quant=off",
    "logger.flush_every_steps=3",
]


def signal_at_step(monkeypatch, step: int, signum: int) -> None:
    from speedrun.core.train import Stepper

    calls = {"n": 0}
    original = Stepper.__call__

    def stepping(self, batches):
        out = original(self, batches)
        calls["n"] += 1
        if calls["n"] == 1 + step:  # after the warm-up step
            os.kill(os.getpid(), signum)
        return out

    monkeypatch.setattr(Stepper, "__call__", stepping)


def run(compose, run_dir: Path, overrides: list[str]):
    from speedrun.run.runner import RunContext, run_job

    return run_job(compose(overrides), RunContext(run_dir, overrides, None, run_dir.parent))


def test_usr2_under_submitit_checkpoints_then_hands_over_to_submitit(compose, tmp_path, data_cache, monkeypatch):
    handed = []

    def submitit_handler(signum, frame):  # what submitit's checkpoint_and_try_requeue ends with (local executor)
        handed.append(signum)
        raise SystemExit(144)

    monkeypatch.setenv("SUBMITIT_FOLDER", str(tmp_path / "submitit"))
    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        signal_at_step(monkeypatch, 5, signal.SIGUSR2)
        with pytest.raises(Preempted, match="requeued") as raised:
            run(
                compose, tmp_path / "job", [*RUN, f"data.cache_dir={data_cache}", f"results_db={tmp_path / 'r.sqlite'}"]
            )
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert handed == [signal.SIGUSR2]  # submitit ran after the checkpoint, once
    # the process ends with submitit's requeue status (the local executor restarts only on 144), and the exception
    # submitit pickles back to the launcher pickles: it carries where the row went as text, not the job
    assert raised.value.exit_code == 144
    again = pickle.loads(pickle.dumps(raised.value))
    assert "interrupted" in again.speedrun_record and str(tmp_path / "job") in again.speedrun_record
    assert [p.name for p in (tmp_path / "job" / "checkpoints").glob("*.pt")] == ["step_00000005.pt"]
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    assert result["status"] == "interrupted" and "preempted at step 5" in result["error"]


def test_sigterm_under_submitit_checkpoints_and_goes_on(compose, tmp_path, data_cache, monkeypatch):
    monkeypatch.setenv("SUBMITIT_FOLDER", str(tmp_path / "submitit"))
    signal_at_step(monkeypatch, 3, signal.SIGTERM)
    result = run(
        compose, tmp_path / "job", [*RUN, f"data.cache_dir={data_cache}", f"results_db={tmp_path / 'r.sqlite'}"]
    )
    assert result["status"] == "ok" and result["steps"] == 8
    assert [p.name for p in (tmp_path / "job" / "checkpoints").glob("*.pt")] == ["step_00000003.pt"]


def test_requeue_adds_resume_only_when_the_run_dir_holds_a_checkpoint(tmp_path):
    from hydra_plugins.speedrun_plugins.slurm_launcher import requeue_overrides
    from speedrun.run.checkpoint import save_checkpoint

    assert requeue_overrides(["attn=flex", "seed=1"], tmp_path) == ["attn=flex", "seed=1"]  # nothing to resume
    assert requeue_overrides(["seed=1"], None) == ["seed=1"]
    save_checkpoint(tmp_path, {"format": 1, "progress": {"steps": 4}}, {"steps": 4}, keep=1)
    assert requeue_overrides(["attn=flex", "resume=/old"], tmp_path) == ["attn=flex", f"resume={tmp_path.resolve()}"]


def test_the_slurm_launcher_is_ours_and_its_checkpoint_requeues_with_resume(compose, tmp_path, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    import submitit

    from hydra_plugins.speedrun_plugins import slurm_launcher
    from speedrun.run.checkpoint import save_checkpoint

    cfg = compose(["hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("slurm_launcher.SpeedrunSlurmLauncher")
    save_checkpoint(tmp_path, {"format": 1, "progress": {"steps": 4}}, {"steps": 4}, keep=1)
    monkeypatch.setattr(slurm_launcher, "current_run_dir", lambda: tmp_path)
    launcher = slurm_launcher.SpeedrunSlurmLauncher(submitit_folder=str(tmp_path))
    delayed = launcher.checkpoint(["attn=flex"], "hydra.sweep.dir", 3, "job_id_for_3", {})
    assert isinstance(delayed, submitit.helpers.DelayedSubmission) and delayed.function is launcher
    assert delayed.args[0] == ["attn=flex", f"resume={tmp_path.resolve()}"] and delayed.args[2] == 3


def test_main_ends_a_requeued_job_with_submitits_status(monkeypatch):
    """speedrun.main exits with the status submitit's handler chose when it requeued (144 under the local
    executor), and with the shell's signal status for any other interrupt."""
    import speedrun
    from speedrun.run import runner

    for raised, status in ((Preempted("preempted at step 3; job requeued", 144), 144), (KeyboardInterrupt(), 130)):

        def stopped(cfg, raised=raised):
            raise raised

        monkeypatch.setattr(runner, "run_job", stopped)
        with pytest.raises(SystemExit) as exited:
            speedrun.main({})
        assert exited.value.code == status


def test_a_signal_after_the_boundarys_agreement_waits_for_the_next_boundary(monkeypatch):
    """Under submitit a SIGTERM (carry on) is agreed at a step boundary; a SIGUSR2 that lands while that boundary
    evaluates or checkpoints is not consumed with it: it is still pending, and the next boundary preempts."""
    from speedrun.run.preempt import CARRY_ON, PREEMPT, StopRequests

    monkeypatch.setenv("SUBMITIT_FOLDER", "/tmp/submitit")
    stop = StopRequests()
    stop.pending.append(signal.SIGTERM)
    taken = list(stop.pending)
    level = stop.level(taken)
    assert level == CARRY_ON
    stop.pending.append(signal.SIGUSR2)  # during the boundary's evaluation
    stop.act(3, "ckpt.pt", lambda: None, level=level, taken=taken)  # carries on
    assert stop.pending == [signal.SIGUSR2] and stop.level() == PREEMPT
