"""The numbers a run reaches stay the same, to the last bit: every training step's loss and the final scores
(val_loss and val_bpb; after the quantized round trip; after TTT) of a short CPU run of `experiment=pgolf_record`
(GPTQ int6, LQER, per-group compression, score-first LoRA TTT with a global phase) and of `model=pgolf_baseline`
(int8 RTN), compared exactly with tests/golden/<name>.json.

A moved seed call, a changed build order or cast, a state set elsewhere: any of them changes some float here. A
mismatch names the first number that moved; find the commit that moved it with
`git bisect run pytest -n 0 tests/e2e/test_same_numbers.py`. The golden files are rewritten only on purpose:
`SPEEDRUN_UPDATE_GOLDEN=1 pytest -n 0 tests/e2e/test_same_numbers.py` (on the torch they record; another torch
release computes other floats, so there the test is skipped, naming both versions).

Each run is in this process (speedrun.run.runner.run_job, as tests/training's are): ~30 s of one core apiece, most of
it TTT and the artifact's export. The sizes are the fewest that still go through every stage: 6 steps of one
micro-batch (2 x 128 tokens) so that the layer loop switches on and the Muon momentum warms up, an EMA over half
the run (a decay that is not 0), 1024 eval tokens (2 documents, so that one global TTT phase runs), and no TTT
time limit (a limit would cut TTT where a loaded machine happens to be).

The run's exported file (train_gpt_human.py, the module train_gpt.py compresses: speedrun.driver with the core it
reaches) is then run in this process too, and must print the same scores (to the six decimals the record keeps)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).resolve().parent.parent / "golden"

SMALL = [
    "debug=smoke",
    "hardware.threads=1",
    "budget.max_steps=6",
    "budget.tokens_per_step=256",
    "eval.tokens=1024",
]
"""What both runs share: the smoke run made smaller (one micro-batch a step, a shorter eval)."""

RUNS = {
    "pgolf_record": [
        "experiment=pgolf_record",
        *SMALL,
        "ema.horizon=0.5",
        "ttt.max_seconds=null",
        "ttt.phased.prefix_docs=3",
        "ttt.phased.chunk_tokens=256",
    ],
    "pgolf_baseline": ["model=pgolf_baseline", *SMALL],
}
"""Each golden run's overrides (a `python -m run` command line, less its data and output paths)."""

FINAL_KEYS = (
    "steps",
    "tokens",
    "eval_tokens",
    "val_loss",
    "val_bpb",
    "val_loss_quant",
    "val_bpb_quant",
    "val_loss_ttt",
    "val_bpb_ttt",
    "val_loss_ttt_base",
    "val_bpb_ttt_base",
    "ttt_phases_done",
)
"""The result keys compared after the run (None where the run has no such stage: no TTT for the baseline)."""


def numbers(compose, tmp_path: Path, data_cache: Path, name: str) -> dict:
    """Run RUNS[name] in this process; return its per-step train losses and its final scores."""
    from speedrun.run.runner import RunContext, run_job

    args = [*RUNS[name], f"data.cache_dir={data_cache}", f"results_db={tmp_path / 'r.sqlite'}"]
    run_dir = tmp_path / name
    result = run_job(compose(args), RunContext(run_dir, args, None, tmp_path))
    assert result["status"] == "ok", result.get("error")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [{"step": r["step"], "train_loss": r["train_loss"]} for r in records if "train_loss" in r]
    return {"steps": steps, "final": {key: result.get(key) for key in FINAL_KEYS}, "run_dir": str(run_dir)}


EXPORTED_KEYS = ("val_loss", "val_bpb", "val_loss_quant", "val_bpb_quant", "val_bpb_ttt", "val_bpb_ttt_base")
"""The scores the exported file prints that the run recorded."""


def exported_scores(run_dir: Path, where: Path, capsys) -> dict:
    """Run <run_dir>/train_gpt_human.py in this process, from ``where`` (it writes its model there); the scores it
    prints in its result lines."""
    import runpy

    (where / "train_gpt.py").write_bytes((run_dir / "train_gpt.py").read_bytes())  # the file it counts
    human = where / "train_gpt_human.py"
    human.write_text((run_dir / "train_gpt_human.py").read_text())
    capsys.readouterr()
    cwd = Path.cwd()
    os.chdir(where)
    try:
        runpy.run_path(str(human), run_name="__main__")
    finally:
        os.chdir(cwd)
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines() if ": " in line)
    return {key: float(lines[key]) if lines.get(key) not in (None, "None") else None for key in EXPORTED_KEYS}


def first_difference(got: dict, want: dict) -> str | None:
    """The first number that differs, as a line naming where (step N's train_loss, or a final key), else None."""
    for i, (g, w) in enumerate(zip(got["steps"], want["steps"])):
        if g != w:
            return f"step {w['step']}: train_loss {g['train_loss']!r}, golden {w['train_loss']!r} (record {i})"
    if len(got["steps"]) != len(want["steps"]):
        return f"{len(got['steps'])} step records, golden {len(want['steps'])}"
    for key in FINAL_KEYS:
        if got["final"].get(key) != want["final"].get(key):
            return f"{key} {got['final'].get(key)!r}, golden {want['final'].get(key)!r}"
    return None


@pytest.mark.parametrize("name", sorted(RUNS))
def test_same_numbers(compose, tmp_path, data_cache, name, capsys):
    path = GOLDEN / f"{name}.json"
    update = os.environ.get("SPEEDRUN_UPDATE_GOLDEN") == "1"
    golden = None if update else json.loads(path.read_text())
    if golden is not None and golden["torch"] != torch.__version__:
        pytest.skip(f"{path.name} holds torch {golden['torch']}'s numbers; this is torch {torch.__version__}")
    got = numbers(compose, tmp_path, data_cache, name)
    run_dir = Path(got.pop("run_dir"))
    assert len(got["steps"]) == 6 and got["final"]["val_bpb_quant"] is not None, got
    if name == "pgolf_record":  # the stages the record's golden exists for: GPTQ's round trip and TTT
        assert got["final"]["val_bpb_ttt"] is not None and got["final"]["ttt_phases_done"] >= 1, got
    if update:
        body = {"command": "python -m run " + " ".join(RUNS[name]), "torch": torch.__version__, **got}
        tmp = path.with_suffix(".json.tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        tmp.replace(path)
        return
    assert golden["command"] == "python -m run " + " ".join(RUNS[name]), (
        f"RUNS[{name!r}] changed since {path.name} was written: regenerate it with SPEEDRUN_UPDATE_GOLDEN=1"
    )
    problem = first_difference(got, golden)
    assert problem is None, f"{name}: {problem}; the numbers moved (git bisect run pytest -n 0 {__file__})"
    (tmp_path / "exported").mkdir()
    exported = exported_scores(run_dir, tmp_path / "exported", capsys)
    # the record keeps six decimals of each score; the file prints them whole
    rounded = {key: None if v is None else round(v, 6) for key, v in exported.items()}
    assert rounded == {key: got["final"].get(key) for key in EXPORTED_KEYS}, "the exported file scored otherwise"
