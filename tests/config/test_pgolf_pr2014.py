"""experiment=pgolf_pr2014 against parameter-golf's PR #2014, variable for variable: every environment variable of its
reproduction command, with the config key that carries it and the value that key must hold (or why no key does);
its smoke variant resolves on CPU on the embedded corpus (tests/e2e/test_experiments.py runs it end to end)."""

from __future__ import annotations

import pytest

from speedrun.config import to_config
from speedrun.config.specs import TTT_PRESETS
from speedrun.plan import resolve
from speedrun.run import run_steps
from support.devices import fake_device

NOT_CARRIED = object()

SEED_ENV = {
    # data: parameter-golf's CaseOps FineWeb export (data=fineweb_sp8192_caseops)
    "CASEOPS_ENABLED": ("1", "data.name", "fineweb_sp8192_caseops"),
    "DATA_PATH": (
        "fineweb10B_sp8192_lossless_caps_caseops_v1_reserved",
        "data.path",
        "data/datasets/fineweb10B_sp8192_caseops/datasets/datasets/fineweb10B_sp8192_lossless_caps_caseops_v1_reserved",
    ),
    "TOKENIZER_PATH": (
        "fineweb_8192_bpe_lossless_caps_caseops_v1_reserved.model",
        "data.tokenizer",
        "data/datasets/fineweb10B_sp8192_caseops/datasets/tokenizers/fineweb_8192_bpe_lossless_caps_caseops_v1_reserved.model",
    ),
    "VOCAB_SIZE": ("8192", "data.vocab_size", 8192),
    # budget and schedule
    "ITERATIONS": (
        "20000",
        NOT_CARRIED,
        "a step cap the 600 s end long before; as budget.max_steps it would be "
        "the run's length, which the fractions of the run are resolved from",
    ),  # fmt: skip
    "MAX_WALLCLOCK_SECONDS": ("600", "budget.train_seconds", 600),
    "TRAIN_SEQ_SCHEDULE": ("1024@0.100,2048@0.700,3072@1.000", "schedule.seq_len", "1024@0.1,2048@0.7,3072@1.0"),
    "TRAIN_SEQ_SCHEDULE_MODE": ("wallclock", "schedule.progress", "time"),
    "TRAIN_SEQ_LEN": ("3072", "plan:model.seq_len", 3072),
    "ROPE_TRAIN_SEQ_LEN": ("3072", "plan:model.seq_len", 3072),
    "SEQ_CHANGE_WARMUP_STEPS": ("32", "schedule.rewarmup_steps", 32),
    "WARMDOWN_FRAC": ("0.85", "schedule.warmdown_frac", 0.85),
    "MIN_LR": ("0.1", "schedule.min_lr", 0.1),
    # optimizer
    "MATRIX_LR": ("0.026", "optim.matrix_lr", 0.026),
    "BETA2": ("0.99", "optim.beta2", 0.99),
    "GRAD_CLIP_NORM": ("0.3", "optim.grad_clip", 0.3),
    # model
    "QK_GAIN_INIT": ("5.25", "model.qk_gain_init", 5.25),
    "SMEAR_GATE_ENABLED": ("1", "model.smear_gate.window", 12),
    "GATE_WINDOW": ("12", "model.attn_out_gate.window", 12),
    "SPARSE_ATTN_GATE_ENABLED": ("1", "model.attn_out_gate.window", 12),
    "SPARSE_ATTN_GATE_SCALE": ("0.5", "model.attn_out_gate.scale", 0.5),
    "FUSED_CE_ENABLED": ("1", NOT_CARRIED, "a fused kernel of the same cross-entropy (the math is unchanged)"),
    # evaluation
    "EVAL_SEQ_LEN": ("3072", "plan:model.seq_len", 3072),
    "EVAL_STRIDE": ("1536", "eval.stride", 1536),
    "EVAL_INCLUDE_TAIL": ("1", "eval.include_tail", True),
    "VAL_LOSS_EVERY": ("0", "eval.every_steps", None),
    # export
    "EMBED_BITS": ("7", "quant.embed_bits", 7),
    "EMBED_CLIP_SIGMAS": ("14.0", "quant.sigmas.embed", 14.0),
    "MATRIX_CLIP_SIGMAS": ("12.85", "quant.sigmas.matrix", 12.85),
    "ATTN_CLIP_SIGMAS": ("13.0", "quant.sigmas.attn", 13.0),
    "MLP_CLIP_SIGMAS": ("11.5", "quant.sigmas.mlp", 11.5),
    "GATED_ATTN_QUANT_GATE": ("1", "quant.gate_bits", 8),
    "LQER_ENABLED": ("1", "quant.lqer.rank", 4),
    "LQER_RANK": ("4", "quant.lqer.rank", 4),
    "LQER_TOP_K": ("3", "quant.lqer.top_k", 3),
    "LQER_FACTOR_BITS": ("4", "quant.lqer.factor_bits", 4),
    "LQER_ASYM_ENABLED": ("1", "quant.lqer.asym_group", 64),
    "LQER_ASYM_GROUP": ("64", "quant.lqer.asym_group", 64),
    "AWQ_LITE_ENABLED": ("1", "quant.awq.top_k", 1),
    "AWQ_LITE_BITS": ("8", "quant.awq.bits", 8),
    "AWQ_LITE_GROUP_TOP_K": ("1", "quant.awq.top_k", 1),
    "AWQ_LITE_GROUP_SIZE": ("64", "quant.awq.group_size", 64),
    "ASYM_LOGIT_RESCALE": ("1", "quant.logit_rescale", True),
    "GPTQ_RESERVE_SECONDS": ("4.0", "quant.reserve_seconds", 4.0),
    "GPTQ_CALIBRATION_BATCHES": ("16", "quant.calib_batches", 16),
    "COMPRESSOR": ("pergroup", "quant.compressor", "pergroup"),
    # test-time training
    "TTT_ENABLED": ("1", "ttt.name", "record"),
    "TTT_EVAL_SEQ_LEN": ("3072", "plan:model.seq_len", 3072),
    "TTT_BATCH_SIZE": ("24", "ttt.batch_size", 24),
    "TTT_CHUNK_SIZE": ("48", "ttt.chunk_size", 48),
    "TTT_SHORT_SCORE_FIRST_ENABLED": ("1", "ttt.short_chunks", "256:8,2000:24"),
    "TTT_SHORT_DOC_LEN": ("2000", "ttt.short_chunks", "256:8,2000:24"),
    "TTT_SHORT_CHUNK_SIZE": ("24", "ttt.short_chunks", "256:8,2000:24"),
    "TTT_SHORT_SCORE_FIRST_STEPS": ("256:8,2000:24", "ttt.short_chunks", "256:8,2000:24"),
    "TTT_LORA_RANK": ("80", "ttt.rank", 80),
    "TTT_LORA_LR": ("0.0001", "ttt.lr", 1e-4),
    "TTT_LOCAL_LR_MULT": ("0.75", "ttt.local_lr_mult", 0.75),
    "TTT_MASK": ("no_qv", "ttt.targets", "k,attn_bypass,mlp_bypass,head"),
    "TTT_Q_LORA": ("0", "ttt.targets", "k,attn_bypass,mlp_bypass,head"),
    "TTT_V_LORA": ("0", "ttt.targets", "k,attn_bypass,mlp_bypass,head"),
    "TTT_WEIGHT_DECAY": ("0.5", "ttt.weight_decay", 0.5),
    "TTT_BETA2": ("0.99", "ttt.beta2", 0.99),
    "PHASED_TTT_PREFIX_DOCS": ("2500", "ttt.phased.prefix_docs", 2500),
    "PHASED_TTT_NUM_PHASES": ("1", "ttt.phased.phases", 1),
    # the machine
    "NCCL_NET": ("Socket", NOT_CARRIED, "the host's NCCL transport, not a setting of the run"),
}
"""PR #2014's reproduction command (its README), variable -> (its value, the key that carries it, the value the key
holds); "plan:" keys are read from the resolved plan; NOT_CARRIED with the reason."""


def get(tree, dotted: str):
    for part in dotted.split("."):
        tree = getattr(tree, part)
    return tree


@pytest.fixture
def composed(compose):
    return compose(["experiment=pgolf_pr2014"])  # composed once per process, then copied (tests/conftest.py)


@pytest.mark.parametrize("var", sorted(SEED_ENV))
def test_each_seed_variable_is_carried(var, composed):
    _, key, expect = SEED_ENV[var]
    if key is NOT_CARRIED:
        assert isinstance(expect, str) and expect  # why not: said, not skipped
        return
    if key.startswith("plan:"):
        return  # test_the_plan_trains_evaluates_and_adapts_at_3072
    got = get(composed, key)
    got = str(got) if key in ("quant.compressor", "ttt.name", "schedule.progress") else got
    assert got == expect, f"{var}: {key}={got!r}, the seed's {SEED_ENV[var][0]} needs {expect!r}"


def test_the_plan_trains_evaluates_and_adapts_at_3072(compose):
    cfg = to_config(compose(["experiment=pgolf_pr2014", "data=embedded", "hardware=h100"]))
    plan = resolve(cfg, fake_device("h100"))
    assert plan.model.seq_len == 3072 and [s.seq_len for s in plan.stages] == [1024, 2048, 3072]
    assert plan.model.logit_rescale and plan.eval.include_tail
    assert plan.tokens_per_step == 786_432  # TRAIN_BATCH_TOKENS, the record's default
    assert run_steps.needs_projection(plan)  # 600 s: the EMA horizon and the warm-up follow the projected steps


def test_no_qv_is_the_records_adapters_without_q_and_v():
    no_qv = tuple(t for t in TTT_PRESETS["record"] if t not in ("q", "v"))
    assert SEED_ENV["TTT_MASK"][2] == ",".join(no_qv)


def test_the_smoke_run_resolves_on_cpu_on_the_embedded_corpus(compose):
    cfg = compose(["experiment=pgolf_pr2014", "debug=smoke"])
    assert cfg.data.name == "embedded" and cfg.name == "pgolf_pr2014"
    plan = resolve(to_config(cfg), fake_device("cpu"))
    assert plan.device == "cpu" and plan.quant.awq.top_k == 1 and plan.ttt.local_lr_mult == 0.75
    assert compose(["experiment=pgolf_pr2014", "debug=smoke", "data=python_sp1024"]).data.name == "python_sp1024"
