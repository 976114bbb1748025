"""One run on several processes (speedrun.distributed.world, speedrun.distributed.launch, plan.distributed): what a
dist request resolves to or is refused with, the World a launcher starts (torchrun, submitit, the pool), its
environment and private dirs, stop signals held while the record is written, and which rank's exit ended a run.
Two real ranks against one process: tests/distributed/test_two_ranks.py; end to end through `python -m run` /
torchrun: tests/e2e/test_dist_cli.py."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from speedrun.distributed.launch import RankExit, first_exit
from speedrun.errors import PlanError
from speedrun.plan import WorldInfo
from support.ranks import TINY_RUN, plan_for

ACCUM = 4  # one rank: 4 micro-batches a step; two ranks: 2 each, the same tokens


# ---------------------------------------------------------------------------------------------------------
# resolve: what a dist request becomes, and what is refused before any rank starts


def test_the_plan_splits_a_global_step_over_the_ranks(compose):
    one = plan_for(compose, *TINY_RUN)
    two = plan_for(compose, *TINY_RUN, "dist.nproc=2")
    assert (one.grad_accum, one.world_size, one.dist.launch) == (ACCUM, 1, "single")
    assert (two.grad_accum, two.world_size, two.dist.launch, two.dist.backend) == (ACCUM // 2, 2, "self", "gloo")
    assert two.tokens_per_step == one.tokens_per_step == 256  # global, whatever the world size
    gpu = plan_for(compose, "dist.nproc=2", device="h100", world=WorldInfo(visible_gpus=8))
    assert gpu.dist.backend == "nccl" and gpu.grad_accum * 2 * gpu.micro_batch * gpu.model.seq_len == 524288


@pytest.mark.parametrize(
    "overrides, world, device, message",
    [
        (["dist.nproc=4"], WorldInfo(visible_gpus=2), "h100", "needs 4 GPUs on this node, 2 visible"),
        (["dist.nproc=2"], None, "h100", "needs 2 GPUs on this node, 1 visible"),
        ([*TINY_RUN, "dist.nproc=2", "budget.tokens_per_step=320"], None, "cpu", "must be a multiple of 128"),
        ([*TINY_RUN, "dist.nproc=3"], None, "cpu", "does not split over 3 ranks"),
        (["dist.nodes=2", "dist.nproc=8"], WorldInfo(visible_gpus=8), "h100", "hydra/launcher=slurm"),
        (["dist.backend=nccl", "dist.nproc=2"], None, "cpu", "dist.backend=nccl needs CUDA"),
        (["dist.nproc=4"], WorldInfo("torchrun", 0, 8, 0, 8, 8), "h100", "dist.nproc=4, but torchrun started 8"),
        (
            ["ttt=record", "ttt.warm_start_chains=2", "dist.nproc=4"],
            WorldInfo(visible_gpus=4),
            "h100",
            "leave 2 without TTT work; set ttt.warm_start_chains=4",
        ),
    ],
)
def test_a_bad_dist_request_is_refused_at_resolve(compose, overrides, world, device, message):
    with pytest.raises(PlanError, match=message):
        plan_for(compose, *overrides, world=world, device=device)


def test_a_started_world_comes_from_the_launcher(compose):
    rank = WorldInfo("torchrun", rank=9, world_size=16, local_rank=1, local_world_size=8, visible_gpus=8)
    # 524288 tokens over 16 ranks: the profile's 64 sequences of 1024 do not split, so the profile's default
    # becomes 32; the same 64 set by the user is refused, naming the fixes
    plan = plan_for(compose, world=rank, device="h100")
    assert (plan.micro_batch, plan.grad_accum) == (32, 1)
    with pytest.raises(PlanError, match="tokens_per_step=1048576, or hardware.micro_batch=32"):
        plan_for(compose, "hardware.micro_batch=64", world=rank, device="h100")
    plan = plan_for(compose, "hardware.micro_batch=16", world=rank, device="h100")  # dist.nproc left at 1
    assert (plan.dist.world_size, plan.dist.nodes, plan.dist.nproc, plan.dist.launch) == (16, 2, 8, "torchrun")
    assert plan.grad_accum == 524288 // (16 * 16 * 1024) == 2
    with pytest.raises(PlanError, match="1 visible"):  # local rank 1 has no cuda:1
        plan_for(compose, world=dataclasses.replace(rank, visible_gpus=1), device="h100")


# ---------------------------------------------------------------------------------------------------------
# launchers: environments and command lines


def test_submitit_job_environment_maps_to_torch_rendezvous(monkeypatch):
    """A SLURM task of a 2-node x 8 job (as submitit sees it) gets env:// variables: master = first node,
    one port for every task of the job, ranks from SLURM's ids."""
    from speedrun.distributed import environment as dist

    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    slurm = dict(
        SLURM_JOB_ID="4242",
        SLURM_NTASKS="16",
        SLURM_JOB_NUM_NODES="2",
        SLURM_NODEID="1",
        SLURM_PROCID="9",
        SLURM_LOCALID="1",
        SLURM_JOB_NODELIST="gpu[07-08]",
    )
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    assert dist.submitit_rendezvous() is None  # a shell inside an allocation has SLURM_* too: not a rank
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    env = dist.submitit_rendezvous()
    assert {k: env[k] for k in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")} == dict(
        MASTER_ADDR="gpu07", RANK="9", WORLD_SIZE="16", LOCAL_RANK="1", LOCAL_WORLD_SIZE="8"
    )
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_LOCALID", "3")
    monkeypatch.setenv("SLURM_NODEID", "0")
    other = dist.submitit_rendezvous()
    assert other["MASTER_PORT"] == env["MASTER_PORT"] and 20000 <= int(env["MASTER_PORT"]) <= 60000
    assert other["RANK"] == "3" and other["MASTER_ADDR"] == "gpu07"
    info = dist.world_from_env({**env, "SUBMITIT_EXECUTOR": "slurm"}, visible_gpus=8)
    assert info == WorldInfo("submitit", rank=9, world_size=16, local_rank=1, local_world_size=8, visible_gpus=8)
    assert dist.world_from_env({}, visible_gpus=2) == WorldInfo(visible_gpus=2)  # a plain run


def test_dist_nvls_sets_nvlink_multicast_only_when_asked(compose, monkeypatch):
    """dist.nvls: null leaves NCCL's default (and the user's own variable) alone, false and true set it off and on,
    and a rank sets it before its process group is made, where NCCL reads it."""
    from speedrun.distributed import environment
    from speedrun.distributed import world as dist

    keys = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")
    env: dict[str, str] = {}
    environment.set_process_env(env)
    assert not set(keys) & set(env) and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    env = {"NCCL_NVLS_ENABLE": "0"}
    environment.set_process_env(env, nvls=None)
    assert env["NCCL_NVLS_ENABLE"] == "0"
    environment.set_process_env(env, nvls=True)
    assert [env[k] for k in keys] == ["1", "0"]
    environment.set_process_env(env, nvls=False)
    assert [env[k] for k in keys] == ["0", "1"]

    assert plan_for(compose).dist.nvls is None
    plan = plan_for(compose, "dist.nvls=false")
    assert plan.dist.nvls is False
    for key in keys:
        monkeypatch.delenv(key, raising=False)
    seen = {}

    def init_process_group(*args, **kwargs):
        seen.update({k: os.environ.get(k) for k in keys})
        raise RuntimeError("stopped before the process group")

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    with pytest.raises(RuntimeError, match="stopped before"):
        dist.RunWorld(WorldInfo("torchrun", 0, 2, 0, 2, 0)).init(plan)
    assert seen == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def test_ranks_above_zero_get_no_run_dir_of_their_own():
    from speedrun.distributed.launch import worker_argv

    argv = ["run.py", "debug=smoke", "hydra.run.dir=outputs/x"]
    assert worker_argv(argv, {}) == argv and worker_argv(argv, {"RANK": "0", "WORLD_SIZE": "2"}) == argv
    env = {"RANK": "1", "WORLD_SIZE": "2"}
    out = worker_argv(argv, env)
    private = env["SPEEDRUN_RANK_DIR"]
    assert out == ["run.py", "debug=smoke", f"hydra.run.dir='{private}'", "hydra.output_subdir=null"]
    assert Path(private).is_dir()
    os.rmdir(private)
    with pytest.raises(SystemExit, match="cannot run inside torchrun"):
        worker_argv(["run.py", "-m", "seed=0,1"], {"RANK": "0", "WORLD_SIZE": "2"})


def test_slurm_launcher_takes_nodes_and_ranks_from_dist(compose):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra.utils import instantiate

    for option in ("slurm", "slurm_local"):
        cfg = compose(
            [f"hydra/launcher={option}", "dist.nproc=8", "dist.nodes=2" if option == "slurm" else "seed=0"],
            return_hydra_config=True,
        )
        launcher = instantiate(cfg.hydra.launcher)  # as Hydra builds it: interpolations resolved against the job
        nodes = 2 if option == "slurm" else 1
        assert (launcher.params["nodes"], launcher.params["tasks_per_node"], launcher.params["gpus_per_node"]) == (
            nodes,
            8,
            8,
        )


def test_the_pool_hands_each_job_its_nproc_gpus(tmp_path):
    from omegaconf import OmegaConf

    from hydra_plugins.speedrun_plugins import job_pool

    jobs = []
    for i, nproc in enumerate([2, 1, 2, 2]):
        job_dir = tmp_path / str(i)
        body = (
            "import json, os, time\nt0 = time.time(); time.sleep(0.6)\n"
            f"json.dump(dict(status='ok', gpus=os.environ['CUDA_VISIBLE_DEVICES'], t0=t0, t1=time.time()), "
            f"open({str(job_dir / 'result.json')!r}, 'w'))\n"
        )
        config = OmegaConf.create(
            {
                "dist": {"nproc": nproc},
                "hydra": {"job": {"name": "fake", "num": i}, "runtime": {"output_dir": str(job_dir)}},
            }
        )
        jobs.append(
            job_pool.Job(
                num=i,
                overrides=[f"job={i}"],
                config=config,
                job_dir=job_dir,
                cmd=[sys.executable, "-c", body],
                gpus=nproc,
            )
        )
    rets = job_pool.Pool(["0", "1", "2"], fail_fast=False, echo=False, stop_timeout_s=10).run(jobs)
    assert all(r.status.name == "COMPLETED" for r in rets)
    results = [r.return_value.record for r in rets]  # the objective carries the job's result.json
    assert [len(r["gpus"].split(",")) for r in results] == [2, 1, 2, 2]
    for a in results:  # no GPU is in two jobs at once
        for b in results:
            if a is not b and a["t0"] < b["t1"] and b["t0"] < a["t1"]:
                assert not set(a["gpus"].split(",")) & set(b["gpus"].split(","))
    too_big = dataclasses.replace(jobs[0], gpus=4, proc=None, ret=None)
    (ret,) = job_pool.Pool(["0", "1"], fail_fast=False, echo=False, stop_timeout_s=10).run([too_big])
    assert ret.status.name == "FAILED" and "dist.nproc=4" in str(ret._return_value)


def test_stop_signals_are_held_while_the_record_is_written():
    """A SIGTERM that arrives through another thread while the record is written is delivered after it."""
    from speedrun.run.signals import stop_signals_deferred

    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append(time.monotonic()))
    try:
        with stop_signals_deferred():
            threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM)).start()
            time.sleep(0.3)
            held_until = time.monotonic()
            assert not seen
        assert seen and seen[0] >= held_until
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_rank_that_ended_the_run_is_the_first_and_a_killed_one_before_those_it_broke():
    killed, broken, stopped = RankExit(1, -9, 100), RankExit(0, 1, 100), RankExit(0, -15, 100)
    assert first_exit([broken, killed]) == killed  # seen in one poll: the kill caused the lost connection
    assert first_exit([RankExit(1, 1, 100), stopped]) == RankExit(1, 1, 100)  # the launcher's SIGTERM came after
    assert first_exit([RankExit(0, 1, 99), killed]) == RankExit(0, 1, 99)  # a second earlier
    assert first_exit([RankExit(1, 1, 100), broken]) == RankExit(1, 1, 100)  # else the order the launcher saw
    assert killed.describe().startswith("rank 1 died (killed by signal 9, SIGKILL): ")
    assert broken.describe().startswith("rank 0 died (exit code 1)")
