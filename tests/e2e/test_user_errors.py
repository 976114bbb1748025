"""User errors through the real CLI: one message naming the problem and the fix, no traceback on the console (it
goes to the run dir's error.txt), a non-zero exit status and a failed row. Hydra's own compose errors (an unknown
or wrong-typed option) end before speedrun runs: Hydra prints its message, and no row can exist yet."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from support.cli import run_cli, run_python

pytestmark = pytest.mark.slow

# debug=smoke with 2 micro-batches a step (512 tokens, not its 6144), no warm-up step and a short eval: no case here
# checks what training reaches
SMOKE = ["debug=smoke", "budget.warmup_steps=0", "budget.tokens_per_step=512", "eval.tokens=1024"]


def rows(cwd: Path):
    db = cwd / "outputs" / "results.sqlite"
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM runs")]


def console(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def assert_user_error(proc, cwd: Path, needle: str, status: str = "failed") -> dict:
    out = console(proc)
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "Error executing job" not in out, out[-3000:]
    assert needle in out, out[-3000:]
    (row,) = rows(cwd)
    assert row["status"] == status and needle in row["error"]
    (err,) = (cwd / "outputs" / "runs").glob("*/*/error.txt")
    assert "Traceback" in err.read_text()  # the traceback is kept, in the run dir
    return row


@pytest.mark.parametrize(
    "override,needle",
    [
        ("attn.foo=1", "unknown key 'attn.foo'"),  # unknown key (speedrun.run.cli_step.unknown_override)
        ("seed=abc", "could not be converted to Integer"),  # wrong type
        ("attn=nope", "attn=nope is no option of attn"),  # unknown choice
    ],
)
def test_hydra_compose_errors_print_hydras_message_and_exit_nonzero(tmp_path, override, needle):
    proc = run_cli([*SMOKE, override], cwd=tmp_path, fork=True)
    out = console(proc)
    assert proc.returncode != 0 and needle in out and "Traceback" not in out, out[-3000:]
    assert rows(tmp_path) == []  # composition failed before speedrun ran: there is no run to record


@pytest.mark.parametrize(
    "overrides,needles",
    [
        (["precision=fp16"], ["precision=fp16 needs a CUDA GPU"]),  # impossible combination (resolver)
        (["eval.tokens=-5"], ["eval.tokens=-5 must be >= 0"]),  # a value the schema refuses
        # a data path that does not exist: the run fails fast, before any work, naming the path (on the console
        # and in its row); this case is also tests/e2e/test_cli.py's bad data path, which it ran as a run of its own
        (
            ["data=fineweb_sp1024", "data.path=nowhere/fineweb10B_sp1024"],
            ["dataset directory not found", "nowhere/fineweb10B_sp1024"],
        ),
    ],
)
def test_config_and_plan_errors_are_one_message_and_a_failed_row(tmp_path, overrides, needles):
    proc = run_cli([*SMOKE, "hardware=cpu", *overrides], cwd=tmp_path, fork=True)
    for needle in needles:  # each on the console and in the row's error
        assert_user_error(proc, tmp_path, needle)


@pytest.fixture
def dataset(tmp_path, data_cache):
    """A copy of the embedded dataset (shards + tokenizer) to break."""
    from speedrun.data import ensure_embedded_dataset

    paths = ensure_embedded_dataset(Path(data_cache), vocab_size=1024)
    copy = tmp_path / "data"
    shutil.copytree(paths.directory, copy)
    return copy


def with_data(path: Path, tokenizer: Path | None = None) -> list[str]:
    return [*SMOKE, f"data.path={path}", f"data.tokenizer={tokenizer or path / 'tokenizer.model'}"]


def put_id(shard: Path, at: int, token: int) -> None:
    from speedrun.data import read_shard, write_shard

    tokens = np.array(read_shard(shard)).astype(np.int64)
    tokens[at] = token
    write_shard(shard, tokens)


def test_missing_tokenizer(tmp_path, dataset):
    proc = run_cli(with_data(dataset, dataset / "missing.model"), cwd=tmp_path, fork=True)
    assert_user_error(proc, tmp_path, "tokenizer not found")


def test_corrupt_shard(tmp_path, dataset):
    shard = dataset / "fineweb_val_000000.bin"
    raw = bytearray(shard.read_bytes())
    raw[:4] = (12345).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))
    proc = run_cli(with_data(dataset), cwd=tmp_path, fork=True)
    assert_user_error(proc, tmp_path, "bad magic number")


def test_ids_past_the_vocabulary_in_a_training_shard_fail_while_training(tmp_path, dataset):
    """Token ids are checked as batches are read: the error comes from inside the training loop."""
    put_id(dataset / "fineweb_train_000000.bin", 300, 2000)  # in the first step's second micro-batch
    proc = run_cli(with_data(dataset), cwd=tmp_path, fork=True)
    row = assert_user_error(proc, tmp_path, "token id 2000 >= vocab_size 1024")
    assert row["phase"] == "train" and "ShardError" in row["error"]


def test_ids_past_the_vocabulary_in_the_val_shard(tmp_path, dataset):
    put_id(dataset / "fineweb_val_000000.bin", 100, 1500)
    proc = run_cli(with_data(dataset), cwd=tmp_path, fork=True)
    assert_user_error(proc, tmp_path, "token id 1500 >= vocab_size 1024")


def test_out_of_memory_through_the_cli_is_an_oom_row_without_a_traceback(tmp_path, data_cache):
    """A CUDA OOM in training (raised by a stand-in for the training loop, as CUDA would) -> status oom."""
    code = (
        "import runpy, sys, torch, speedrun.core.train as t\n"
        "def boom(*a, **k):\n"
        "    raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 3.00 GiB')\n"
        "t.train = boom\n"
        "sys.argv = ['run'] + sys.argv[1:]\n"
        "runpy.run_module('run', run_name='__main__', alter_sys=True)\n"
    )
    (tmp_path / "oom.py").write_text(code)  # run forked from this process (run_python): the stand-in stays there
    proc = run_python([str(tmp_path / "oom.py"), *SMOKE, f"data.cache_dir={data_cache}"], cwd=tmp_path, timeout=300)
    row = assert_user_error(proc, tmp_path, "out of memory in train; tried to allocate 3.00 GiB", status="oom")
    assert row["phase"] == "train" and "fix: lower hardware.micro_batch" in row["error"]
