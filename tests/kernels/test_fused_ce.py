"""kernel.fused_ce: the chunked linear + softcapped cross-entropy (speedrun.core.fused_ce) gives GPT.head's loss and
gradients (x and the head weight; fp32 and bf16 autocast; mean and per-token; the plain and the asymmetric softcap)
without a whole (tokens, vocab) fp32 tensor, the Plan carries it into the model or refuses it by name, and a tiny
run built from the Plan trains through it as the eager head does. On CUDA (gpu-marked): the model compiled in bf16,
the compiled loss's peak memory, and a CUDA graph's replay."""

from __future__ import annotations

import inspect
import runpy
import subprocess
import sys
import weakref
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch.utils._python_dispatch import TorchDispatchMode

from speedrun.config import to_config
from speedrun.core import fused_ce
from speedrun.core import model as model_mod
from speedrun.core.fused_ce import linear_softcap_ce
from speedrun.core.model import rms_norm
from speedrun.errors import ConfigError, PlanError
from speedrun.plan import resolve
from support.devices import fake_device
from support.tiny import TINY, tiny_gpt

SHAPE = replace(TINY, logit_softcap=3.0)
"""A cap small enough that tanh bends the logits the test draws (|z| up to ~10): its derivative is far from 1."""
CHUNK = 40
"""Rows per chunk: 96 rows make chunks of 40, 40 and 16 (a short last one)."""


def _head_grads(model, x, targets, reduction, fused, autocast, weights=None):
    """(loss, grad of x, grad of the head weight) of model.head in training mode, fused or eager."""
    model.fused_ce = CHUNK if fused else 0
    model.train()
    x = x.detach().clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model.head(x, targets, reduction)
    (loss if weights is None else (loss * weights).sum()).backward()
    return loss.detach().float(), x.grad.float(), model.tok_emb.weight.grad.float()


def _inputs(shape=SHAPE, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = tiny_gpt(shape, seed=seed)
    with torch.no_grad():
        model.tok_emb.weight.normal_(0, 1.5, generator=g)  # logits of a few units: the softcap matters
    x = torch.randn(3, 32, shape.d_model, generator=g)
    targets = torch.randint(0, shape.vocab_size, (3, 32), generator=g)
    return model, x, targets, torch.rand(3, 32, generator=g)


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def _straight_through_grads(model, x, targets, autocast):
    """Eager gradients with the softcap's derivative taken as 1 (its forward kept): what a fused backward that
    forgot the softcap would give. The tolerances below must tell it apart."""
    x = x.detach().clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        z = F.linear(rms_norm(x), model.tok_emb.weight).float()
    cap = model.shape.logit_softcap
    y = z + (cap * torch.tanh(z / cap) - z).detach()
    F.cross_entropy(y.view(-1, y.shape[-1]), targets.reshape(-1)).backward()
    return x.grad.float(), model.tok_emb.weight.grad.float()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_loss_and_grads_match_the_eager_head(autocast, reduction):
    """fp32: the same numbers up to summation order (1e-5). bf16 autocast: within 1% (relative norm) of the eager
    head's bf16 gradients, where a backward without the softcap's derivative is off by more than 10%."""
    model, x, targets, weights = _inputs()
    w = weights if reduction == "none" else None
    eager = _head_grads(model, x, targets, reduction, False, autocast, w)
    fused = _head_grads(model, x, targets, reduction, True, autocast, w)
    assert fused[0].shape == eager[0].shape == ((3, 32) if reduction == "none" else ())
    tol = 1e-2 if autocast else 1e-5
    assert (fused[0] - eager[0]).abs().max().item() < (2e-3 if autocast else 1e-5)
    for got, want in zip(fused[1:], eager[1:], strict=True):
        assert _rel(got, want) < tol
    if reduction == "mean":
        wrong = _straight_through_grads(model, x, targets, autocast)
        assert min(_rel(wrong[0], eager[1]), _rel(wrong[1], eager[2])) > 10 * tol


def test_the_mean_follows_a_scaled_upstream_gradient_in_fp16():
    """The mean's gradients are computed in the forward and scaled in backward: with GradScaler's first scale
    (65,536) on fp16 inputs they are the eager head's within fp16 rounding."""
    g = torch.Generator().manual_seed(4)
    x0, w0 = torch.randn(96, 32, generator=g).half(), (torch.randn(64, 32, generator=g) * 1.5).half()
    targets = torch.randint(0, 64, (96,), generator=g)
    grads = []
    for fused in (False, True):
        x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        if fused:
            loss = linear_softcap_ce(x, w, targets, 3.0, CHUNK)
        else:
            z = F.linear(x, w).float()
            loss = F.cross_entropy(3.0 * torch.tanh(z / 3.0), targets)
        (loss * 65536.0).backward()
        grads.append((x.grad.float(), w.grad.float()))
    assert all(torch.isfinite(t).all() for t in grads[1])
    assert _rel(grads[1][0], grads[0][0]) < 1e-2 and _rel(grads[1][1], grads[0][1]) < 1e-2


def test_asymmetric_caps_match_and_trainable_caps_take_the_eager_path(monkeypatch):
    """quant.logit_rescale with caps moved apart (2 for positive logits, 5 for negative): the fused loss and gradients
    are the eager head's. Caps that train (requires_grad) are not the fused path's: the head computes them eagerly,
    so they get their gradient."""
    model, x, targets, _ = _inputs(replace(SHAPE, logit_rescale=True))
    assert model.logit_rescale is not None and not model.logit_rescale.requires_grad  # frozen in training
    with torch.no_grad():
        model.logit_rescale.copy_(torch.tensor([2.0, 5.0]))
    eager = _head_grads(model, x, targets, "mean", False, False)
    fused = _head_grads(model, x, targets, "mean", True, False)
    assert abs(fused[0] - eager[0]).item() < 1e-5
    assert _rel(fused[1], eager[1]) < 1e-5 and _rel(fused[2], eager[2]) < 1e-5
    calls = []
    monkeypatch.setitem(model_mod.FUSED_CE, "on", lambda *a, **k: calls.append(1) or linear_softcap_ce(*a, **k))
    model.logit_rescale.requires_grad_(True)
    _head_grads(model, x, targets, "mean", True, False)
    assert calls == [] and model.logit_rescale.grad is not None and model.logit_rescale.grad.abs().sum() > 0


def test_the_head_with_it_compiles_as_one_graph():
    """fullgraph=True fails on any graph break: dynamo traces the chunk loops of forward and backward (aot_eager:
    no code generation), and the compiled loss and gradients are the eager fused head's."""
    model, x, targets, _ = _inputs()
    model.train()
    model.fused_ce = CHUNK
    expected = _head_grads(model, x, targets, "mean", True, False)
    torch._dynamo.reset()
    model.head = torch.compile(model.head, backend="aot_eager", fullgraph=True, dynamic=False)
    got = _head_grads(model, x, targets, "mean", True, False)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


class _LargestFloat(TorchDispatchMode):
    """The most elements of any fp32 tensor an op returns while the mode is on (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


class _LiveBytes(TorchDispatchMode):
    """The peak bytes of the storages that ops allocate while the mode is on, alive at once (each counted from the op
    that returns it until its storage is freed); views and in-place results add nothing."""

    def __init__(self):
        super().__init__()
        self.live: set[int] = set()
        self.now = self.peak = 0

    def _free(self, key, nbytes):
        self.live.discard(key)
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if storage.nbytes() and key not in self.live and key not in given:
                self.live.add(key)
                self.now += storage.nbytes()
                self.peak = max(self.peak, self.now)
                weakref.finalize(storage, self._free, key, storage.nbytes())
        return out


def test_no_whole_fp32_logits_in_forward_or_backward():
    """The largest fp32 tensor the fused head's step creates, its backward included, is x's or the head weight's
    gradient, never (tokens, vocab); the eager head creates that tensor (the check sees it). Inside the operator, the
    chunk loop (speedrun.core.fused_ce._chunks, run here directly: the operator is one call to a dispatch mode)
    creates a chunk's logits at most."""
    model, x, targets, _ = _inputs()
    whole = x.shape[0] * x.shape[1] * SHAPE.vocab_size
    seen = {}
    for fused in (False, True):
        with _LargestFloat() as mode:
            _head_grads(model, x, targets, "mean", fused, False)
        seen[fused] = mode.largest
    assert seen[False] >= whole
    rows = x.shape[0] * x.shape[1]
    assert seen[True] == max(SHAPE.vocab_size, rows) * SHAPE.d_model < whole  # x's or the weight's gradient
    x2, w = x.reshape(rows, -1), model.tok_emb.weight.detach()
    for scale in (None, 1.0, torch.rand(rows)):
        with _LargestFloat() as mode:
            fused_ce._chunks(x2, w, targets.reshape(-1), None, 3.0, CHUNK, scale)
        assert mode.largest == max(CHUNK * SHAPE.vocab_size, rows * SHAPE.d_model if scale is not None else 0)


@pytest.mark.parametrize("caps", [False, True], ids=["cap", "asymmetric"])
def test_a_chunk_peaks_at_under_three_fp32_logit_chunks(caps):
    """The chunk loop works in place: in bf16, with the gradients of the mean (the training step) or of per-row
    weights (reduction="none"'s backward), the storages it allocates peak under three fp32 (chunk, vocab) tensors,
    its outputs (the gradients of x and W) included (2.73 measured). Written out of place (y = c * tanh(z / c),
    exp(y - lse), 1 - (y / c) ** 2, each op a new tensor), the same loop peaks at 4.7 chunks, 6.7 asymmetric."""
    n, c, v, chunk = 400, 16, 512, 100
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, c, generator=g).bfloat16()
    w = (torch.randn(v, c, generator=g) * 0.5).bfloat16()
    targets = torch.randint(0, v, (n,), generator=g)
    args = (torch.tensor([2.0, 5.0]), 0.0) if caps else (None, 3.0)
    for scale in (1.0, torch.rand(n, generator=g)):
        with _LiveBytes() as mode:
            out = fused_ce._chunks(x, w, targets, *args, chunk, scale)
        outputs = sum(t.untyped_storage().nbytes() for t in out)
        assert outputs < chunk * v * 4 / 4  # the gradients are small beside a chunk: the peak is the loop's
        assert chunk * v * 4 * 2 <= mode.peak < chunk * v * 4 * 3, mode.peak / (chunk * v * 4)


def _compiled_graphs(loss_fn, *inputs):
    """(loss, grads of ``inputs``, the FX graphs AOT autograd hands the compiler: forward and backward) of
    ``loss_fn`` under torch.compile(fullgraph=True); the graphs run as they are (no code generation)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    loss = compiled(*inputs)
    loss.sum().backward()
    return loss.detach(), [t.grad for t in inputs], graphs


def _calls(graph):
    return [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]


@pytest.mark.parametrize("caps", [False, True], ids=["cap", "asymmetric"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiled_the_chunk_loop_is_one_node(reduction, caps):
    """torch.compile sees the fused loss as one operator node (torch.ops.speedrun.fused_ce_mean, or fused_ce_rows
    and in backward fused_ce_rows_grads), never the chunks' matmuls: traced, the loop would be unrolled into the
    graph and inductor free to run several chunks' matmuls at once and keep their buffers alive (the gpu-marked peak
    test measures that). Compiled, the loss and gradients (bf16 autocast) are the eager fused loss's."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(200, 16, generator=g)
    w = torch.randn(128, 16, generator=g) * 0.5
    targets = torch.randint(0, 128, (200,), generator=g)
    cap = torch.tensor([2.0, 5.0]) if caps else 3.0

    def loss_fn(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return linear_softcap_ce(x, w, targets, cap, 48, reduction)

    loss, grads, (forward, backward) = _compiled_graphs(loss_fn, x, w)
    ops = _calls(forward) + _calls(backward)
    mine = [op for op in ops if op.startswith("speedrun.")]
    want = ["speedrun.fused_ce_mean.default"] if reduction == "mean" else ["speedrun.fused_ce_rows.default"]
    assert mine == want + ([] if reduction == "mean" else ["speedrun.fused_ce_rows_grads.default"]), ops
    assert not [op for op in ops if "mm" in op], ops
    xe, we = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss_fn(xe, we).sum().backward()
    torch.testing.assert_close(loss, loss_fn(x, w).detach(), rtol=0, atol=0)
    torch.testing.assert_close(grads, [xe.grad, we.grad], rtol=0, atol=0)


def test_inductor_on_cpu_compiles_it_to_the_eager_numbers():
    """Inductor (C++ code generation on CPU) around the operator, the asymmetric caps a tensor input: the compiled
    mean loss and gradients are the eager fused loss's."""
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(96, 32, generator=g), torch.randn(64, 32, generator=g)
    targets = torch.randint(0, 64, (96,), generator=g)
    caps = torch.tensor([2.0, 5.0])
    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        fn = lambda x, w: linear_softcap_ce(x, w, targets, caps, CHUNK)  # noqa: E731
        xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        loss = (torch.compile(fn, backend="inductor", fullgraph=True) if compiled else fn)(xi, wi)
        loss.backward()
        results.append((loss.detach(), xi.grad, wi.grad))
    torch.testing.assert_close(results[1], results[0])


def test_the_operators_pass_torch_opcheck():
    """torch.library.opcheck: the schemas, the fake (shape-only) implementations torch.compile traces with, the
    autograd registration and AOT autograd's dispatch, for the mean (asymmetric caps) and per-row losses (float cap)."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(96, 32, generator=g, requires_grad=True)
    w = torch.randn(64, 32, generator=g, requires_grad=True)
    targets = torch.randint(0, 64, (96,), generator=g)
    torch.library.opcheck(fused_ce.CE_MEAN, (x, w, targets, torch.tensor([2.0, 5.0]), 0.0, CHUNK, True))
    torch.library.opcheck(fused_ce.CE_ROWS, (x, w, targets, None, 3.0, CHUNK))


def _saved_by_compiled(x, w, targets, reduction):
    """Elements saved for backward by the compiled (AOT autograd's partitioner, as inductor uses it) fused loss."""
    torch._dynamo.reset()

    def loss(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return linear_softcap_ce(x, w, targets, 3.0, 100, reduction)

    sizes: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        torch.compile(loss, backend="aot_eager_decomp_partition", fullgraph=True)(x, w).sum().backward()
    return sum(sizes)


def test_compiled_loss_saves_nothing_of_tokens_by_vocab():
    """Under torch.compile the mean loss saves for backward its gradients (of x and the head weight); per-token
    losses save x, the weight and the targets, and their backward operator recomputes the chunks' logits: nothing
    of (tokens, vocab) either way."""
    n, c, v = 400, 16, 512
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, c, generator=g, requires_grad=True)
    w = torch.randn(v, c, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    assert _saved_by_compiled(x, w, targets, "mean") <= 2 * (v * c + n * c) < n * v / 5
    assert _saved_by_compiled(x, w, targets, "none") <= 2 * (v * c + n * c) + n < n * v / 5


def _exec_copies(text: str, copies: int = 2) -> list[dict]:
    """Namespaces of ``text`` exec'd ``copies`` times, as an exported train_gpt.py runs its linked code."""
    namespaces = []
    for i in range(copies):
        namespace = {"__name__": f"train_gpt_{i}"}
        exec(compile(text, f"train_gpt_{i}.py", "exec"), namespace)
        namespaces.append(namespace)
    return namespaces


def _loss_and_grads(fn, reduction):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(96, 32, generator=g, requires_grad=True)
    w = torch.randn(64, 32, generator=g, requires_grad=True)
    targets = torch.randint(0, 64, (96,), generator=g)
    loss = fn(x, w, targets, torch.tensor([2.0, 5.0]), CHUNK, reduction)
    (loss * torch.rand(loss.shape, generator=g)).sum().backward()
    return loss.detach(), x.grad, w.grad


def _minified() -> str:
    """speedrun/core/fused_ce.py minified as the counted file's code is (annotations dropped)."""
    from speedrun.artifact.minify import minify

    text = minify(Path(fused_ce.__file__).read_text(encoding="utf-8"), "fused_ce.py")
    assert ":torch.Tensor" not in text.replace(" ", "") and "custom_op" in text
    return text


def test_exec_copies_of_the_module_reuse_the_operators():
    """An exported train_gpt.py exec's the linked code in the process that imported speedrun (the e2e test of the
    same numbers does): each copy of speedrun/core/fused_ce.py, as written and minified, finds the operators defined
    and reuses them, with the same numbers."""
    copies = _exec_copies(Path(fused_ce.__file__).read_text(encoding="utf-8")) + _exec_copies(_minified())
    for reduction in ("mean", "none"):
        want = _loss_and_grads(linear_softcap_ce, reduction)
        for namespace in copies:
            assert namespace["CE_MEAN"] is fused_ce.CE_MEAN and namespace["CE_ROWS"] is fused_ce.CE_ROWS
            for got, expected in zip(_loss_and_grads(namespace["linear_softcap_ce"], reduction), want, strict=True):
                torch.testing.assert_close(got, expected, rtol=0, atol=0)


FRESH = """
copies = _exec_copies(open(sys.argv[1]).read())
assert not [m for m in sys.modules if m.startswith("speedrun")], "the copies must define the operators"
assert copies[1]["CE_ROWS"] is copies[0]["CE_ROWS"]
torch.save([_loss_and_grads(ns["linear_softcap_ce"], r) for ns in copies for r in ("mean", "none")], sys.argv[2])
"""


def test_a_minified_copy_defines_the_operators_in_a_fresh_process(tmp_path):
    """In a process that never imported speedrun, the minified module defines the three operators from its written
    out schemas (custom_op cannot infer them: the annotations are gone) and a second copy reuses them; the losses and
    gradients (mean and per-token, asymmetric caps) are this process's."""
    (tmp_path / "fused_ce.py").write_text(_minified(), encoding="utf-8")
    helpers = inspect.getsource(_exec_copies) + inspect.getsource(_loss_and_grads)
    script = tmp_path / "fresh.py"
    script.write_text(f"import sys\nimport torch\nCHUNK = {CHUNK}\n{helpers}{FRESH}", encoding="utf-8")
    out = tmp_path / "out.pt"
    subprocess.run([sys.executable, str(script), str(tmp_path / "fused_ce.py"), str(out)], check=True)
    got = torch.load(out)
    want = [_loss_and_grads(linear_softcap_ce, r) for r in ("mean", "none")] * 2
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(list(g), list(w), rtol=0, atol=0)


# ---- the Plan ------------------------------------------------------------------------------------------------------


def _plan(compose, device, *overrides):
    return resolve(to_config(compose(list(overrides))), fake_device(device))


def test_the_plan_carries_it_with_a_default_chunk(compose):
    off_plan = _plan(compose, "h100", "model=pgolf_baseline")
    off = off_plan.kernel
    assert (off.fused_ce, off.fused_ce_chunk, off.result_keys()["kernel_fused_ce"]) == (False, 0, False)
    on_plan = _plan(compose, "h100", "kernel.fused_ce=true", "model=pgolf_baseline")
    on = on_plan.kernel
    # the memory estimate counts one chunk's logits (10 bytes each) instead of every token's
    tokens = on_plan.micro_batch * on_plan.model.seq_len
    saved = (tokens - min(tokens, 32768)) * 1024 * 10 / 1e9
    assert saved > 0 and off_plan.memory_estimate_gb - on_plan.memory_estimate_gb == pytest.approx(saved, abs=0.01)
    assert (on.fused_ce, on.fused_ce_chunk) == (True, 32768)  # 2^25 logits at vocab 1024
    assert on.result_keys()["kernel_fused_ce_chunk"] == 32768 and "fused loss (32768 rows" in on.describe()
    set_chunk = _plan(compose, "cpu", "kernel.fused_ce=true", "kernel.fused_ce_chunk=100").kernel
    assert set_chunk.fused_ce_chunk == 100


def test_refusals_name_the_fix(compose, monkeypatch):
    with pytest.raises(PlanError, match="add kernel.fused_ce=true, or drop kernel.fused_ce_chunk"):
        _plan(compose, "cpu", "kernel.fused_ce_chunk=64")
    with pytest.raises(ConfigError, match="kernel.fused_ce_chunk=0 must be >= 1"):
        _plan(compose, "cpu", "kernel.fused_ce=true", "kernel.fused_ce_chunk=0")

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # tests/external/tiny_lm.py
    with pytest.raises(PlanError, match="external.tiny_lm:TinyLM has no such attribute: drop kernel.fused_ce"):
        _plan(compose, "cpu", "model.arch=external.tiny_lm:TinyLM", "kernel.fused_ce=true")


TINY_RUN = [
    "hardware=cpu",
    "model=tiny",
    "model.n_layer=2",
    "model.d_model=32",
    "model.seq_len=32",
    "data.vocab_size=64",
    "hardware.micro_batch=4",
    "budget.tokens_per_step=128",
    "kernel.fused_ce=true",
    "kernel.fused_ce_chunk=48",
]


def _train(plan, steps=30):
    """Training losses of the model ``plan`` builds (speedrun.run.build.build_model), on one repeated batch."""
    from speedrun.run.build import build_attention, build_model

    torch.manual_seed(0)
    model, forward, _, optimizers = build_model(plan, build_attention(plan), bos_id=0)
    seq = torch.randint(0, 64, (4, 33), generator=torch.Generator().manual_seed(1))
    losses = []
    model.train()
    for _ in range(steps):
        loss = forward(seq[:, :-1], seq[:, 1:])
        loss.backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return model, losses


def test_a_tiny_model_built_from_the_plan_trains_through_it(compose, monkeypatch):
    """The Plan's chunk reaches the built model, every training step's loss goes through the fused loss, and 30
    steps (Muon and Adam) bring it well down, step for step as the eager head does (fp32: within 1e-4)."""
    calls = []
    monkeypatch.setitem(model_mod.FUSED_CE, "on", lambda *a, **k: calls.append(1) or linear_softcap_ce(*a, **k))
    model, fused = _train(_plan(compose, "cpu", *TINY_RUN))
    assert model.fused_ce == 48 and len(calls) == 30
    assert fused[-1] < fused[0] - 1.0, fused
    eager_run = [o for o in TINY_RUN if not o.startswith("kernel.")]
    model, eager = _train(_plan(compose, "cpu", *eager_run))
    assert model.fused_ce == 0 and len(calls) == 30
    assert max(abs(a - b) for a, b in zip(fused, eager, strict=True)) < 1e-4, (fused, eager)


def test_the_exported_file_links_it_only_when_chosen(compose, tmp_path):
    """The registry core.model.FUSED_CE is keyed by kernel.fused_ce: the readable exported module (the driver and
    the core it reaches, speedrun.artifact.wrap.linked_module) carries speedrun/core/fused_ce.py's code for a Plan
    that chose it, and none of it otherwise. Exec'd in this process (as tests/e2e/test_same_numbers.py runs an
    exported file), the chosen one reuses the operators speedrun defined and computes the same loss."""
    from speedrun.artifact.wrap import CodeSource, linked_module

    code = CodeSource.snapshot()
    eager_run = [o for o in TINY_RUN if not o.startswith("kernel.")]
    for run, chosen in ((eager_run, False), (TINY_RUN, True)):
        text = linked_module(code.for_plan(_plan(compose, "cpu", *run)))
        for name in ("def linear_softcap_ce", "def _chunks", "speedrun::"):
            assert (name in text) == chosen, (name, chosen)
    (tmp_path / "train_gpt_human.py").write_text(text, encoding="utf-8")
    namespace = runpy.run_path(
        str(tmp_path / "train_gpt_human.py"), run_name="train_gpt_human"
    )  # defines, runs nothing
    assert namespace["CE_MEAN"] is fused_ce.CE_MEAN
    for reduction in ("mean", "none"):
        got, want = (_loss_and_grads(fn, reduction) for fn in (namespace["linear_softcap_ce"], linear_softcap_ce))
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---- CUDA ----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_bf16_on_cuda_matches_the_eager_head():
    """The whole GPT compiled under bf16 autocast, as training runs it, with and without the fused loss: the loss
    within 5e-3 and every parameter's gradient within 2% (relative norm), where a wrong softcap derivative is off by
    far more (the CPU test above measures it)."""
    shape = replace(TINY, vocab_size=1024, d_model=128, n_head=4, n_kv_head=2, seq_len=128, logit_softcap=15.0)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, shape.vocab_size, (4, 128), generator=g).cuda()
    tgt = torch.randint(0, shape.vocab_size, (4, 128), generator=g).cuda()
    models = []
    for fused in (0, 96):  # 512 rows: chunks of 96 and a short last one
        m = tiny_gpt(shape, seed=0, noise=0.05).cuda()
        m.fused_ce = fused
        models.append(m)
    losses = []
    for m in models:
        m.train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.compile(m)(idx, tgt)
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) < 5e-3, losses
    ref = dict(models[0].named_parameters())
    for name, p in models[1].named_parameters():
        if ref[name].grad is None:
            assert p.grad is None, name
            continue
        err = (p.grad - ref[name].grad).norm() / ref[name].grad.norm().clamp_min(1e-12)
        assert err < 2e-2, (name, err.item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_fused_loss_on_cuda_never_holds_the_logits():
    """16,384 tokens at vocab 8,192, compiled, bf16 (logits: 256 MiB in bf16, 512 in fp32). The eager head's step
    peaks at least a bf16 copy of them above its inputs (its backward's bf16 logit gradient is that large); the fused
    mean (chunks of 1,024 rows) under a quarter of the fp32 size. Per-token losses: the same numbers (the peak bound is
    the mean's, training's loss). Losses within 2e-3
    on average (per token within a bf16 step of the logits), both gradients within 1% (relative norm)."""
    n, c, v = 16384, 256, 8192
    g = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(n, c, device="cuda", generator=g).bfloat16()
    w0 = (torch.randn(v, c, device="cuda", generator=g) * 0.2).bfloat16()
    targets = torch.randint(0, v, (n,), device="cuda", generator=g)
    weights = torch.rand(n, device="cuda", generator=g)

    def eager(x, w, t, reduction):
        z = F.linear(x, w).float()
        z = 15.0 * torch.tanh(z / 15.0)
        return F.cross_entropy(z, t, reduction=reduction)

    def fused(x, w, t, reduction):
        return linear_softcap_ce(x, w, t, 15.0, 1024, reduction)

    whole = n * v * 4
    for reduction in ("mean", "none"):
        results, peaks = [], []
        for fn in (eager, fused):
            torch._dynamo.reset()
            step = torch.compile(fn)
            for _ in range(2):  # the first call compiles; the second is measured
                x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                loss = step(x, w, targets, reduction)
                (loss if reduction == "mean" else loss * weights).sum().backward()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
            peaks.append(peak)
            results.append((loss.detach().float(), x.grad.float(), w.grad.float()))
        if reduction == "mean":
            assert peaks[0] >= whole / 2 and peaks[1] < whole / 4, peaks
        diff = (results[0][0] - results[1][0]).abs()
        # per token: a logit rounded to the other neighbouring bf16 value (GEMMs of other shapes) moves a loss by up
        # to a bf16 step of the logits (~0.016 at their scale); the mean of them hardly
        assert diff.max().item() < 3e-2 and diff.mean().item() < 2e-3
        for got, want in zip(results[1][1:], results[0][1:], strict=True):
            assert _rel(got, want) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_loss_replays_in_a_cuda_graph():
    """kernel.cuda_graphs captures forward and backward: the fused loss captures (no host sync, no allocation
    outside the graph's pool) and a replay on new inputs gives what an uncaptured call gives on them."""
    n, c, v = 4096, 128, 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, c, device="cuda", generator=g).bfloat16().requires_grad_(True)
    w = (torch.randn(v, c, device="cuda", generator=g) * 0.2).bfloat16().requires_grad_(True)
    targets = torch.randint(0, v, (n,), device="cuda", generator=g)

    def step():
        x.grad = w.grad = None
        loss = linear_softcap_ce(x, w, targets, 15.0, 1024)
        loss.backward()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    with torch.no_grad():
        x.copy_(torch.randn(n, c, device="cuda", generator=g))
        targets.copy_(torch.randint(0, v, (n,), device="cuda", generator=g))
    graph.replay()
    replayed = (static_loss.clone(), x.grad.clone(), w.grad.clone())
    expected = (step().detach(), x.grad, w.grad)
    for got, want in zip(replayed, expected, strict=True):
        torch.testing.assert_close(got, want)
