"""A run on a CaseOps dataset built from text (scripts/prepare_data.py --caseops --val-docs): its val_bpb counts the
original text's bytes, so the eval_bytes its result records is the UTF-8 length of the validation documents it
scored, and eval_tokens their targets."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from speedrun.core.data import build_byte_luts, list_shards, load_tokenizer, read_shard
from speedrun.data.bpb import stream_bytes
from speedrun.data.corpus import load_embedded_documents

REPO = Path(__file__).resolve().parents[2]
VAL_DOCS = 3


@pytest.fixture(scope="module")
def caseops_data(tmp_path_factory):
    docs = [d[:3000] for d in load_embedded_documents()[:30]]
    tmp = tmp_path_factory.mktemp("caseops_run")
    source = tmp / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("prepare_data_cli", REPO / "scripts" / "prepare_data.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out = tmp / "ds"
    argv = ["--input", str(source), "--out", str(out), "--caseops", "--val-docs", str(VAL_DOCS), "--vocab", "512"]
    assert cli.main(argv) == 0
    return out, docs[:VAL_DOCS]


def test_a_caseops_runs_eval_bytes_are_the_utf8_bytes_of_its_validation_documents(compose, tmp_path, caseops_data):
    from speedrun.run.runner import RunContext, run_job

    out, val_docs = caseops_data
    args = [
        "debug=smoke",
        f"data.path={out}",
        f"data.tokenizer={out / 'tokenizer.model'}",
        "data.vocab_size=512",
        "budget.tokens_per_step=512",
        "eval.tokens=0",  # the whole split
        "eval.include_tail=true",  # and its tail: every validation target is scored
        "quant=off",
        f"results_db={tmp_path / 'r.sqlite'}",
    ]
    result = run_job(compose(args), RunContext(tmp_path / "run", args, None, tmp_path))
    assert result["status"] == "ok"
    stream = np.concatenate([np.asarray(read_shard(p)) for p in list_shards(out, "val")]).astype(np.int64)
    assert result["eval_tokens"] == result["val_tokens_total"] == stream.size - 1
    assert result["eval_bytes"] == sum(len(d.encode("utf-8")) for d in val_docs)
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (saved["eval_tokens"], saved["eval_bytes"]) == (result["eval_tokens"], result["eval_bytes"])
    # counted from the pieces instead, the case operators' bytes would be in it: more bytes, a flattered val_bpb
    pieces = stream_bytes(torch.from_numpy(stream), build_byte_luts(load_tokenizer(out / "tokenizer.model")))
    assert pieces > result["eval_bytes"]
