"""speedrun.bench.fa4: FlashAttention-3's interface on FlashAttention-4 for a peer script, checked against a stand-in
flash_attn.cute package (FA4 itself needs a Hopper or Blackwell GPU): the calls reach FA4 with FA3's arguments and
return the output alone; the bench uses it where FA4 is installed and FA3 is not, and the result says so."""

from __future__ import annotations

import argparse
import importlib
import sys

import pytest

from speedrun.bench import fa4

# FA4's two calls as stand-ins: they return (what they were called with, "lse"), as FA4 returns (out, lse)
FAKE_CUTE = """
def flash_attn_func(q, k, v, softmax_scale=None, causal=False, **kwargs):
    return ({{"call": "dense", "q": q, "causal": causal, "scale": softmax_scale, **kwargs}}, "lse")


def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
                           softmax_scale=None, causal=False, {extra}):
    return ({{"call": "varlen", "cu": (cu_seqlens_q, cu_seqlens_k), "causal": causal, {seen}}}, "lse")
"""


def fake_fa4(root, with_max_seqlen: bool):
    """A flash_attn.cute package under ``root`` whose varlen call takes max_seqlen_q/k or not."""
    package = root / "flash_attn" / "cute"
    package.mkdir(parents=True)
    (root / "flash_attn" / "__init__.py").write_text("")
    extra = "max_seqlen_q=None, max_seqlen_k=None" if with_max_seqlen else "window_size=(None, None)"
    seen = '"max": (max_seqlen_q, max_seqlen_k)' if with_max_seqlen else '"window": window_size'
    (package / "__init__.py").write_text(FAKE_CUTE.format(extra=extra, seen=seen))


@pytest.fixture
def fresh_modules(monkeypatch):
    for name in ("flash_attn", "flash_attn.cute", "flash_attn_interface"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("flash_attn", "flash_attn.cute", "flash_attn_interface"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("with_max_seqlen", [True, False])
def test_the_fa3_calls_reach_fa4_and_return_the_output_alone(tmp_path, monkeypatch, fresh_modules, with_max_seqlen):
    fake_fa4(tmp_path / "site", with_max_seqlen)
    shim = fa4.write_shim(tmp_path / "shim")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(shim))
    fa3 = importlib.import_module("flash_attn_interface")
    assert fa3.flash_attn_func("q", "k", "v", causal=True) == {"call": "dense", "q": "q", "causal": True, "scale": None}
    out = fa3.flash_attn_varlen_func("q", "k", "v", cu_seqlens_q="cu", cu_seqlens_k="cu", max_seqlen_q=64,
                                     max_seqlen_k=64, causal=True)  # fmt: skip
    assert out["call"] == "varlen" and out["cu"] == ("cu", "cu") and out["causal"] is True
    # the maxima go where FA4's signature takes them, and nowhere else (a call it does not know would raise)
    assert out.get("max") == ((64, 64) if with_max_seqlen else None)
    assert fa4.is_shim(shim / "flash_attn_interface.py") and not fa4.is_shim(tmp_path / "nowhere.py")


def test_fa4_is_found_where_installed_and_only_there(tmp_path, monkeypatch, fresh_modules):
    assert fa4.installed() is None  # not on this machine
    fake_fa4(tmp_path / "site", True)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert fa4.installed() is not None


def test_the_bench_runs_peers_on_fa4_where_fa3_is_missing_and_says_so(tmp_path, monkeypatch, fresh_modules):
    from speedrun.bench.__main__ import build_parser, options
    from speedrun.bench.checks import CHECKS
    from speedrun.bench.runner import fa3_stand_in, reproduce

    args = ["record_vs_pgolf", "--work", str(tmp_path / "work")]
    plain = options(build_parser().parse_args(args), argparse.ArgumentParser())
    assert plain.fa3_shim is None  # neither FA3 nor FA4 here: the readiness check asks for --fa3-shim
    fake_fa4(tmp_path / "site", True)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    opts = options(build_parser().parse_args(args), argparse.ArgumentParser())
    assert opts.fa3_shim == tmp_path / "work" / "fa4_shim" and fa4.is_shim(opts.fa3_shim / "flash_attn_interface.py")
    check = CHECKS["record_vs_pgolf"]
    assert fa3_stand_in(check, opts)["kind"].startswith("FlashAttention-4")
    assert "--fa3-shim" not in reproduce(check, opts)  # written again on the machine that reruns it
    given = options(build_parser().parse_args([*args, "--fa3-shim", str(tmp_path)]), argparse.ArgumentParser())
    assert given.fa3_shim == tmp_path  # a stand-in given by name wins
