"""scripts/ttt_table.py: the records' TTT under several settings on a finished run's exported model, one table."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import run_python

REPO = Path(__file__).resolve().parents[2]


def ttt_table_module():
    """scripts/ttt_table.py imported into this process (scripts/ is on sys.path only while it imports)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import ttt_table
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return ttt_table


def test_record_ttt_is_the_ttt_record_group_as_dotted_keys():
    keys = dict(item.split("=", 1) for item in ttt_table_module().record_ttt())
    assert keys["ttt.name"] == "record" and keys["ttt.rank"] == "96" and keys["ttt.phased.phases"] == "3"
    assert keys["ttt.warm_start_a"] == "True" and keys["ttt.phased.prefix_docs"] == "2000"


def test_ttt_run_keeps_the_runs_own_ttt_and_record_lays_the_records_over_it():
    """--ttt run (e.g. pgolf_pr2014's rank 80 and local lr x0.75, measured on its own model) adds no ttt.* key of the
    records'; the default lays every one of them under the command line's keys, which still win."""
    base_overrides = ttt_table_module().base_overrides
    own = base_overrides("run", ["ttt.local_lr_mult=1"])
    assert own == ["dist.nproc=1", "dist.nodes=1", "ttt.compile=false", "ttt.local_lr_mult=1"]
    record = base_overrides("record", ["ttt.rank=32"])
    assert "ttt.rank=96" in record and "ttt.name=record" in record and record[-1] == "ttt.rank=32"


# TTT small enough for a CPU (128-token chunks: half the steps of 64), on 12,288 tokens: 4 documents
SMALL = ["ttt.rank=4", "ttt.alpha=6", "ttt.batch_size=2", "ttt.chunk_size=128", "eval.tokens=12288"]
SMALL += ["ttt.max_seconds=null"]
COLD = "ttt.phased.phases=0 ttt.warm_start_a=false"
"""Fresh adapters per batch and no global phase: what two ranks must score as one process does."""


@pytest.fixture(scope="module")
def one_process_table(default_smoke_run, tmp_path_factory):
    """scripts/ttt_table.py on one process, on a copy of the shared smoke run (int8 artifact), with two settings:
    cold (COLD) and one (the records' TTT with one global phase). The script run once for the two tests below that
    read it: each setting's row (test_ttt_table_runs_each_setting_on_the_runs_artifact) and the cold row as the one
    process that two ranks must score as (test_ttt_table_on_two_ranks_scores_what_one_process_scores)."""
    assert default_smoke_run.proc.returncode == 0, default_smoke_run.proc.stderr[-2000:]
    run = tmp_path_factory.mktemp("ttt_table") / "run"
    shutil.copytree(default_smoke_run.run_dir, run)
    phase = ["ttt.phased.prefix_docs=2", "ttt.phased.chunk_tokens=512", "ttt.phased.batch_seqs=8"]
    # forked from this process (support.cli.run_python): torch and speedrun are imported already
    proc = run_python(
        [str(REPO / "scripts/ttt_table.py"), str(run), *SMALL, *phase,
         "--setting", f"cold={COLD}", "--setting", "one=ttt.phased.phases=1"],
        cwd=REPO, timeout=600,
    )  # fmt: skip
    return proc, run


def test_ttt_table_runs_each_setting_on_the_runs_artifact(one_process_table):
    """Two settings (cold: no global phase, fresh adapters per batch; one: the records' TTT with one phase); each
    row is a real TTT phase (tokens scored, phases as asked) of the artifact's dequantized weights, and the table
    says so."""
    proc, run = one_process_table
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((run / "ttt_table" / "rows.json").read_text())
    assert [r["setting"] for r in rows] == ["cold", "one"]
    assert [r["ttt_phases_done"] for r in rows] == [0, 1]
    assert all(r["ttt_tokens_scored"] > 0 and r["val_bpb_ttt"] > 0 for r in rows)
    # both rows adapted the same weights over the same tokens: the unadapted score of the chunks is one number
    assert rows[0]["val_bpb_ttt_base"] == rows[1]["val_bpb_ttt_base"]
    table = (run / "ttt_table" / "table.md").read_text()
    assert "TTT of the dequantized model.int8." in table and "| cold |" in table and "| one |" in table


@pytest.mark.parametrize("rows", ["2", "-1", "a,b"])
def test_ttt_table_refuses_rows_outside_its_settings_before_loading_anything(tmp_path, rows, capsys):
    """--rows picks settings by index; an index it does not have is a usage error naming the range, not an
    IndexError (or, for -1, a silent pick from the end). The script's main() in this process: its argparse exit
    status and message are the command line's (the other tests here run the script itself), without the ~4 s of
    a fresh interpreter importing torch for each case. The run dir does not exist: loading it would fail otherwise."""
    argv = [str(tmp_path / "no_run"), "--setting", "a=ttt.rank=4", "--setting", "b=ttt.rank=8", "--rows", rows]
    with pytest.raises(SystemExit) as exited:
        ttt_table_module().main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2, err[-2000:]
    assert f"--rows {rows}:" in err


def test_ttt_table_takes_dotted_keys_after_an_option(tmp_path, capsys):
    """`<run dir> --ttt run ttt.compile=true --setting ...`: the dotted keys after an option are still the command
    line's overrides (argparse's plain parse refused them as unrecognized arguments). Parsed in this process, up to
    the --rows refusal, which comes before the (missing) run dir is read."""
    argv = [str(tmp_path / "no_run"), "--ttt", "run", "ttt.compile=true", "--setting", "a=ttt.rank=4", "--rows", "1"]
    with pytest.raises(SystemExit) as exited:
        ttt_table_module().main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--rows 1: rows are 0 to 0 here" in err, err[-2000:]
    assert "unrecognized arguments" not in err


def test_ttt_table_reads_a_multi_gpu_run_on_one_process_and_profiles_it(default_smoke_run, tmp_path):
    """A run trained on several ranks (here 2 nodes x 2, which a plain process cannot resolve) is read back with
    dist.* for the one process that adapts it; --profile writes where the row's TTT time went."""
    assert default_smoke_run.proc.returncode == 0, default_smoke_run.proc.stderr[-2000:]
    run = tmp_path / "run"
    shutil.copytree(default_smoke_run.run_dir, run)
    config = run / ".hydra" / "config.yaml"
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(config)
    cfg.dist.nproc, cfg.dist.nodes = 2, 2
    OmegaConf.save(cfg, config)
    # few profiler events: on CPU, building the profiler's event list costs ~55 us an event and TTT at chunk_size 64
    # records ~40 a token (12,288 tokens took 40 s); 2 documents in 128-token chunks are still a real TTT phase
    small = ["ttt.rank=4", "ttt.alpha=6", "ttt.batch_size=2", "ttt.chunk_size=128", "ttt.phased.phases=0"]
    small += ["eval.tokens=2048", "ttt.max_seconds=null"]
    proc = run_python(
        [str(REPO / "scripts/ttt_table.py"), str(run), *small, "--profile", "--setting", "p=ttt.rank=4"],
        cwd=REPO, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads((run / "ttt_table" / "rows.json").read_text())
    assert row["ttt_tokens_scored"] > 0
    profile = (run / "ttt_table" / "0" / "profile.txt").read_text()
    assert profile.startswith("TTT ") and f"tokens scored {row['ttt_tokens_scored']}" in profile
    assert "Self CPU" in profile  # the operator table


def test_ttt_table_on_two_ranks_scores_what_one_process_scores(one_process_table, tmp_path):
    """Under torchrun (2 gloo ranks) each setting's TTT deals the documents over the ranks and all-reduces the sums:
    with fresh adapters per batch and no global phase (COLD), the same val_bpb_ttt as one process on the same model
    (the cold row of one_process_table: the same settings on a copy of the same run)."""
    proc, run = one_process_table
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((run / "ttt_table" / "rows.json").read_text())[0]
    assert one["setting"] == "cold"
    # 4 documents, 2 a rank, in 128-token chunks (64 took twice the steps and checked nothing more)
    table = [str(REPO / "scripts/ttt_table.py"), str(run), *SMALL, "--setting", f"cold={COLD}"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    out = tmp_path / "two"
    proc = subprocess.run([*launch, *table, "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (two,) = json.loads((out / "rows.json").read_text())
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert two["ttt_tokens_scored"] == one["ttt_tokens_scored"] > 0 and two["ttt_complete"]
    assert two["val_bpb_ttt"] == pytest.approx(one["val_bpb_ttt"], abs=1e-6)
    assert "2 ranks of" in (out / "table.md").read_text()
