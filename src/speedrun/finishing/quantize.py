"""The artifact: quantized weights, compressed, plus the code that trains, evaluates and reads them (raw bytes).

``quant=int8`` follows parameter-golf's baseline export: 2-D float tensors large enough to matter become
per-row int8 with a clipped absmax scale (fp16 scales); small tensors are kept in fp16, scalar controls in fp32.

``quant=int6`` quantizes every block matrix (attention q/k/v/proj, MLP fc/proj, an untied lm_head) with GPTQ
at ``quant.bits``: the Hessian H = X^T X / n of each layer's inputs comes from forward hooks over a few
*training* micro-batches (never validation data); columns are taken in order of decreasing H diagonal, each is
rounded and its error spread over the columns not yet rounded through the upper Cholesky factor of H^-1, so
the layer's output error on those activations is what is minimised, not the weights' own error. Scales are
per row (fp16), fixed before GPTQ by a clip search: for each row, the candidate clip (a fraction of the row's
absmax, ``quant.clip_ratios``) with the least H-diagonal-weighted rounding error. The token embedding (and an
untied lm_head) get the same per-row clip search with round-to-nearest at ``quant.embed_bits``. Values are
stored one per int8 byte (6 bits used) and the compressor's entropy coder removes the unused bits: on the tiny
model's 458,752 int6 block weights (empirical entropy 5.50 bits/value = 315,500 bytes) the int8 containers
compress to 316,226 bytes with brotli-11 and 321,844 with lzma-9, against 333,309 and 337,452 for the same
values bit-packed 4-in-3 bytes first: packing splits values across byte boundaries, which byte-oriented LZ
matching and entropy models cannot see through.

Compression is one library call on the whole serialized state dict; where the compressor's streaming interface
gives the same bytes as that call (``STREAMS``: zlib at levels 1-9, lzma, brotli at quality 10-11; tested in
tests/test_divergence.py) it is fed in chunks, so a compression of minutes prints its progress like the other
phases.

val_bpb_quant is measured on the dequantized round trip, so it is the number the artifact actually earns.
artifact_bytes = compressed blob + code counted raw (UTF-8 bytes, uncompressed), parameter-golf's rule; which
files count is speedrun.finishing.artifact.CODE_FILES.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import lzma
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from speedrun.config.compressors import COMPRESS_EXTRA, MODULES, check_compressor
from speedrun.progress import Progress

KEEP_FLOAT_MAX_NUMEL = 65_536
"""Tensors this small stay in floating point: their int8 savings are negligible, their error is not."""
CLIP_QUANTILE = 0.9999984
"""Per-row clip at this quantile of |w| (parameter-golf's baseline value): one outlier must not set the scale."""


def _brotli() -> Any:
    return importlib.import_module("brotli")


def _zstd() -> Any:
    return importlib.import_module("zstandard")


COMPRESSORS: dict[str, tuple[Callable[[bytes, int], bytes], Callable[[bytes], bytes]]] = {
    "zlib": (lambda data, level: zlib.compress(data, level), zlib.decompress),
    "lzma": (lambda data, level: lzma.compress(data, preset=level), lzma.decompress),
    "brotli": (lambda data, level: _brotli().compress(data, quality=level), lambda blob: _brotli().decompress(blob)),
    "zstd": (
        lambda data, level: _zstd().ZstdCompressor(level=level).compress(data),
        lambda blob: _zstd().ZstdDecompressor().decompress(blob),
    ),
}
STREAMS: dict[str, tuple[Callable[[int], Any], Callable[[int], bool]]] = {
    "zlib": (lambda level: zlib.compressobj(level), lambda level: level >= 1),
    "lzma": (lambda level: lzma.LZMACompressor(preset=level), lambda level: True),
    "brotli": (lambda level: _brotli().Compressor(quality=level), lambda level: level >= 10),
}
"""Streaming compressors (make(level), and at which levels its output equals COMPRESSORS' one-shot call byte for
byte). zlib's level 0 cuts its stored blocks where the input chunks end; brotli below quality 10 adapts to how much
input it was handed at once (other bytes with 64 KB chunks at qualities 1-9); zstd's one-shot frame records the
content size a stream does not know. Those compress in one call, with a line before and after."""
CHUNK_BYTES = 1 << 20
"""Bytes fed to a streaming compressor at a time: a progress tick after each."""


@dataclass(frozen=True)
class Artifact:
    blob: bytes
    """Compressed quantized state dict."""
    code_bytes: int
    """Raw UTF-8 bytes of the code a submission needs (speedrun.finishing.artifact.CODE_FILES), uncompressed."""

    @property
    def total_bytes(self) -> int:
        return len(self.blob) + self.code_bytes


def quantize_state_dict(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    packed: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        t = tensor.detach().to("cpu")
        if not t.is_floating_point():
            packed[name] = {"raw": t}
        elif t.ndim == 2 and t.numel() > KEEP_FLOAT_MAX_NUMEL:
            w = t.float()
            clip = torch.quantile(w.abs(), CLIP_QUANTILE, dim=1, keepdim=True).clamp_min(1e-8)
            scale = clip / 127.0
            q = torch.clamp(torch.round(w.clamp(-clip, clip) / scale), -127, 127).to(torch.int8)
            packed[name] = {"q": q, "scale": scale.squeeze(1).to(torch.float16)}
        elif t.numel() <= 64:
            packed[name] = {"raw": t.float()}  # gains and mixing scalars: precision matters, size does not
        else:
            packed[name] = {"half": t.to(torch.float16)}
    return packed


def dequantize_state_dict(packed: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    state = {}
    for name, entry in packed.items():
        if "q" in entry:
            state[name] = entry["q"].float() * entry["scale"].float().unsqueeze(1)
        elif "half" in entry:
            state[name] = entry["half"].float()
        else:
            state[name] = entry["raw"]
    return state


def compress(
    data: bytes,
    compressor: str,
    level: int,
    log: Callable[[str], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    progress_every: float = 30.0,
) -> bytes:
    """``data`` compressed: the same bytes as the compressor's one-shot call, with ``log`` a line before, progress
    at most every ``progress_every`` seconds where the compressor streams identically (STREAMS), and one after."""
    check_compressor(compressor, level)
    name = f"{compressor}-{level}"
    if log is not None:
        log(f"compressing {len(data) / 1e6:,.1f} MB with {name} ...")
    t0 = time.perf_counter()
    stream = STREAMS.get(compressor)
    if stream is not None and stream[1](level):
        progress = Progress(f"compress ({name})", log, unit="MB", every=progress_every)
        comp, parts = stream[0](level), []
        feed, finish = (comp.process, comp.finish) if compressor == "brotli" else (comp.compress, comp.flush)
        view = memoryview(data)
        for start in range(0, len(data), chunk_bytes):
            parts.append(feed(view[start : start + chunk_bytes]))
            progress.tick(min(start + chunk_bytes, len(data)) / 1e6, len(data) / 1e6)
        parts.append(finish())
        blob = b"".join(parts)
    else:
        blob = COMPRESSORS[compressor][0](data, level)
    if log is not None:
        log(f"compressed to {len(blob) / 1e6:,.2f} MB with {name} in {time.perf_counter() - t0:.1f}s")
    return blob


def decompress(blob: bytes, compressor: str) -> bytes:
    if compressor not in COMPRESSORS:
        raise ValueError(f"quant.compressor={compressor}: unknown; choose one of {', '.join(COMPRESSORS)}")
    if compressor in MODULES and importlib.util.find_spec(MODULES[compressor]) is None:
        raise ValueError(f"reading a {compressor} artifact needs the '{MODULES[compressor]}' package: {COMPRESS_EXTRA}")
    return COMPRESSORS[compressor][1](blob)


def export(
    state: dict[str, torch.Tensor], compressor: str, level: int, log: Callable[[str], None] | None = None
) -> Artifact:
    """quant=int8: quantize, serialize, compress."""
    return export_packed(quantize_state_dict(state), compressor, level, log)


def export_packed(
    packed: dict[str, dict[str, torch.Tensor]], compressor: str, level: int, log: Callable[[str], None] | None = None
) -> Artifact:
    buf = io.BytesIO()
    torch.save(packed, buf)
    from speedrun.finishing.artifact import code_bytes

    return Artifact(blob=compress(buf.getvalue(), compressor, level, log), code_bytes=code_bytes())


def load_artifact(blob: bytes, compressor: str) -> dict[str, torch.Tensor]:
    packed = torch.load(io.BytesIO(decompress(blob, compressor)), map_location="cpu", weights_only=True)
    return dequantize_state_dict(packed)


# ---------------------------------------------------------------------------------------------------------
# int6: GPTQ with Hessians from training batches


def gptq_layers(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The linear layers GPTQ quantizes, by state-dict weight name: every nn.Linear inside the blocks, and the
    untied lm_head. (A tied head is the embedding: it gets round-to-nearest at embed_bits instead.)"""
    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and (name.startswith("blocks.") or name == "lm_head"):
            layers[f"{name}.weight"] = module
    return layers


@torch.no_grad()
def collect_hessians(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    n_batches: int,
    *,
    device: str,
    autocast_dtype: torch.dtype | None = None,
    progress: Progress | None = None,
) -> dict[str, torch.Tensor]:
    """H = X^T X / n (fp32, on ``device``) of the inputs of every GPTQ layer over ``n_batches`` (x, y) batches
    (``progress`` ticked after each).

    Pass a fresh *training* stream: GPTQ fits the weights to these activations, so validation data here would
    leak into the score. Forward hooks on the eager model; the model is left unchanged.
    """
    if n_batches < 1:
        raise ValueError(f"quant.calib_batches must be >= 1, got {n_batches}")
    layers = gptq_layers(model)
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(name: str) -> Callable[..., None]:
        def accumulate(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].size(-1)).float()
            if name not in sums:
                sums[name] = torch.zeros(x.size(1), x.size(1), dtype=torch.float32, device=x.device)
                counts[name] = 0
            sums[name].addmm_(x.T, x)
            counts[name] += x.size(0)

        return accumulate

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in layers.items()]
    was_training = model.training
    model.eval()
    try:
        iterator: Iterator = iter(batches)
        for done in range(1, n_batches + 1):
            x, y = next(iterator)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if autocast_dtype is not None:
                with torch.autocast(device, dtype=autocast_dtype):
                    model(x, y)
            else:
                model(x, y)
            if progress is not None:
                progress.tick(done, n_batches)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {name: sums[name] / counts[name] for name in sums}


def qmax_of(bits: int) -> int:
    if not 2 <= bits <= 8:
        raise ValueError(f"quantization bits must be in 2..8 (stored in int8), got {bits}")
    return 2 ** (bits - 1) - 1


def search_scales(w: torch.Tensor, importance: torch.Tensor, qmax: int, clip_ratios: Sequence[float]) -> torch.Tensor:
    """Per-row fp16 scales: for each row the clip (ratio x row absmax) whose round-to-nearest error, weighted
    per column by ``importance`` (the Hessian diagonal; ones for embeddings), is least. Returns (rows,) fp16."""
    if not clip_ratios or any(not 0 < r <= 1 for r in clip_ratios):
        raise ValueError(f"quant.clip_ratios must be a non-empty list of fractions in (0, 1], got {list(clip_ratios)}")
    w = w.float()
    absmax = w.abs().amax(dim=1).clamp_min(1e-8)
    best_err = torch.full_like(absmax, float("inf"))
    best = torch.zeros_like(absmax)
    for ratio in clip_ratios:
        scale = (ratio * absmax / qmax).half().float().clamp_min(1e-8)  # as stored: fp16
        q = torch.clamp(torch.round(w / scale[:, None]), -qmax, qmax)
        err = ((w - q * scale[:, None]).square() * importance[None, :]).sum(dim=1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, scale, best)
    return best.half()


def quantize_rtn(
    w: torch.Tensor, bits: int, clip_ratios: Sequence[float] = (1.0,)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest per row with the clip search (uniform importance) -> (int8 values, fp16 scales)."""
    qmax = qmax_of(bits)
    w = w.float()
    scale = search_scales(w, torch.ones(w.size(1), device=w.device), qmax, clip_ratios)
    q = torch.clamp(torch.round(w / scale.float()[:, None]), -qmax, qmax).to(torch.int8)
    return q, scale


def quantize_gptq(
    w: torch.Tensor,
    hessian: torch.Tensor,
    *,
    bits: int,
    damp: float = 0.01,
    block_size: int = 128,
    clip_ratios: Sequence[float] = (1.0,),
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ of one (out, in) weight given H = X^T X / n of its inputs -> (int8 values, fp16 per-row scales).

    Minimises ||X (W - Q)^T|| column by column: round a column, divide its error by the pivot of the upper
    Cholesky factor U of H^-1 and subtract error x U[row] from the columns to its right (within a block at
    once, then for the rest of the matrix in one matmul per block). Columns go in decreasing H diagonal
    ("act order"), so the most-used inputs are rounded first, while every later column can still compensate.
    """
    qmax = qmax_of(bits)
    if block_size < 1:
        raise ValueError(f"quant.block_size must be >= 1, got {block_size}")
    W = w.detach().float().clone()
    H = hessian.detach().to(device=W.device, dtype=torch.float64).clone()
    rows, cols = W.shape
    if H.shape != (cols, cols):
        raise ValueError(f"Hessian shape {tuple(H.shape)} does not match weight {tuple(W.shape)}")
    dead = torch.diagonal(H) == 0  # inputs that never fired: their weights cannot matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    scale = search_scales(W, torch.diagonal(H).float(), qmax, clip_ratios)
    s = scale.float()[:, None]
    H.diagonal().add_(damp * torch.diagonal(H).mean())
    perm = torch.argsort(torch.diagonal(H), descending=True)
    W = W[:, perm]
    H = H[perm][:, perm]
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True).float()
    Q = torch.zeros(rows, cols, dtype=torch.int8, device=W.device)
    for i1 in range(0, cols, block_size):
        i2 = min(cols, i1 + block_size)
        Wb = W[:, i1:i2].clone()
        Ub = U[i1:i2, i1:i2]
        Err = torch.zeros(rows, i2 - i1, device=W.device)
        for j in range(i2 - i1):
            col = Wb[:, j : j + 1]
            q = torch.clamp(torch.round(col / s), -qmax, qmax)
            Q[:, i1 + j] = q[:, 0].to(torch.int8)
            err = (col - q * s) / Ub[j, j]
            Wb[:, j:] -= err * Ub[j : j + 1, j:]
            Err[:, j : j + 1] = err
        if i2 < cols:
            W[:, i2:] -= Err @ U[i1:i2, i2:]
    return Q[:, torch.argsort(perm)].contiguous(), scale


def quantize_state_dict_gptq(
    state: dict[str, torch.Tensor],
    hessians: dict[str, torch.Tensor],
    *,
    bits: int,
    embed_bits: int,
    damp: float,
    block_size: int,
    clip_ratios: Sequence[float],
    progress: Progress | None = None,
) -> dict[str, dict[str, torch.Tensor]]:
    """quant=int6: GPTQ for the layers in ``hessians``, clip-searched round-to-nearest at embed_bits for the
    embedding (and an lm_head without a Hessian), the int8 export's rules for everything else. ``progress`` is
    ticked after each GPTQ matrix."""
    packed: dict[str, dict[str, torch.Tensor]] = {}
    rest: dict[str, torch.Tensor] = {}
    done = 0
    for name, tensor in state.items():
        if name in hessians:
            H = hessians[name]
            q, scale = quantize_gptq(
                tensor.to(H.device), H, bits=bits, damp=damp, block_size=block_size, clip_ratios=clip_ratios
            )
            packed[name] = {"q": q.cpu(), "scale": scale.cpu()}
            done += 1
            if progress is not None:
                progress.tick(done, len(hessians))
        elif name in ("tok_emb.weight", "lm_head.weight") and tensor.is_floating_point():
            q, scale = quantize_rtn(tensor.detach(), embed_bits, clip_ratios)
            packed[name] = {"q": q.cpu(), "scale": scale.cpu()}
        else:
            rest[name] = tensor
    for name, entry in quantize_state_dict(rest).items():
        if "q" in entry:  # a large 2-D tensor GPTQ did not see (none in our GPT): per-row at embed_bits
            q, scale = quantize_rtn(rest[name].detach(), embed_bits, clip_ratios)
            entry = {"q": q.cpu(), "scale": scale.cpu()}
        packed[name] = entry
    return {name: packed[name] for name in state}  # state-dict order
