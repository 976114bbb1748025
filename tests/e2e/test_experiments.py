"""Every named recipe in conf/experiment/ runs end to end through the real CLI with debug=smoke, on CPU.

test_config.py proves that each experiment composes and resolves on its target GPU; this proves that its whole
pipeline (data, warm-up, training, eval, quantized export, TTT) runs: a recipe whose quantizer, schedule or
TTT settings break at run time fails here, in CI, without a GPU. debug=smoke keeps the recipe's group choices
and shrinks the model, the budget and the eval (conf/debug/smoke.yaml), so each run takes seconds.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from speedrun.config import CONF_DIR
from support.cli import run_cli

pytestmark = pytest.mark.slow

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))

# Experiments that stay GPU-only even as a CPU smoke run (a group choice that CPU cannot run), with the words
# the refusal must contain. Every other experiment must finish with status ok: a new experiment is expected to
# run on CPU under debug=smoke unless it is listed here with its reason.
NEEDS_GPU = {
    # fp16 autocast + GradScaler: CUDA only; the message must name what works on CPU.
    "t4_colab": ("precision=fp16 needs a CUDA GPU", "on CPU use precision=fp32 or bf16"),
}

# What conf/debug/smoke.yaml sets and the runs must show (a smoke config that stopped applying is a failure).
SMOKE_MAX_STEPS = 4
SMOKE_TOKENS_PER_STEP = 6144
SMOKE_SHAPE = {"n_layer": 2, "d_model": 64}
"""Recipes with depth levers (model.loop, model.parallel_start_layer) get the fewest layers that keep them."""


def smoke_run(tmp_path: Path, data_cache: Path, *args: str):
    """`python -m run <args> debug=smoke` with its run dir and results database under tmp_path."""
    run_dir = tmp_path / "run"
    proc = run_cli(
        [
            *args,
            "debug=smoke",
            f"data.cache_dir={data_cache}",
            f"hydra.run.dir={run_dir}",
            f"results_db={tmp_path / 'r.sqlite'}",
        ],
        cwd=tmp_path,
        timeout=600,  # a hung run fails rather than hangs the suite; pgolf_pr2014's took over 180 s at load 9
        fork=True,  # one run, no launcher: forked, it finds torch and speedrun imported (~9 s of CPU a run)
    )
    return proc, run_dir


def db_rows(tmp_path: Path) -> list[dict]:
    con = sqlite3.connect(tmp_path / "r.sqlite")
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM runs")]
    finally:
        con.close()


def assert_smoke_run_ok(proc, run_dir: Path, tmp_path: Path, tokens_per_step: int = SMOKE_TOKENS_PER_STEP) -> dict:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["error"] is None, result
    # debug=smoke applied: a CPU run of exactly the smoke step budget (it stops on steps, long before its
    # 10 s time budget), with the smoke batch and model shape.
    assert result["hardware"] == "cpu" and result["device_name"] is not None
    assert result["steps"] == SMOKE_MAX_STEPS, result
    assert result["tokens"] == SMOKE_MAX_STEPS * tokens_per_step
    plan = json.loads((run_dir / "plan.json").read_text())
    from speedrun.config import smoke_layers

    loop, parallel = plan["model"]["loop"], plan["model"]["parallel_start_layer"]
    shape = {**SMOKE_SHAPE, "n_layer": smoke_layers(loop["num"], loop["start"], loop["end"], parallel)}
    assert {k: plan["model"][k] for k in SMOKE_SHAPE} == shape and plan["compile"] is False
    # every stage produced its number
    assert math.isfinite(result["val_bpb"]) and 0 < result["val_bpb"] < 20
    assert math.isfinite(result["val_bpb_quant"]) and result["artifact_bytes"] > 0
    (row,) = db_rows(tmp_path)
    assert row["status"] == "ok" and row["val_bpb"] == result["val_bpb"]
    return result


def test_every_listed_gpu_experiment_exists():
    # A renamed or deleted experiment must not leave a stale entry that silently tests nothing.
    assert set(NEEDS_GPU) <= set(EXPERIMENTS), set(NEEDS_GPU) - set(EXPERIMENTS)


SMOKE_EXTRA = {
    # bf16 on a CPU is ~5x slower than fp32 through the same stages (pgolf_record's bf16 smoke run: ~45 s a step):
    # autoresearch_h100's run, the smallest, keeps bf16's plumbing tested; the others run it in fp32.
    "mng_124m": ["precision=fp32", "budget.tokens_per_step=512"],
    "pgolf_record": ["precision=fp32", "budget.tokens_per_step=512"],
    "pgolf_progressive": ["precision=fp32"],
    # and no warm-up step: its 6 (3 context lengths x 2 layer-loop states) were 60% of its run's steps;
    # pgolf_progressive's warm-up goes through the lengths, pgolf_record's through the loop states
    "pgolf_pr2014": ["precision=fp32", "budget.warmup_steps=0"],
    # 2 micro-batches of 2 x 128 a step rather than smoke's 24 (6144 tokens): gradient accumulation still runs;
    # the progressive recipes keep 6144, one micro-batch of 2 x their longest length (3072)
    "autoresearch_h100": ["budget.tokens_per_step=512"],
}
"""Overrides a recipe's smoke run adds (composed the same way below), only to keep the suite short."""


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_runs_as_a_cpu_smoke_run(tmp_path, data_cache, experiment, compose):
    extra = SMOKE_EXTRA.get(experiment, [])
    proc, run_dir = smoke_run(tmp_path, data_cache, f"experiment={experiment}", *extra)
    out = proc.stdout + proc.stderr
    if experiment in NEEDS_GPU:
        # Composed and reached the resolver (a PlanError, not a Hydra error), refused there before any data was
        # built or any step taken, with the reason and the alternatives on the console and in the record.
        assert proc.returncode != 0, out[-4000:]
        for words in NEEDS_GPU[experiment]:
            assert words in out, out[-4000:]
        result = json.loads((run_dir / "result.json").read_text())
        assert result["status"] == "failed" and result["error"].startswith("PlanError: "), result
        assert all(words in result["error"] for words in NEEDS_GPU[experiment]), result["error"]
        assert result["steps"] is None and not (run_dir / "plan.json").exists()
        (row,) = db_rows(tmp_path)
        assert row["status"] == "failed" and row["name"] == experiment
        return
    # Still this experiment, not the default job: its name, and the group choices debug=smoke leaves alone.
    cfg = compose([f"experiment={experiment}", "debug=smoke", *extra])
    result = assert_smoke_run_ok(proc, run_dir, tmp_path, cfg.budget.tokens_per_step)
    assert result["name"] == experiment
    assert result["model"] == (cfg.model.name if cfg.model.name != "auto" else "tiny")
    if cfg.precision.name != "auto":
        assert result["precision"] == cfg.precision.name
    if cfg.ttt.name != "off":
        assert result["val_bpb_ttt"] is not None and math.isfinite(result["val_bpb_ttt"]), result
    if cfg.schedule.name == "progressive":
        # smoke measures stages in steps, so the few steps go through every context length
        assert result["seq_len"] == json.loads((run_dir / "plan.json").read_text())["stages"][-1]["seq_len"]
        n_stages = len(json.loads((run_dir / "plan.json").read_text())["stages"])
        assert out.count("context stage ") == n_stages, out[-4000:]


def test_smoke_run_of_the_default_job(default_smoke_run):
    # the pytest session's one default smoke run (conftest.default_smoke_run: smoke_run()'s command with no
    # experiment, run once and shared with tests/e2e/test_dist_cli.py), in a dir of its own with its own database
    run = default_smoke_run
    result = assert_smoke_run_ok(run.proc, run.run_dir, run.cwd)
    # model=auto on CPU picks the tiny preset; the smoke shape overrides its fields (plan._resolve_model)
    assert result["model"] == "tiny" and result["name"] == "default" and result["precision"] == "fp32"
