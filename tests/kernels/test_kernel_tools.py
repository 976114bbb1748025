"""The kernel group's tools: tuned tables (lookup, provenance, refusals), the tuner's numerics check and winner,
the step profile, FP8 targets, the shared compile cache, the sweep's overhead column and fa3's trust flag, and
`python -m speedrun.tune --help`, which shows its whole description."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest
import torch

from speedrun.config import to_config
from speedrun.errors import ConfigError, PlanError
from speedrun.plan import resolve
from speedrun.tune import Candidate, check_numerics, results_table, tune
from support.cli import run_python
from support.devices import fake_device


@pytest.fixture
def table_dir(tmp_path, monkeypatch):
    import speedrun.kernels.tuned as tuned

    monkeypatch.setattr(tuned, "TABLE_DIR", tmp_path)
    return tmp_path


PROVENANCE = {
    "device_name": "NVIDIA H100 80GB HBM3",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "date": "2026-11-26",
    "model": "pgolf_baseline",
    "default_tokens_per_s": 1.8e6,
    "winner_tokens_per_s": 2.0e6,
}


def test_tuned_table_is_picked_by_card_and_model_with_its_provenance(compose, table_dir):
    from speedrun.kernels.tuned import load_entry, write_entry

    write_entry("h100", "pgolf_baseline", {"cuda_graphs": True, "fp8": ["mlp_down"]}, PROVENANCE)
    write_entry("h100", "tiny", {"compile_mode": "max-autotune-no-cudagraphs"}, {"device_name": "x"})
    settings, prov = load_entry("h100", "pgolf_baseline")
    assert settings == {"cuda_graphs": True, "fp8": ["mlp_down"]} and prov == PROVENANCE  # both entries kept
    plan = resolve(to_config(compose(["kernel=tuned"])), fake_device("h100"))
    assert plan.kernel.source == "tuned:h100/pgolf_baseline"
    assert (plan.kernel.cuda_graphs, plan.kernel.fp8) == (True, ("mlp_down",))
    mine = resolve(to_config(compose(["kernel=tuned", "kernel.cuda_graphs=false"])), fake_device("h100"))
    assert not mine.kernel.cuda_graphs and mine.kernel.fp8 == ("mlp_down",)  # the command line wins
    assert mine.kernel.source.endswith("+set")


def test_tuned_refuses_a_card_or_model_without_a_table(compose, table_dir):
    from speedrun.kernels.tuned import write_entry

    with pytest.raises(PlanError, match=r"no tuned table for this card \(h200\).*python -m speedrun.tune"):
        resolve(to_config(compose(["kernel=tuned"])), fake_device("h200"))
    write_entry("h200", "tiny", {}, {})
    with pytest.raises(PlanError, match=r"no entry for model=pgolf_baseline \(it has: tiny\)"):
        resolve(to_config(compose(["kernel=tuned"])), fake_device("h200"))
    (table_dir / "h200.yaml").write_text("models:\n  pgolf_baseline:\n    settings: {compile_mode: fastest}\n")
    with pytest.raises(ConfigError, match="h200.yaml"):
        resolve(to_config(compose(["kernel=tuned"])), fake_device("h200"))


SMALL = ["model=tiny", "model.n_layer=1", "model.seq_len=64", "hardware.micro_batch=4", "budget.tokens_per_step=512"]
"""A one-layer tiny model, one 4 x 64 micro-batch per step: seconds on two shared CPU cores."""

LOSSES = [6.93, 6.41, 5.88, 5.52]


def _fake_run(speeds: dict[str, float], losses: dict[str, list[float]]):
    def run(c: Candidate) -> None:
        if c.label == "kernel.boom=true":
            raise RuntimeError("CUDA error: an illegal memory access")
        c.tokens_per_s = speeds[c.label]
        c.step_ms = [1000.0] * 4
        c.losses = losses.get(c.label, LOSSES)

    return run


def test_tune_rejects_a_wrong_candidate_however_fast():
    cands = [
        Candidate([]),
        Candidate(["kernel.cuda_graphs=true"]),
        Candidate(["kernel.fp8=[all]"]),
        Candidate(["kernel.boom=true"]),
        Candidate(["kernel.compile_mode=max-autotune"], refused="refused: x"),
    ]
    speeds = {"default": 1.0e6, "kernel.cuda_graphs=true": 1.2e6, "kernel.fp8=[all]": 2.0e6}
    close = [x + 0.004 for x in LOSSES]
    wrong = [x + 0.5 for x in LOSSES]  # a broken kernel: fast and wrong
    winner = tune(
        cands,
        _fake_run(speeds, {"kernel.cuda_graphs=true": close, "kernel.fp8=[all]": wrong}),
        atol=0.03,
        rtol=0.01,
        log=lambda m: None,
    )
    assert winner is cands[1]
    assert cands[2].numerics.startswith("step 1: loss 7.4300 vs default 6.9300")
    assert cands[3].error.startswith("RuntimeError") and cands[3].numerics is None
    assert cands[4].tokens_per_s is None  # refused: never measured
    table = results_table(cands, winner)
    assert "* kernel.cuda_graphs=true" in table and "1.200" in table and "refused" in table and "failed" in table


def test_numerics_check_bounds_and_nan():
    assert check_numerics(LOSSES, LOSSES) == "ok"
    assert check_numerics(LOSSES, [x + 0.03 + 0.01 * x - 1e-6 for x in LOSSES]) == "ok"  # at the bound
    assert check_numerics(LOSSES, [x + 0.03 + 0.01 * x + 1e-3 for x in LOSSES]).startswith("step 1")
    assert check_numerics(LOSSES, LOSSES[:2] + [math.nan, 5.5]).startswith("step 3")
    assert "losses against" in check_numerics(LOSSES, LOSSES[:3])


def test_default_wins_when_nothing_beats_it_by_the_margin():
    cands = [Candidate([]), Candidate(["kernel.cuda_graphs=true"])]
    winner = tune(
        cands, _fake_run({"default": 1.0e6, "kernel.cuda_graphs=true": 1.005e6}, {}), 0.03, 0.01, lambda m: None
    )
    assert winner is cands[0]


def test_tune_end_to_end_on_cpu_writes_a_table_that_kernel_tuned_reads(compose, table_dir, data_cache, capsys):
    from speedrun.tune import main

    rc = main(
        ["--steps", "1", "--table-dir", str(table_dir), *SMALL, "budget.warmup_steps=0", f"data.cache_dir={data_cache}"]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "[1/1] default: measuring" in out and "| * default" in out
    text = (table_dir / "cpu.yaml").read_text()
    for key in ("device_name", "torch", "date", "model_shape", "default_tokens_per_s", "winner_tokens_per_s"):
        assert f"{key}:" in text
    plan = resolve(to_config(compose(["kernel=tuned", "model=tiny"])), fake_device("cpu"))
    assert plan.kernel.source == "tuned:cpu/tiny"


# ---- profile, fp8 targets, cache, sweep column, fa3 --------------------------------------------------------------


def test_top_kernels_table():
    from speedrun.kernels.profile import KernelRow, top_kernels_table

    rows = [
        KernelRow("triton_poi_fused_add_mul_0", 90, 45.0),
        KernelRow("sm90_xmma_gemm_bf16", 60, 120.0),
        KernelRow("cudnn_sdpa_bwd", 9, 30.0),
        KernelRow("tiny", 1, 1.0),
    ]
    text = top_kernels_table(rows, step_ms=100.0, steps=2, top=3)
    lines = text.splitlines()
    assert "kernels busy 98.0 ms per step (98%)" in lines[0]
    assert lines[3].split("|")[1].strip() == "sm90_xmma_gemm_bf16" and "60.0" in lines[3]  # 120 ms of 200
    assert "(1 more)" in text


def test_the_step_split_sorts_kernels_by_kind_and_leaves_the_rest_idle():
    from speedrun.kernels.profile import KernelRow, kind_of, split_line, step_split

    kinds = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "GEMM",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "GEMM",
        "aten::addmm": "GEMM",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop": "attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "comms",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "elementwise",
        "aten::add_": "elementwise",
    }
    assert {name: kind_of(name) for name in kinds} == kinds
    rows = [KernelRow(name, 1, ms) for name, ms in zip(kinds, (40.0, 20.0, 0.0, 30.0, 0.0, 6.0, 14.0, 0.0))]
    split = step_split(rows, step_ms=60.0, steps=2)
    assert split == {"GEMM": 30.0, "attention": 15.0, "elementwise": 7.0, "comms": 3.0, "idle": 5.0}
    line = split_line(split, 60.0, 0.4213)
    assert line.startswith("step split: GEMM 30.0 ms (50%), attention 15.0 ms (25%)") and "MFU 42.1%" in line


def test_profile_steps_on_cpu_writes_a_trace_and_undoes_its_steps(compose, tmp_path, data_cache):
    from speedrun.core.train import Stepper, flops_per_token
    from speedrun.kernels.profile import profile_steps
    from speedrun.run.build import build_attention, build_data, build_model

    plan = resolve(to_config(compose([*SMALL, f"data.cache_dir={data_cache}"])), fake_device("cpu"))
    data = build_data(plan, lambda m: None)
    model, forward, _, opts = build_model(plan, build_attention(plan), data.bos_id)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logged: list[str] = []
    peak = 1e12  # a made-up card: the MFU is the step's FLOPs over its wall time and this
    keys = profile_steps(
        Stepper(model, forward, opts, plan), data.train_batches, tmp_path, logged.append, 2, peak_flops=peak
    )
    assert (tmp_path / "trace.json").stat().st_size > 0 and keys["profile_step_ms"] > 0
    assert "% of step" in logged[0] and "aten::" in logged[0] and "\nstep split: GEMM " in logged[0]
    split = keys["profile_split"]
    assert split["GEMM"] > 0 and split["elementwise"] > 0 and sum(split.values()) >= keys["profile_step_ms"] * 0.99
    flops = flops_per_token(plan, plan.stages[-1].seq_len) * plan.tokens_per_step
    assert keys["profile_mfu"] == pytest.approx(flops / (keys["profile_step_ms"] / 1000) / peak, rel=1e-2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _calls(table: str, op: str) -> int:
    rows = [line.split("|") for line in table.splitlines() if line.startswith("|")]
    return next(int(cells[2]) for cells in rows if cells[1].strip() == op)


@pytest.mark.parametrize("enable_at", [0.5, 0.0])
def test_profile_steps_profiles_the_layer_loop_states_that_training_runs(compose, tmp_path, data_cache, enable_at):
    """A loop switched on mid-run: both states, each labelled (the looped step runs more layer passes); a loop on
    from the first step: that state alone (profiling the other one would time its compile). The loop is left off."""
    from speedrun.core.train import Stepper, trained_shapes
    from speedrun.kernels.profile import profile_steps
    from speedrun.run.build import build_attention, build_data, build_model

    loop = ["model.n_layer=2", "model.loop.start=0", "model.loop.end=0", "model.loop.num=2"]
    overrides = [*SMALL, *loop, f"model.loop.enable_at={enable_at}", f"data.cache_dir={data_cache}"]
    plan = resolve(to_config(compose(overrides)), fake_device("cpu"))
    data = build_data(plan, lambda m: None)
    model, forward, _, opts = build_model(plan, build_attention(plan), data.bos_id)
    logged: list[str] = []
    shapes = trained_shapes(plan)
    keys = profile_steps(Stepper(model, forward, opts, plan), data.train_batches, tmp_path, logged.append, 1, shapes)
    assert not model.loop_active
    if enable_at > 0:
        assert shapes == [(0, False), (0, True)] and len(logged) == 2
        assert "(layer loop off)" in logged[0] and "(layer loop on)" in logged[1]
        assert keys["profile_step_ms_looped"] > 0 and (tmp_path / "trace_looped.json").stat().st_size > 0
        assert keys["profile_layer_loop"] == "off"
        assert _calls(logged[1], "aten::mm") > _calls(logged[0], "aten::mm")  # 4 layer passes, not 2
    else:
        assert shapes == [(0, True)] and len(logged) == 1 and "(layer loop on)" in logged[0]
        assert "profile_step_ms_looped" not in keys and keys["profile_step_ms"] > 0
        assert keys["profile_layer_loop"] == "on"


def test_profile_steps_takes_each_loop_state_at_the_longest_length_training_runs_it(compose, tmp_path, data_cache):
    """Context 32 until 0.6, then 64, the loop on from 0.3: training runs the loop off at 32 only, so that is where
    the unlooped step is profiled (at 64 it was never compiled), and the looped one at 64."""
    from speedrun.core.train import Stepper, trained_shapes
    from speedrun.kernels.profile import profile_steps
    from speedrun.run.build import build_attention, build_data, build_model

    loop = ["model.n_layer=2", "model.loop.start=0", "model.loop.end=0", "model.loop.num=2", "model.loop.enable_at=0.3"]
    progressive = ["schedule=progressive", "schedule.seq_len=[32@0.6,64@1.0]"]
    plan = resolve(
        to_config(compose([*SMALL, *loop, *progressive, f"data.cache_dir={data_cache}"])), fake_device("cpu")
    )
    data = build_data(plan, lambda m: None)
    model, forward, _, opts = build_model(plan, build_attention(plan), data.bos_id)
    shapes = trained_shapes(plan)
    assert shapes == [(0, False), (0, True), (1, True)]
    keys = profile_steps(Stepper(model, forward, opts, plan), data.train_batches, tmp_path, lambda _: None, 1, shapes)
    assert keys["profile_seq_len"] == 32 and keys["profile_seq_len_looped"] == 64
    assert keys["profile_layer_loop"] == "off" and not model.loop_active


@pytest.mark.parametrize(
    "targets,per_block",
    [
        (("mlp_down",), 1),
        (("mlp",), 2),
        (("attn_proj",), 1),
        (("attn_qkv",), 3),
        (("mlp", "attn_proj"), 3),
        (("all",), 6),
    ],
)
def test_fp8_targets_convert_the_named_linears(targets, per_block):
    from speedrun.core.attention import get_backend
    from speedrun.core.fp8 import FP8Linear, convert_linears
    from speedrun.core.model import GPT, ModelShape

    model = GPT(
        ModelShape(vocab_size=64, n_layer=2, d_model=32, n_head=2, n_kv_head=1, mlp_mult=2, seq_len=16),
        get_backend("math"),
    )
    assert convert_linears(model.blocks, targets) == 2 * per_block
    if targets == ("mlp_down",):
        assert isinstance(model.blocks[1].mlp.proj, FP8Linear) and type(model.blocks[1].mlp.fc) is torch.nn.Linear


def test_compile_cache_env_keeps_the_users_own(tmp_path):
    from hydra_plugins.speedrun_plugins.pool_launcher import PoolLauncherConf
    from speedrun.kernels.cache import cache_env

    env = cache_env(tmp_path, {})
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    assert cache_env(tmp_path, {"TRITON_CACHE_DIR": "/mine"}) == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    assert cache_env(None, {}) == {} and PoolLauncherConf.compile_cache == "outputs/.compile_cache"


def test_sweep_summary_reports_wall_overhead():
    from speedrun.report.manifest import JobEntry
    from speedrun.report.sweep import summarize

    jobs = [JobEntry(0, ["kernel=default"], state="launched"), JobEntry(1, ["kernel=tuned"], state="launched")]
    results = [
        {"status": "ok", "wall_seconds": 83.0, "train_seconds": 20.0, "seed": 0},
        {"status": "ok", "wall_seconds": 35.5, "train_seconds": 20.0, "seed": 0},
    ]
    s = summarize(jobs, results)
    assert "overhead_s" in s.metrics  # the report's leaderboard has the same column (one layout)
    assert [g.metric("overhead_s") for g in s.groups] == [[63.0], [15.5]]


def test_fa3_trusts_only_the_builds_it_names(compose, monkeypatch):
    from speedrun.core.attention import KernelUnavailable, load_fa3

    def opts(*overrides):
        return dict(resolve(to_config(compose(["attn=fa3", *overrides])), fake_device("h100")).attn_options)

    assert opts()["trust_remote_code"] is True  # varunneal/flash-attention-3, named in REPOS
    assert opts("attn.fa3_repo=someone/fa3")["trust_remote_code"] is False
    assert opts("attn.fa3_repo=someone/fa3", "attn.fa3_trust_remote_code=true")["trust_remote_code"] is True
    seen = {}

    def get_kernel(repo, trust_remote_code=False, **pin):
        seen[repo] = trust_remote_code
        if not trust_remote_code:
            raise ValueError(f"Kernel repo {repo} is not from a trusted org")
        return types.SimpleNamespace(flash_attn_func=lambda *a, **k: None)

    monkeypatch.setitem(sys.modules, "kernels", types.SimpleNamespace(get_kernel=get_kernel))
    assert load_fa3("varunneal/flash-attention-3", version=1, trust_remote_code=True) is not None
    with pytest.raises(KernelUnavailable, match="attn.fa3_trust_remote_code=true"):
        load_fa3("someone/fa3", version=1)
    assert seen == {"varunneal/flash-attention-3": True, "someone/fa3": False}


def test_graphed_step_matches_the_plain_step(compose, data_cache, monkeypatch):
    """kernel.cuda_graphs on CPU with the two CUDA calls stood in for (a "graph" whose replay reruns the captured
    function on the static buffers and writes its static output, as a real replay does): two eager micro-batches,
    capture on the third, replays after; one graph per shape; the same losses and weights as the plain Stepper,
    and gradients kept allocated (zeroed in place) between steps."""
    import dataclasses

    from speedrun.core.compile import GraphedMicroStep
    from speedrun.core.train import Stepper
    from speedrun.run.build import build_attention, build_data, build_model

    class Replay:
        def __init__(self, fn, out):
            self.fn, self.out = fn, out

        def replay(self):
            self.out.copy_(self.fn())

    monkeypatch.setattr(GraphedMicroStep, "on_side_stream", lambda self, fn: fn())
    monkeypatch.setattr(GraphedMicroStep, "record", lambda self, fn: (lambda out: (Replay(fn, out), out))(fn()))
    plan = resolve(
        to_config(compose([*SMALL[:-1], "budget.tokens_per_step=1024", f"data.cache_dir={data_cache}"])),
        fake_device("cpu"),
    )
    assert plan.grad_accum == 4
    graphed_plan = dataclasses.replace(plan, kernel=dataclasses.replace(plan.kernel, cuda_graphs=True))
    data = build_data(plan, lambda m: None)
    runs = []
    for p in (plan, graphed_plan):
        torch.manual_seed(0)
        model, forward, _, opts = build_model(p, build_attention(p), data.bos_id)
        stepper = Stepper(model, forward, opts, p)
        batches = data.train_batches(64, 4)
        losses = [float(stepper(batches)) for _ in range(3)]
        runs.append((losses, model, stepper))
    (plain, plain_model, _), (graphed, graphed_model, stepper) = runs
    assert len(stepper.micro.graphs) == 1 and stepper.micro.seen[next(iter(stepper.micro.seen))] == 3
    assert plain == pytest.approx(graphed, abs=1e-5)
    for a, b in zip(plain_model.parameters(), graphed_model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    used = [p for p in graphed_model.parameters() if p.numel()]  # one layer: skip_weights is (0, d), never used
    assert all(p.grad is not None and not p.grad.any() for p in used)
    assert all(p.grad is None for p in plain_model.parameters())
    stepper(data.train_batches(32, 8))  # another context length: its own eager calls, then its own graph
    assert len(stepper.micro.graphs) == 2


def test_micro_batch_from_the_kernel_group_a_table_or_the_hardware(compose, table_dir):
    from speedrun.kernels.tuned import write_entry

    h100 = fake_device("h100")
    default = resolve(to_config(compose([])), h100)
    write_entry("h100", "pgolf_baseline", {"micro_batch": 2 * default.micro_batch}, PROVENANCE)
    tuned = resolve(to_config(compose(["kernel=tuned"])), h100)
    assert tuned.micro_batch == tuned.kernel.micro_batch == 2 * default.micro_batch
    assert tuned.grad_accum * 2 == default.grad_accum and tuned.tokens_per_step == default.tokens_per_step
    assert tuned.kernel.result_keys()["kernel_micro_batch"] == tuned.micro_batch
    # a micro-batch the run (or its experiment) set wins over the table's
    mine = resolve(to_config(compose(["kernel=tuned", "hardware.micro_batch=16"])), h100)
    assert mine.micro_batch == 16 and mine.kernel.micro_batch is None
    assert resolve(to_config(compose(["kernel.micro_batch=16"])), h100).micro_batch == 16
    with pytest.raises(PlanError, match=r"hardware.micro_batch=32 and kernel.micro_batch=16 both set"):
        resolve(to_config(compose(["kernel.micro_batch=16", "hardware.micro_batch=32"])), h100)
    with pytest.raises(ConfigError, match="kernel.micro_batch=0 must be >= 1"):
        to_config(compose(["kernel.micro_batch=0"]))


def test_tuner_candidates_resolve_and_include_a_bigger_micro_batch(compose):
    from speedrun.tune import candidate_overrides, main

    h100 = fake_device("h100")
    plan = resolve(to_config(compose([])), h100)
    for quick in (True, False):
        wanted = candidate_overrides(plan, quick)
        assert wanted[0] == [] and [f"kernel.micro_batch={2 * plan.micro_batch}"] in wanted
        assert (["kernel.fused_ce=true"] in wanted) is not quick
        for extra in wanted:
            assert all(o.startswith("kernel.") for o in extra)
            resolve(to_config(compose(extra)), h100)  # every listed candidate is one the resolver accepts
    assert main(["--candidate", "hardware.micro_batch=8"]) == 1  # refused before anything is built


def test_peak_memory_counts_reserved_memory_under_cuda_graphs(monkeypatch):
    """A graph's private pool is missed by max_memory_allocated: graphed runs record reserved memory, and say so."""
    from speedrun.run.peak_memory import PeakMemory

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 559 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 12_000 * 2**20)
    for graphs, want in ((False, (559.0, "training")), (True, (12_000.0, "reserved"))):
        peak = PeakMemory("cuda", graph_pools=graphs)
        peak.start()
        got = peak.read()
        assert (got["peak_mem_mb"], got["peak_mem_scope"]) == want
    assert not PeakMemory("cpu", graph_pools=True).graph_pools  # no graphs off CUDA


def test_shipped_tuned_tables_load_and_say_where_they_come_from(compose):
    """Every table in conf/kernel/tuned validates against the schema, carries its provenance, and kernel=tuned
    resolves it on its card."""
    from speedrun.kernels.tuned import TABLE_DIR, load_entry

    tables = sorted(TABLE_DIR.glob("*.yaml"))
    assert tables, "no tuned table shipped"
    for path in tables:
        settings, prov = load_entry(path.stem, "pgolf_baseline")
        for key in ("device_name", "torch", "date", "default_tokens_per_s", "winner_tokens_per_s", "command"):
            assert prov.get(key), f"{path.name}: provenance lacks {key}"
        plan = resolve(to_config(compose(["kernel=tuned"])), fake_device(path.stem))
        assert plan.kernel.source == f"tuned:{path.stem}/pgolf_baseline"
        assert plan.kernel.cuda_graphs == bool(settings.get("cuda_graphs"))
        assert plan.micro_batch == settings.get("micro_batch", plan.micro_batch)


def test_compile_per_block_traces_one_graph_for_all_blocks_and_matches_eager(compose):
    """kernel.compile_scope=blocks (regional compilation) on CPU: four blocks share their graphs (two: the first
    block's x and x0 are one tensor, an aliasing dynamo guards on) and the head is one more, with no graph break;
    the loss is eager's; the model called directly (as GPTQ and TTT do) stays eager."""
    from torch._dynamo.utils import counters

    from speedrun.run.build import build_attention, build_model

    overrides = ["model=tiny", "model.n_layer=4", "model.seq_len=32", "hardware.micro_batch=2"]
    overrides += ["budget.tokens_per_step=64", "hardware.compile=true", "kernel.compile_scope=blocks"]
    plan = resolve(to_config(compose(overrides)), fake_device("cpu"))
    assert plan.kernel.compile_scope == "blocks" and plan.kernel.result_keys()["kernel_compile_scope"] == "blocks"
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, forward, _, _ = build_model(plan, build_attention(plan), bos_id=1)
    x = torch.randint(0, plan.model.vocab_size, (2, 32))
    y = torch.roll(x, -1, dims=1)
    counters.clear()
    loss = forward(x, y)
    assert counters["stats"]["unique_graphs"] == 3 and not counters["graph_break"]
    eager = model(x, y)
    assert counters["stats"]["unique_graphs"] == 3  # the direct call compiled nothing
    assert torch.allclose(loss, eager, rtol=1e-4, atol=1e-5)
    loss.backward()  # gradients flow through the compiled regions to the model's own parameters
    assert all(p.grad is not None for p in model.blocks[0].parameters())
    torch._dynamo.reset()


def test_compile_per_block_is_refused_where_it_cannot_run(compose):
    with pytest.raises(PlanError, match="compile_scope=blocks compiles each block.*hardware.compile=true"):
        resolve(to_config(compose(["kernel.compile_scope=blocks", "hardware.compile=false"])), fake_device("h100"))
    with pytest.raises(PlanError, match="max-autotune-no-cudagraphs"):
        resolve(
            to_config(compose(["kernel.compile_scope=blocks", "kernel.compile_mode=reduce-overhead"])),
            fake_device("h100"),
        )
    with pytest.raises(ConfigError, match="compile_scope='layers' is not one of model, blocks"):
        to_config(compose(["kernel.compile_scope=layers"]))


def test_tune_help_shows_its_whole_first_paragraph(monkeypatch):
    import speedrun.tune

    first = speedrun.tune.__doc__.split("\n\n")[0]
    monkeypatch.setenv("COLUMNS", "80")  # the forked command's terminal width
    proc = run_python(["-m", "speedrun.tune", "--help"], cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert first in proc.stdout, proc.stdout
    assert first.rstrip().endswith("reads."), first  # a whole sentence, not cut at the first line
    assert "--min-gain" in proc.stdout and "python -m speedrun.tune model=pgolf_baseline" in proc.stdout


def test_the_core_and_the_resolver_agree_on_graphs():
    """core/compile keeps its own copies of what the torch-free resolver reads (speedrun.kernels, config.kernel):
    the eager micro-batches before a CUDA graph's capture, and the compile modes that record graphs."""
    from speedrun import kernels
    from speedrun.config.kernel import GRAPHING_MODES
    from speedrun.core.compile import EVAL_MODE, GRAPH_EAGER_CALLS

    assert GRAPH_EAGER_CALLS == kernels.GRAPH_EAGER_CALLS
    assert sorted(EVAL_MODE) == sorted(GRAPHING_MODES)
