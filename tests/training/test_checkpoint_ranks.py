"""Checkpoints, resume, stop signals and the batch search on several ranks: two gloo ranks on CPU, the real loop,
then whole jobs.

A stop signal that reaches one rank stops every rank at the same step boundary after one checkpoint (rank 0's file);
that checkpoint resumed on two ranks ends exactly where an uninterrupted two-rank run ends, and resumed on one
process runs the same global batches step for step (the losses to float rounding: the gradient sums run in another
order, as tests/distributed/test_two_ranks.py measures); a one-process checkpoint resumes on two ranks the same
way. Under submitit a SIGUSR2 on one rank preempts both (submitit's handler runs on both) and a SIGTERM checkpoints
both and trains on; a checkpoint rank 0 cannot write stops both with its error. hardware.micro_batch=auto searches
on every rank and every rank runs the smallest choice. A two-rank job (run_job on each rank) stopped on one rank
resumes on two ranks or one, and a job requeued into its run dir resumes on two ranks."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sqlite3
from pathlib import Path

import pytest
import torch

from speedrun.config import to_config
from speedrun.paths import REPO_ROOT
from speedrun.plan import WorldInfo, resolve
from speedrun.records.identity import code_fingerprint
from support.devices import fake_device
from support.ranks import TINY_RUN, on_ranks, plan_for

STEPS = 6
CKPT = [*TINY_RUN, f"budget.max_steps={STEPS}", "checkpoint.every_steps=2"]
STOP_AT = 3  # the signal comes during step 3 (between the periodic checkpoints at 2 and 4)
TWO = WorldInfo("torchrun", 0, 2, 0, 2, 0)


def _loop(
    plan,
    shard: Path,
    world,
    run_dir: Path,
    *,
    resume: bool = False,
    signal_at: int | None = None,
    signum: int = signal.SIGTERM,
) -> dict:
    """Train with the real Stepper, loop and ResumableExtras (periodic checkpoints, deferred stop signals, restore):
    this rank's losses per step, where it stopped and why. ``signal_at``: ``signum`` to this process during that
    step (of this run)."""
    from speedrun.core.attention import get_backend
    from speedrun.core.data import TokenStream
    from speedrun.core.train import Stepper, TrainState, train
    from speedrun.run.build import build_model
    from speedrun.run.loop_setup import ResumableExtras
    from speedrun.run.periodic import checkpoint_meta

    torch.manual_seed(world.rank)  # World.prepare gives every rank rank 0's weights; a restore overwrites them
    model, forward, _, optimizers = build_model(plan, get_backend("sdpa", kernel="math"), bos_id=1)
    world.prepare(model, optimizers)
    losses: list[float] = []

    class Recording(Stepper):
        def __call__(self, batches):
            loss = super().__call__(batches)
            losses.append(float(loss))
            if len(losses) == signal_at:
                os.kill(os.getpid(), signum)
            return loss

    def batches(seq_len, micro_batch, position=0):
        stream = TokenStream([shard], seq_len, micro_batch, rank=world.rank, world_size=world.world_size)
        stream.load_state_dict({"position": position})
        return stream

    stepper = Recording(model, forward, optimizers, plan, world=world)
    meta = checkpoint_meta({}, [], plan, run_dir)
    extras = ResumableExtras(plan, run_dir, stepper=stepper, evaluator=None, meta=meta, on_metrics=lambda _: None)
    state = TrainState()
    if resume:
        extras.restore(state)
    start, stopped, kind = state.steps, None, None
    try:
        train(stepper, batches, state=state, log=lambda _: None, on_metrics=lambda _: None, between_steps=extras)
    except KeyboardInterrupt as e:  # Preempted too
        stopped, kind = str(e), type(e).__name__
    return {
        "losses": losses,
        "start": start,
        "steps": state.steps,
        "stopped": stopped,
        "kind": kind,
        "position": state.position,
        "checkpoints": [p.name for p in (run_dir / "checkpoints").glob("*.pt")],
    }


def _under_submitit(plan, data: Path, world, own) -> dict:
    """SLURM through submitit (SUBMITIT_FOLDER set), each signal to rank 1 alone: SIGUSR2 (preemption) stops both
    ranks after one checkpoint and runs submitit's handler on every rank (rank 0's requeues and exits, the others'
    return, as submitit's do); SIGTERM (submitit's "not the end") checkpoints on both and trains on."""
    handled: list[int] = []

    def submitit_handler(signum, frame):  # what submitit's checkpoint_and_try_requeue does on each rank
        handled.append(signum)
        if world.rank == 0:
            raise SystemExit(-1)

    os.environ["SUBMITIT_FOLDER"] = str(own("submitit"))
    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        usr2_at = STOP_AT if world.rank == 1 else None
        preempted = _loop(plan, data, world, own("usr2"), signal_at=usr2_at, signum=signal.SIGUSR2)
        carry_on = _loop(plan, data, world, own("term"), signal_at=5 if world.rank == 1 else None)
    finally:
        signal.signal(signal.SIGUSR2, previous)
        del os.environ["SUBMITIT_FOLDER"]
    return {"preempted": preempted, "carry_on": carry_on, "handled": handled}


def _disk_full(plan, data: Path, world, own) -> str:
    """Rank 0's checkpoint write fails (a full disk): every rank stops with rank 0's error, none waits for it."""
    from speedrun.run import periodic

    original = periodic.save_checkpoint

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    periodic.save_checkpoint = full if world.rank == 0 else original
    try:
        _loop(plan, data, world, own("full-disk"))
    except RuntimeError as e:
        return str(e)
    finally:
        periodic.save_checkpoint = original
    return "no error"


def _stop_and_resume(rank: int, world, plan, shard: str, tmp: str) -> dict:
    tmp_dir, data = Path(tmp), Path(shard)
    # rank 1 is given a directory of its own, as a rank > 0 of a real run has: it neither writes the checkpoint
    # nor looks for one, it loads the file rank 0 picks
    own = (lambda name: tmp_dir / name) if rank == 0 else (lambda name: tmp_dir / f"rank1-{name}")
    out = {
        "full": _loop(plan, data, world, own("full2")),
        # SIGTERM reaches rank 1 alone: both ranks must stop after the same step, with one checkpoint
        "cut": _loop(plan, data, world, own("cut2"), signal_at=STOP_AT if rank == 1 else None),
    }
    if rank == 0:  # resumed from a copy: the test resumes the same checkpoint on one process afterwards
        shutil.copytree(tmp_dir / "cut2", tmp_dir / "cut2-again")
    out["resumed"] = _loop(plan, data, world, own("cut2-again"), resume=True)
    out["from_one"] = _loop(plan, data, world, own("cut1"), resume=True)  # a one-process checkpoint, on two ranks
    out["submitit"] = _under_submitit(plan, data, world, own)
    out["disk_full"] = _disk_full(plan, data, world, own)
    return out


def test_two_ranks_stop_together_checkpoint_and_resume_on_two_or_one(compose, tmp_path):
    from speedrun.core.dist import SINGLE
    from speedrun.data.shards import write_shard
    from speedrun.run.checkpoint import list_checkpoints, load_checkpoint

    shard = tmp_path / "fineweb_train_000000.bin"
    write_shard(shard, torch.randint(0, 1024, (40_000,), generator=torch.Generator().manual_seed(2)).numpy())
    one, two = plan_for(compose, *CKPT), plan_for(compose, *CKPT, world=TWO)
    assert (one.grad_accum, two.grad_accum, two.world_size) == (4, 2, 2)
    torch.set_num_threads(1)
    # one process: uninterrupted, and stopped by SIGTERM during step 3 (the checkpoint two ranks resume below)
    full1 = _loop(one, shard, SINGLE, tmp_path / "full1")
    cut1 = _loop(one, shard, SINGLE, tmp_path / "cut1", signal_at=STOP_AT)
    assert cut1["steps"] == STOP_AT and "checkpoint" in cut1["stopped"]
    r0, r1 = on_ranks(_stop_and_resume, two, str(shard), str(tmp_path), out_dir=tmp_path, plan=two)

    full = r0["full"]["losses"]
    assert len(full) == STEPS and all(math.isfinite(x) for x in full) and r1["full"]["losses"] == full
    # the stop: rank 1 got the signal, rank 0 did not; both stopped after step 3, after the same checkpoint
    cut0, cut_1 = r0["cut"], r1["cut"]
    assert cut0["steps"] == cut_1["steps"] == STOP_AT
    assert "another rank" in cut0["stopped"] and f"signal {int(signal.SIGTERM)}" in cut_1["stopped"]
    assert "step_00000003.pt" in cut0["stopped"] and "step_00000003.pt" in cut_1["stopped"]
    assert cut0["losses"] == full[:STOP_AT]
    cut_dir = tmp_path / "cut2"
    assert [p.name for p in list_checkpoints(cut_dir)] == ["step_00000002.pt", "step_00000003.pt"]
    assert not (tmp_path / "rank1-cut2").exists()  # rank 0 alone writes
    payload = load_checkpoint(cut_dir)
    assert payload["ranks"]["world_size"] == 2 and len(payload["ranks"]["rng"]) == 2
    assert payload["ranks"]["positions"] == [cut0["position"]] * 2 == [STOP_AT * two.tokens_per_step] * 2

    # resumed on two ranks: the uninterrupted run's last steps, bit for bit, on both ranks
    for r in (r0, r1):
        assert (r["resumed"]["start"], r["resumed"]["steps"]) == (STOP_AT, STEPS)
        assert r["resumed"]["losses"] == full[STOP_AT:]
    # resumed on one process: the same global batches, so the same losses to float rounding (2e-6, as in
    # tests/distributed/test_two_ranks.py)
    resumed1 = _loop(one, shard, SINGLE, cut_dir, resume=True)
    assert (resumed1["start"], resumed1["steps"]) == (STOP_AT, STEPS)
    for a, b in zip(resumed1["losses"], full[STOP_AT:], strict=True):
        assert abs(a - b) <= 2e-6 * abs(b), (resumed1["losses"], full[STOP_AT:])
    # and the other way: one process's checkpoint at step 3 continued on two ranks follows the one-process run
    assert full1["losses"][:STOP_AT] == cut1["losses"]
    for a, b in zip(r0["from_one"]["losses"], full1["losses"][STOP_AT:], strict=True):
        assert abs(a - b) <= 2e-6 * abs(b), (r0["from_one"]["losses"], full1["losses"][STOP_AT:])
    assert r0["from_one"]["steps"] == r1["from_one"]["steps"] == STEPS

    # under submitit: SIGUSR2 on rank 1 preempts both at step 3, submitit's handler runs on both (rank 0 requeues)
    s0, s1 = r0["submitit"], r1["submitit"]
    usr2 = int(signal.SIGUSR2)
    assert s0["handled"] == s1["handled"] == [usr2]
    p0, p1 = s0["preempted"], s1["preempted"]
    assert (p0["kind"], p1["kind"], p0["steps"], p1["steps"]) == ("Preempted", "Preempted", STOP_AT, STOP_AT)
    assert "requeued" in p0["stopped"] and "another rank's SIGUSR2" in p0["stopped"]
    assert sorted(p0["checkpoints"]) == ["step_00000002.pt", "step_00000003.pt"]
    # SIGTERM on rank 1 at step 5: both checkpoint step 5 and train on to the end, the same steps as without it
    c0, c1 = s0["carry_on"], s1["carry_on"]
    assert c0["stopped"] is c1["stopped"] is None and c0["steps"] == c1["steps"] == STEPS
    assert sorted(c0["checkpoints"]) == ["step_00000005.pt", "step_00000006.pt"] and c0["losses"] == full
    # rank 0 cannot write the checkpoint of step 2: both ranks stop there with its error
    assert r0["disk_full"] == r1["disk_full"]
    assert "checkpoint of step 2 could not be written: OSError" in r0["disk_full"], r0["disk_full"]


# ---------------------------------------------------------------------------------------------------------
# hardware.micro_batch=auto on several ranks

AUTO = [*TINY_RUN, "hardware.micro_batch=auto", "budget.tokens_per_step=1024"]
FITS = {0: 256, 1: 128}
"""Micro-batch tokens each rank's (fake) memory holds: rank 1 is the tighter one."""


def _search(rank: int, world, plan) -> dict:
    from speedrun.run.batch_search import agree_batches, plan_with_batches

    def train_fits(seq_len: int, micro_batch: int) -> None:
        if seq_len * micro_batch > FITS[rank]:
            raise torch.cuda.OutOfMemoryError("fake")

    def eval_fits(batch: int) -> None:
        if batch > FITS[rank] // 32:
            raise torch.cuda.OutOfMemoryError("fake")

    found, _ = plan_with_batches(plan, train_fits, eval_fits, lambda _: None)  # this rank's own search
    agreed = agree_batches(found, world, lambda _: None)
    keys = ("micro_batch", "grad_accum")
    out = {
        "found": [getattr(found, k) for k in keys] + [found.eval.batch_size],
        "agreed": [getattr(agreed, k) for k in keys] + [agreed.eval.batch_size],
        "stages": [(s.seq_len, s.micro_batch) for s in agreed.stages],
    }
    return out


def test_micro_batch_auto_on_two_ranks_runs_the_smallest_choice_of_any_rank(compose, tmp_path):
    """Each rank searches by its own out-of-memory errors (faked here: rank 0 holds 8 sequences of 32, rank 1
    only 4); both run 4, with the accumulation that keeps the global step (2 ranks x 4 x 32 x 4 = 1024 tokens)."""
    plan = plan_for(compose, *AUTO, world=TWO)
    assert plan.micro_batch_search and plan.eval.batch_search and plan.world_size == 2
    s0, s1 = on_ranks(_search, plan, out_dir=tmp_path, plan=plan)
    assert (s0["found"], s1["found"]) == ([8, 2, 8], [4, 4, 4])  # without agreement rank 0 would run out on rank 1
    assert s0["agreed"] == s1["agreed"] == [4, 4, 4] and s0["stages"] == [(32, 4)]
    assert 2 * 4 * 32 * 4 == plan.tokens_per_step


@pytest.mark.parametrize(
    "extra", [["checkpoint.every_steps=10"], ["checkpoint.every_seconds=60"], ["hardware.micro_batch=auto"]]
)
def test_checkpoints_and_the_batch_search_resolve_on_several_ranks(compose, extra):
    plan = resolve(to_config(compose(["dist.nproc=2", *extra])), fake_device("h100"), world=WorldInfo(visible_gpus=2))
    assert plan.world_size == 2
    # the step still splits: 2 ranks x micro-batch x accumulation = tokens_per_step
    assert 2 * plan.micro_batch * plan.model.seq_len * plan.grad_accum == plan.tokens_per_step


def test_a_resume_may_change_the_number_of_ranks_and_nothing_else(tmp_path):
    """dist.nproc / dist.nodes beside resume= replace the run's own (in the config the resumed job runs and in its
    overrides); any other override the run did not have is still refused."""
    from speedrun.errors import ConfigError
    from speedrun.run.checkpoint import save_checkpoint
    from speedrun.run.resume import find_resume

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text("{}")
    config = {"seed": 0, "dist": {"nproc": 2, "nodes": 1, "backend": "auto"}}
    meta = {
        "config": config,
        "overrides": ["dist.nproc=2", "seed=0"],
        "steps": 3,
        "code_fingerprint": code_fingerprint(REPO_ROOT),
    }
    save_checkpoint(run_dir, {"format": 1, "progress": {"steps": 3}}, meta, keep=2)
    asked = f"resume={run_dir}"
    same = find_resume({"resume": str(run_dir)}, [asked], tmp_path, tmp_path)
    assert same.config["dist"]["nproc"] == 2 and same.overrides == ["dist.nproc=2", "seed=0"]
    one = find_resume({"resume": str(run_dir)}, [asked, "dist.nproc=1"], tmp_path, tmp_path)
    assert one.config["dist"] == {"nproc": 1, "nodes": 1, "backend": "auto"} and one.steps == 3
    assert one.overrides == ["seed=0", "dist.nproc=1"]
    with pytest.raises(ConfigError, match="seed=1"):
        find_resume({"resume": str(run_dir)}, [asked, "dist.nproc=1", "seed=1"], tmp_path, tmp_path)


# ---------------------------------------------------------------------------------------------------------
# a whole job on two ranks (the runner, its record and resume, not only the loop)
#
# A two-rank job (the runner, record and resume, not only the loop) stopped by SIGTERM on one rank and resumed with
# resume=<run dir>: on two ranks it completes the same row and ends where an uninterrupted two-rank job ends; on one
# process (dist.nproc=1 beside resume=) it continues the same run with the same global batches.
#
# The ranks are spawned with torchrun's environment and each runs speedrun.run.runner.run_job, as `torchrun -m run`
# would (without Hydra's process around it: rank 1 gets the private dir run_job makes for a rank > 0).

JOB = [
    "debug=smoke",
    "budget.max_steps=6",
    "budget.warmup_steps=0",  # every Stepper call is a training step: the signal lands in step STOP_AT
    "checkpoint.every_steps=2",
    "eval.tokens=2048",
    "quant=off",
    "ttt=off",
]


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from speedrun.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def _signal_during_step(step: int) -> None:
    """SIGTERM to this process during training step ``step`` (as SLURM's or a user's kill of one rank)."""
    from speedrun.core.train import Stepper

    original, calls = Stepper.__call__, [0]

    def stepping(self, batches):
        out = original(self, batches)
        calls[0] += 1
        if calls[0] == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    Stepper.__call__ = stepping  # type: ignore[method-assign]  # this spawned rank's only job


def _job_rank(rank: int, world, overrides: list[str], run_dir: str, signal_rank: int | None) -> None:
    """run_job on this rank, which joins the ranks' group itself (world is None: the harness leaves it to the job)."""
    from speedrun.run.runner import RunContext, run_job

    os.environ["OMP_NUM_THREADS"] = "1"

    if rank == signal_rank:
        _signal_during_step(STOP_AT)
    path = Path(run_dir)
    try:
        run_job(_compose(overrides), RunContext(path, overrides, None, path.parent))
    except KeyboardInterrupt:  # the stopped run: recorded as interrupted, which the test reads
        pass


def _two_ranks(overrides: list[str], run_dir: Path, signal_rank: int | None = None) -> None:
    on_ranks(_job_rank, overrides, str(run_dir), signal_rank, out_dir=run_dir.parent, join=False)


def _train_records(run_dir: Path) -> list[tuple[int, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["train_loss"]) for r in map(json.loads, lines) if "train_loss" in r]


def _close(run_dir: Path, reference: Path) -> None:
    """Every step's training loss of ``run_dir`` once, each within float rounding of ``reference``'s: the same global
    batches on another number of ranks (tests/distributed/test_two_ranks.py measures 2e-6 relative; here equal to
    ~1e-7)."""
    got, want = _train_records(run_dir), _train_records(reference)
    assert [step for step, _ in got] == [step for step, _ in want] == list(range(1, 7))
    for (step, a), (_, b) in zip(got, want, strict=True):
        assert abs(a - b) <= 2e-6 * abs(b), (step, a, b)


def test_a_two_rank_job_stopped_on_one_rank_resumes_on_two_or_one(tmp_path, data_cache):
    """The uninterrupted reference is a one-process job (cheaper than two more ranks; the loop's test above holds
    two ranks resumed against two ranks uninterrupted, bit for bit)."""
    from speedrun.run.runner import RunContext, run_job

    db = tmp_path / "r.sqlite"
    common = [*JOB, f"data.cache_dir={data_cache}", f"results_db={db}"]
    full, cut, again = tmp_path / "full", tmp_path / "cut", tmp_path / "cut-on-one"
    torch.set_num_threads(1)
    reference = run_job(_compose(common), RunContext(full, common, None, tmp_path))
    assert reference["status"] == "ok" and reference["steps"] == 6

    _two_ranks(common, cut, signal_rank=1)  # rank 1 alone is signalled: both stop after step 3
    stopped = json.loads((cut / "result.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["steps"] == STOP_AT, stopped
    assert "another rank" in stopped["error"] and "step_00000003.pt" in stopped["error"]
    assert sorted(p.name for p in (cut / "checkpoints").glob("*.pt")) == ["step_00000002.pt", "step_00000003.pt"]
    shutil.copytree(cut, again)  # the same checkpoint, resumed on one process below

    _two_ranks([f"resume={cut}", *common], tmp_path / "elsewhere")
    resumed = json.loads((cut / "result.json").read_text())
    assert not (tmp_path / "elsewhere" / "result.json").exists()  # the resume runs in the run dir it continues
    assert (resumed["status"], resumed["steps"], resumed["world_size"]) == ("ok", 6, 2)
    assert abs(resumed["val_loss"] - reference["val_loss"]) <= 1e-5 * reference["val_loss"]
    _close(cut, full)
    con = sqlite3.connect(db)
    row = con.execute("SELECT status, steps, resumed_from_step FROM runs WHERE run_id = ?", (str(cut.resolve()),))
    assert row.fetchone() == ("ok", 6, STOP_AT)

    # one process continues the two-rank checkpoint (dist.nproc=1 beside resume=): the same global batches
    overrides = [f"resume={again}", "dist.nproc=1", f"results_db={db}"]
    one = run_job(_compose(overrides), RunContext(tmp_path / "x", overrides, None, tmp_path))
    assert (one["status"], one["steps"], one["world_size"], one["run_dir"]) == ("ok", 6, 1, str(again.resolve()))
    row = con.execute("SELECT status, resumed_from_step FROM runs WHERE run_id = ?", (str(again.resolve()),))
    assert row.fetchone() == ("ok", STOP_AT)
    _close(again, full)


def test_a_job_requeued_into_its_run_dir_resumes_on_two_ranks(tmp_path, data_cache, monkeypatch):
    """A job requeued into its run dir (SLURM's requeue, checkpoint.auto_resume) on two ranks: rank 0 finds the
    checkpoint there, rank 1 (in a private dir of its own, where there is none) follows it and loads the file rank 0
    picks; the job continues the row from its checkpoint. Here the checkpoint is a one-process job's, stopped by SIGTERM
    at step 3, so the requeued job also changes the number of ranks."""
    from speedrun.core.train import Stepper
    from speedrun.run.runner import RunContext, run_job

    db = tmp_path / "r.sqlite"
    common = [*JOB, f"data.cache_dir={data_cache}", f"results_db={db}"]
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
