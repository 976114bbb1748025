"""An eval's identity covers the tokenizer: the same val ids under another tokenizer of the same vocab size score
the same val_loss but count other bytes, so their val_bpb must not be compared as one set."""

from __future__ import annotations

import shutil
import types

import pytest
import torch

from speedrun.config import to_config
from speedrun.core.data import build_byte_luts, load_tokenizer
from speedrun.data.corpus import load_embedded_documents
from speedrun.data.tokenizer import tokenizer_sha256, train_tokenizer
from speedrun.plan import resolve
from speedrun.run.finish import eval_fingerprint
from support.devices import fake_device

VOCAB = 384


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Two SentencePiece models of one vocab size trained on different documents, and a byte copy of the first."""
    tmp = tmp_path_factory.mktemp("tok")
    docs = load_embedded_documents()
    a = train_tokenizer(docs[:40], tmp / "a" / "tok", VOCAB, max_chars=200_000, num_threads=1)
    b = train_tokenizer(docs[-40:], tmp / "b" / "tok", VOCAB, max_chars=200_000, num_threads=1)
    copy = tmp / "copy" / "tok.model"
    copy.parent.mkdir()
    shutil.copyfile(a, copy)
    assert load_tokenizer(a).get_piece_size() == load_tokenizer(b).get_piece_size() == VOCAB
    return a, b, copy, docs[100]


def test_the_fingerprint_tells_tokenizers_of_one_vocab_size_apart(tokenizers):
    a, b, copy, _ = tokenizers
    ids = torch.randint(0, VOCAB, (257,), generator=torch.Generator().manual_seed(0))
    sha_a, sha_b = tokenizer_sha256(a), tokenizer_sha256(b)
    assert sha_a != sha_b and tokenizer_sha256(copy) == sha_a  # the file's bytes, wherever it lies
    assert eval_fingerprint(ids, sha_a) != eval_fingerprint(ids, sha_b)
    assert eval_fingerprint(ids, sha_a) == eval_fingerprint(ids.clone(), tokenizer_sha256(copy))
    other = ids.clone()
    other[5] = (other[5] + 1) % VOCAB
    assert eval_fingerprint(other, sha_a) != eval_fingerprint(ids, sha_a)  # the scored ids still count


def test_a_run_records_the_tokenizer_and_its_fingerprint(compose, tmp_path, tokenizers):
    """Through the eval phase: one model, the same val ids, two tokenizers: val_loss equal, val_bpb not, and the
    fingerprints and tokenizer_sha256 differ; the byte copy gives the first one's keys exactly."""
    from speedrun.core.attention import get_backend
    from speedrun.core.model import GPT
    from speedrun.run.finish import evaluate_and_export

    a, b, copy, text = tokenizers
    overrides = ["hardware=cpu", "model=tiny", "model.n_layer=1", "model.d_model=32", "model.seq_len=32"]
    overrides += [f"data.vocab_size={VOCAB}", "hardware.micro_batch=2", "budget.tokens_per_step=64", "quant=off"]
    plan = resolve(to_config(compose(overrides)), fake_device("cpu"))
    torch.manual_seed(0)
    gpt = GPT(plan.model, get_backend("sdpa", kernel="math"))
    sp = load_tokenizer(a)
    ids = torch.tensor([sp.bos_id(), *sp.encode(text)][: 4 * 32 + 1])

    def finish(path):
        tok = load_tokenizer(path)
        data = types.SimpleNamespace(
            val_tokens=ids, luts=build_byte_luts(tok), bos_id=tok.bos_id(), paths=types.SimpleNamespace(tokenizer=path)
        )
        return evaluate_and_export(plan, gpt, lambda x, y: gpt(x, y, reduction="none"), data, tmp_path, print)

    out_a, out_b, out_copy = finish(a), finish(b), finish(copy)
    assert out_a["val_loss"] == out_b["val_loss"] and out_a["val_bpb"] != out_b["val_bpb"]
    assert out_a["eval_fingerprint"] != out_b["eval_fingerprint"]
    assert out_a["tokenizer_sha256"] == tokenizer_sha256(a)[:16] != out_b["tokenizer_sha256"]
    keys = ("val_bpb", "eval_fingerprint", "tokenizer_sha256")
    assert [out_copy[k] for k in keys] == [out_a[k] for k in keys]


def test_a_tiktoken_vocabulary_is_named_by_its_ranks(tmp_path):
    """A .tiktoken file's identity is what its ids decode to: the same ranks under another file name are one
    tokenizer (so gpt2 and r50k_base.tiktoken are too), one rank moved is another."""
    pytest.importorskip("tiktoken", reason="tiktoken is not installed (pip install 'speedrun[gpt2]')")
    import base64

    ranks = [bytes([i]) for i in range(256)] + [b" t", b"he", b" the"]

    def write(name, pieces):
        path = tmp_path / name
        path.write_text("".join(f"{base64.b64encode(p).decode()} {i}\n" for i, p in enumerate(pieces)))
        return path

    same = tokenizer_sha256(write("x.tiktoken", ranks))
    assert tokenizer_sha256(write("y.tiktoken", ranks)) == same
    assert tokenizer_sha256(write("z.tiktoken", [*ranks[:-1], b"in"])) != same
