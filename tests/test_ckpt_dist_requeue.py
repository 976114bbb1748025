"""A job requeued into its run dir (SLURM's requeue, checkpoint.auto_resume) on two ranks: rank 0 finds the
checkpoint there, rank 1 (in a private dir of its own, where there is none) follows it and loads the file rank 0
picks; the job continues the row from its checkpoint. Here the checkpoint is a one-process job's, stopped by SIGTERM
at step 3, so the requeued job also changes the number of ranks."""

from __future__ import annotations

import json
import os
import signal
import sqlite3

import pytest
import torch

from test_ckpt_dist_job import RUN, STOP_AT, _close, _compose, _two_ranks


def test_a_job_requeued_into_its_run_dir_resumes_on_two_ranks(tmp_path, data_cache, monkeypatch):
    from speedrun.run.runner import RunContext, run_job
    from speedrun.training.loop import Stepper

    db = tmp_path / "r.sqlite"
    common = [*RUN, f"data.cache_dir={data_cache}", f"results_db={db}"]
    full, job = tmp_path / "full", tmp_path / "job"
    torch.set_num_threads(1)
    assert run_job(_compose(common), RunContext(full, common, None, tmp_path))["status"] == "ok"

    original, calls = Stepper.__call__, [0]

    def stepping(self, batches):
        out = original(self, batches)
        calls[0] += 1
        if calls[0] == STOP_AT:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(Stepper, "__call__", stepping)
    with pytest.raises(KeyboardInterrupt, match="checkpoint"):
        run_job(_compose(common), RunContext(job, common, None, tmp_path))
    monkeypatch.setattr(Stepper, "__call__", original)

    _two_ranks(common, job)  # the same command line, into the same dir: no resume= given
    result = json.loads((job / "result.json").read_text())
    assert (result["status"], result["steps"], result["world_size"]) == ("ok", 6, 2), result
    row = sqlite3.connect(db).execute("SELECT status, resumed_from_step FROM runs WHERE run_id = ?", (str(job),))
    assert row.fetchone() == ("ok", STOP_AT)
    _close(job, full)
