"""GPT-2 (tiktoken) data: byte accounting proved exact against decoding, and the shards prepare_data writes.

The real GPT-2 vocabulary cannot be downloaded offline, so the tests build a small byte-level BPE with GPT-2's
split pattern (tests/support/bpe.py): all 256 single bytes plus a few merges, and <|endoftext|> after them. The
byte accounting does not depend on which merges exist, only on each token decoding to its own byte string. A whole
run on such shards: tests/e2e/test_cli.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is not installed (pip install 'speedrun[gpt2]')")

from speedrun.core.data import (  # noqa: E402
    ENDOFTEXT,
    GPT2,
    boundary_id,
    build_tiktoken_luts,
    is_tiktoken,
    list_shards,
    load_encoding,
    read_shard,
    token_bytes,
)
from speedrun.data.bpb import stream_bytes  # noqa: E402
from speedrun.data.existing import open_dataset  # noqa: E402
from speedrun.data.prepare import prepare_tiktoken_dataset, read_dataset_info  # noqa: E402
from support.bpe import DOCS, MERGES, small_ranks, write_tiktoken_file  # noqa: E402
from support.cli import run_python  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def enc():
    from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenizer regex

    ranks = small_ranks()
    return tiktoken.Encoding(
        name="gpt2_small_test", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: len(ranks)}
    )


def test_kind_follows_from_the_tokenizer_value():
    assert is_tiktoken(GPT2) and is_tiktoken("/data/r50k_base.tiktoken")
    assert not is_tiktoken("data/tokenizers/fineweb_1024_bpe.model") and not is_tiktoken(None)


def test_luts_count_each_tokens_bytes_and_zero_for_the_separator(enc):
    luts = build_tiktoken_luts(enc, vocab_size=enc.n_vocab + 5)
    eot = boundary_id(enc)
    assert eot == 256 + len(MERGES)
    assert luts.vocab_size == enc.n_vocab + 5
    assert int(luts.base_bytes[eot]) == 0 and bool(luts.is_boundary[eot])
    assert all(int(luts.base_bytes[b]) == 1 for b in range(256))
    assert int(luts.base_bytes[enc.encode_single_token(b" the")]) == 4
    assert int(luts.base_bytes[enc.encode_single_token(b"\xe2\x82\xac")]) == 3
    assert not luts.has_leading_space.any()  # no leading-space rule for a byte-level BPE
    assert luts.is_boundary[enc.n_vocab :].all() and (luts.base_bytes[enc.n_vocab :] == 0).all()


def test_counted_bytes_equal_decoded_bytes_per_document(enc):
    """Over a stream laid out as modded-nanogpt's ([EOT] + ids per document), every document's counted bytes
    equal the UTF-8 length of its decoded text, which for a byte-level BPE is also the original text."""
    luts = build_tiktoken_luts(enc)
    eot = boundary_id(enc)
    stream: list[int] = []
    for doc in DOCS:
        ids = enc.encode_ordinary(doc)
        prev = torch.tensor([eot, *ids[:-1]]) if ids else torch.tensor([], dtype=torch.long)
        counted = int(token_bytes(prev, torch.tensor(ids, dtype=torch.long), luts).sum()) if ids else 0
        decoded = enc.decode_bytes(ids)
        assert counted == len(decoded) == len(doc.encode("utf-8")), doc
        stream += [eot, *ids]
    total = stream_bytes(torch.tensor(stream), luts)
    assert total == sum(len(d.encode("utf-8")) for d in DOCS)
    # The merges were used: the count is not just one byte per token.
    assert len(stream) - len(DOCS) < total


def test_a_local_tiktoken_file_loads_with_eot_after_the_ranks(tmp_path, enc):
    local = load_encoding(write_tiktoken_file(tmp_path / "small.tiktoken"))
    assert local.n_vocab == enc.n_vocab and boundary_id(local) == boundary_id(enc)
    assert local.encode_ordinary(DOCS[0]) == enc.encode_ordinary(DOCS[0])


def test_gpt2_vocabulary_offline_names_both_ways_to_provide_it(monkeypatch):
    from speedrun.errors import DataError

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(DataError, match="TIKTOKEN_CACHE_DIR") as err:
        load_encoding(GPT2)
    assert "data.tokenizer=<path>/r50k_base.tiktoken" in str(err.value)


def test_missing_tiktoken_file_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="r50k_base.tiktoken"):
        load_encoding(tmp_path / "absent.tiktoken")


def test_prepared_shards_are_modded_nanogpt_layout(tmp_path):
    vocab = write_tiktoken_file(tmp_path / "small.tiktoken")
    train, val = DOCS * 3, DOCS
    paths = prepare_tiktoken_dataset(train, val, tmp_path / "ds", str(vocab), shard_tokens=100, num_threads=1)
    enc = load_encoding(vocab)
    eot = boundary_id(enc)
    tokens = np.concatenate([read_shard(p) for p in list_shards(tmp_path / "ds", "val")]).astype(np.int64)
    expected = [t for doc in val for t in (eot, *enc.encode_ordinary(doc))]
    assert tokens.tolist() == expected
    assert len(paths.train) > 1  # 100-token shards: documents cross shard ends
    info = read_dataset_info(tmp_path / "ds")
    assert info["val"]["bytes"] == sum(len(d.encode("utf-8")) for d in val)
    assert info["vocab_size"] == enc.n_vocab and info["tokenizer"] == str(vocab)
    opened = open_dataset(tmp_path / "ds", str(vocab), enc.n_vocab)
    assert opened.val == paths.val and opened.vocab_size == enc.n_vocab
    with pytest.raises(ValueError, match=f"data.vocab_size={enc.n_vocab}"):
        open_dataset(tmp_path / "ds", str(vocab), 1024)


def test_prepare_script_writes_gpt2_style_shards(tmp_path):
    vocab = write_tiktoken_file(tmp_path / "small.tiktoken")
    inputs = [tmp_path / "a.txt", tmp_path / "b.txt"]  # a .txt file is one document
    for i, path in enumerate(inputs):
        path.write_text(f"the cat in the hat {i}\n" * 20)
    out = tmp_path / "out"
    proc = run_python(  # the script forked from this process: its imports are done
        [str(REPO / "scripts/prepare_data.py"), "--tokenizer", str(vocab), "--input", *map(str, inputs)]
        + ["--out", str(out), "--val-every", "2"],
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert read_shard(list_shards(out, "val")[0])[0] == boundary_id(load_encoding(vocab))


def test_check_bpb_bytes_script_agrees_with_decoding_and_catches_a_wrong_count(tmp_path, capsys):
    """scripts/check_bpb_bytes.py: speedrun's count of the val targets equals the UTF-8 length of tiktoken's
    decoding (whole split and eval windows); a dataset.json that disagrees makes it exit 1."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("check_bpb_bytes", REPO / "scripts/check_bpb_bytes.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    vocab = write_tiktoken_file(tmp_path / "small.tiktoken")
    docs = [f"{d} {i}" * 4 for i in range(6) for d in DOCS]
    prepare_tiktoken_dataset(docs[2:], docs[:6], tmp_path / "ds", str(vocab), num_threads=1)
    assert script.main(["--data", str(tmp_path / "ds"), "--seq-len", "16"]) == 0
    out = capsys.readouterr().out
    assert out.count("equal") == 3 and out.rstrip().endswith("OK"), out
    info_path = tmp_path / "ds" / "dataset.json"
    info = json.loads(info_path.read_text())
    info["val"]["bytes_original_text"] += 1
    info_path.write_text(json.dumps(info))
    assert script.main(["--data", str(tmp_path / "ds"), "--seq-len", "16"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("MISMATCH")


# --- the plan and a run on GPT-2-style data ---------------------------------------------------------------------


def test_mng_124m_on_gpt2_data_pads_the_vocab_to_50304(compose):
    from speedrun.config import to_config
    from speedrun.plan import resolve
    from support.devices import fake_device

    cfg = to_config(compose(["experiment=mng_124m", "data=fineweb10B_gpt2"]))
    plan = resolve(cfg, fake_device("h100"))
    assert plan.model.vocab_size == 50304 and plan.data.vocab_size == 50257
    assert plan.data.tokenizer == GPT2  # a name, not made into a path under the working directory
    # modded-nanogpt's train_gpt.py at f411b3d: GPT(num_layers=11, num_heads=6, head_dim=128, model_dim=768)
    assert (plan.model.n_layer, plan.model.d_model, plan.model.n_head, plan.model.n_kv_head) == (11, 768, 6, 6)
    assert plan.model.seq_len == 2048 and plan.model.tie_embeddings
    # its half-truncated RoPE: frequencies 1024^(-i/31), i = 0..31, on 64 of the 128 channels of a head
    from speedrun.core.model import rope_tables

    assert (plan.model.rope_dims, plan.model.rope_base) == (64, 1280.58)
    cos, sin = rope_tables(2, 128, plan.model.rope_base, plan.model.rope_dims)
    angle = torch.atan2(sin[1].double(), cos[1].double())  # position 1: the frequencies themselves (all below pi)
    torch.testing.assert_close(angle, 1024.0 ** (-torch.arange(32, dtype=torch.float64) / 31), rtol=1e-4, atol=1e-6)
    # debug=smoke's heads of 32 channels keep the half: 16
    smoke = resolve(to_config(compose(["experiment=mng_124m", "debug=smoke"])), fake_device("cpu"))
    assert smoke.model.rope_dims == smoke.model.d_model // smoke.model.n_head // 2 == 16
    # A 1024 vocabulary is already a multiple of 128: the embedded corpus keeps it.
    assert resolve(to_config(compose(["experiment=mng_124m"])), fake_device("h100")).model.vocab_size == 1024


def test_mng_124m_budget_and_validation_are_modded_nanogpts(compose, tmp_path):
    """Its step count and mean batch, no wall-clock cap (the card's default 120 s would end it early), validation
    every 250 steps on its 10,485,760 val tokens, target 3.28 (conf/experiment/mng_124m.yaml lists the sources)."""
    from speedrun.config import to_config
    from speedrun.plan import resolve
    from support.devices import fake_device

    plan = resolve(to_config(compose(["experiment=mng_124m", "data=fineweb10B_gpt2"])), fake_device("h100"))
    assert plan.budget.seconds is None and plan.budget.steps == 1285
    assert plan.tokens_per_step == 262144 == 128 * plan.model.seq_len
    assert (plan.eval.every_steps, plan.eval.periodic_tokens, plan.eval.tokens) == (250, 10485760, 10485761)
    # its val_tokens are targets: the evaluation scores exactly its first 10,485,760 (5120 windows of 2048)
    from speedrun.core.data import load_val_tokens
    from speedrun.data.shards import write_shard

    write_shard(tmp_path / "fineweb_val_000000.bin", np.zeros(10_500_000, dtype=np.uint16))
    scored = load_val_tokens([tmp_path / "fineweb_val_000000.bin"], plan.eval.tokens, plan.model.seq_len)
    assert scored.numel() - 1 == 10485760 == plan.eval.periodic_tokens
    assert plan.target_metric == "val_loss" and plan.target_value == 3.28


def test_an_explicit_model_vocab_must_be_the_padded_one(compose):
    from speedrun.config import to_config
    from speedrun.errors import PlanError
    from speedrun.plan import resolve
    from support.devices import fake_device

    cfg = to_config(compose(["model=mng_124m", "data=fineweb10B_gpt2", "model.vocab_size=50257"]))
    with pytest.raises(PlanError, match="padded to a multiple of model.vocab_multiple=128: 50304"):
        resolve(cfg, fake_device("h100"))


def test_without_tiktoken_the_plan_names_the_extra(compose, monkeypatch):
    from speedrun.config import to_config
    from speedrun.errors import DataError
    from speedrun.plan import resolve
    from support.devices import fake_device

    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken now raises ImportError
    cfg = to_config(compose(["data=fineweb10B_gpt2"]))
    with pytest.raises(DataError, match=r"pip install 'speedrun\[gpt2\]'"):
        resolve(cfg, fake_device("h100"))
