"""Score-first test-time training (TTT): per-document LoRA adapters trained on the validation stream as it
is scored, never on a token before that token has been scored.

For each document (BOS-delimited; document d owns the targets after its BOS up to and including the next BOS,
so the documents' targets are exactly positions 1..M of the stream, as in the standard eval):

    adapters <- fresh (B = 0, A = a fixed seeded init: the model starts as the base model)
    for each chunk of the document's targets, in order:
        score the chunk with the current adapters   (adds to the val_bpb_ttt sums)
        one Adam step on that chunk's mean loss      (skipped after the last chunk)

A chunk is scored from a window of at most model.seq_len tokens of its own document that ends at the chunk's
last target, so no token attends across BOS and no score can depend on a later token: the adapters that score
chunk k have been trained on chunks 0..k-1 only (tests/test_ttt.py proves it by changing later tokens).

Chunk size: ``ttt.chunk_size``, or for short documents the schedule ``ttt.short_chunks`` = "LEN:CHUNK,...":
a document with at most LEN scored tokens uses CHUNK, the first LEN (ascending) that fits; longer documents
use chunk_size. This is parameter-golf's TTT_SHORT_SCORE_FIRST_STEPS (PR #2014: "256:8,2000:24" with a
default chunk of 48): a chunk *size* per document-length bucket, not a number of chunks; there the bucket is
chosen by the longest document of a batch, here per document (batches never mix chunk sizes).

Adapters: rank-r LoRA (delta W = B A, B zero-initialised) on the block linears named by ``ttt.targets``
(q, k, v, o = attn.c_q/c_k/c_v/proj; up, down = mlp.fc/mlp.proj; presets all, no_qv, qkvo, qv). They are
attached by swapping those nn.Linear modules in a deep copy of the model for wrappers, so model.py is not
touched. The output head cannot get one: the GPT computes logits with F.linear on the head's weight rather
than by calling a module. Documents of a batch have independent adapters (batched A, B); the loss is a sum of
per-document terms and Adam is elementwise, so a document's adapter sees only its own gradients.

Baseline: every chunk is also scored by the base model with no adaptation, in the same pass and from the same
window (``val_bpb_ttt_base``), so ``val_bpb_ttt_base - val_bpb_ttt`` is what adaptation bought, apart from what
the document-local windows alone change against the plain eval. A chunk 0 costs nothing extra (its adapters are
fresh, B = 0, so its adapted score is the base score); every later chunk costs one more forward without grad.

Budget: ``ttt.max_seconds`` is checked before every chunk step; when it is spent TTT stops there and reports
what it scored (tokens_scored, fraction). Batches run in a seeded random order, so a partial run scores an
unbiased sample of documents rather than the shortest or longest.

Ranks (``shard``, a speedrun.distributed.world.World): the shuffled batches are dealt round-robin, each rank adapts and scores
its own (a batch's result does not depend on the others': fresh adapters and optimizer per batch), under its own
``max_seconds``, and the sums are all-reduced; seconds is the slowest rank's.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from speedrun.config.specs import parse_short_chunks, parse_targets
from speedrun.data.bpb import ByteLUTs, token_bytes
from speedrun.progress import Progress

TARGETS = {
    "q": ("attn", "c_q"),
    "k": ("attn", "c_k"),
    "v": ("attn", "c_v"),
    "o": ("attn", "proj"),
    "up": ("mlp", "fc"),
    "down": ("mlp", "proj"),
}
"""Adapter target -> (submodule of a block, attribute): blocks.N.attn.c_q etc."""


def chunk_size_for(n_targets: int, chunk_size: int, short_chunks: list[tuple[int, int]]) -> int:
    """The chunk size of a document with n_targets scored tokens."""
    for length, chunk in short_chunks:
        if n_targets <= length:
            return chunk
    return chunk_size


def split_documents(tokens: torch.Tensor, bos_id: int) -> list[tuple[int, int]]:
    """(start, n_targets) per document of a 1-D stream: a document starts at a BOS (or at 0 for a leading
    fragment) and owns the targets start+1 .. next BOS (inclusive; the stream's end for the last one)."""
    n = tokens.numel()
    starts = (tokens == bos_id).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0] + starts
    ends = starts[1:] + [n - 1]
    docs = [(s, e - s) for s, e in zip(starts, ends) if e > s]
    assert sum(d[1] for d in docs) == n - 1
    return docs


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus one low-rank delta per batch row: y = base(x) + (x A^T) B^T, with A of shape
    (slots, rank, in) and B (slots, out, rank): row i of a batch of b <= slots rows uses slot i."""

    def __init__(self, base: nn.Linear, rows: int, rank: int):
        super().__init__()
        self.base = base
        device = base.weight.device
        self.A = nn.Parameter(torch.zeros(rows, rank, base.in_features, device=device))
        self.B = nn.Parameter(torch.zeros(rows, base.out_features, rank, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        A, B = self.A[: x.size(0)], self.B[: x.size(0)]
        delta = torch.bmm(torch.bmm(x, A.transpose(1, 2).to(x.dtype)), B.transpose(1, 2).to(x.dtype))
        return y + delta.to(y.dtype)


class LoRAModel:
    """A deep copy of the GPT, frozen, with LoRALinear in place of the targeted block linears."""

    def __init__(self, model: nn.Module, targets: tuple[str, ...], rank: int, slots: int, seed: int):
        # a model of the registry's contract (model/protocol.py): its blocks and their linears are looked up by name
        self.model: Any = cast(Any, copy.deepcopy(model))
        self.model.eval()  # our GPT has no dropout; eval() also keeps fp8 linears on their bf16 path
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.layers: list[LoRALinear] = []
        for block in self.model.blocks:
            for t in targets:
                parent_name, attr = TARGETS[t]
                parent = getattr(block, parent_name)
                layer = LoRALinear(getattr(parent, attr), slots, rank)
                setattr(parent, attr, layer)
                self.layers.append(layer)
        # One A init (kaiming-uniform, seeded) shared by every document, so a document's result does not depend
        # on which batch or slot it lands in.
        gen = torch.Generator().manual_seed(seed)
        self.a_init = [
            torch.empty(layer.A.shape[1:]).uniform_(-1, 1, generator=gen) / math.sqrt(layer.A.shape[2])
            for layer in self.layers
        ]

    def parameters(self) -> list[nn.Parameter]:
        return [p for layer in self.layers for p in (layer.A, layer.B)]

    @torch.no_grad()
    def reset(self) -> None:
        """Fresh adapters for every slot: A = the shared init, B = 0 (the model is the base model again)."""
        for layer, a in zip(self.layers, self.a_init):
            layer.A.copy_(a.to(layer.A.device).expand_as(layer.A))
            layer.B.zero_()


@dataclass
class TTTResult:
    val_loss: float | None
    """Mean nats per scored token (None if nothing was scored)."""
    val_bpb: float | None
    base_val_loss: float | None
    """The same chunks and windows scored by the model with no adaptation (None if not asked for)."""
    base_val_bpb: float | None
    tokens_scored: int
    tokens_total: int
    bytes: int
    docs_done: int
    docs_total: int
    seconds: float
    complete: bool
    """False when ttt.max_seconds stopped it before every token was scored."""
    chunks: list[tuple[int, int, float, int]] = field(default_factory=list)
    """(document index, chunk index, sum of nats, tokens) per scored chunk, when asked for (tests)."""

    @property
    def fraction(self) -> float:
        return self.tokens_scored / self.tokens_total if self.tokens_total else 0.0


@dataclass(frozen=True)
class LoRASettings:
    """How the adapters learn: what ``ttt.*`` resolves to (rank, learning rate, chunks, targets, optimizer)."""

    rank: int
    lr: float
    chunk_size: int
    short_chunks: str = ""
    """Short documents' chunk schedule, "LEN:CHUNK,..." (config.specs.parse_short_chunks); "" = off."""
    targets: str = "all"
    batch_size: int = 1
    """Documents adapted side by side, each with its own adapters."""
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.0
    max_seconds: float | None = None
    """Stop after the chunk that passes this many seconds (the rest unscored, recorded as the fraction scored)."""
    seed: int = 0
    score_base: bool = True
    """Also score each chunk with the unadapted model (base_val_loss, base_val_bpb)."""


def ttt_evaluate(
    model: nn.Module,
    val_tokens: torch.Tensor,
    luts: ByteLUTs,
    settings: LoRASettings,
    *,
    bos_id: int,
    seq_len: int,
    device: str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    log: Callable[[str], None] | None = None,
    shard: Any | None = None,
    record_chunks: bool = False,
) -> TTTResult:
    """Score val_tokens with score-first LoRA TTT (see the module doc), learning as ``settings`` say. ``model`` is
    not modified. ``log`` also gets a progress line at most every 30 s (this rank's tokens scored of its share);
    ``shard`` (a World) splits the documents over the ranks."""
    rank, lr, chunk_size, short_chunks, targets = (
        settings.rank,
        settings.lr,
        settings.chunk_size,
        settings.short_chunks,
        settings.targets,
    )
    batch_size, beta1, beta2, weight_decay = settings.batch_size, settings.beta1, settings.beta2, settings.weight_decay
    max_seconds, seed, score_base = settings.max_seconds, settings.seed, settings.score_base
    steps = parse_short_chunks(short_chunks)
    target_names = parse_targets(targets)
    for size in [chunk_size] + [c for _, c in steps]:
        if not 1 <= size <= seq_len:
            raise ValueError(f"TTT chunk sizes must be in [1, seq_len={seq_len}], got {size}")
    if batch_size < 1:
        raise ValueError(f"ttt.batch_size must be >= 1, got {batch_size}")
    t0 = time.perf_counter()
    docs = split_documents(val_tokens, bos_id)
    order = sorted(range(len(docs)), key=lambda i: docs[i][1])  # similar lengths side by side
    batches: list[list[int]] = []
    for i in order:
        c = chunk_size_for(docs[i][1], chunk_size, steps)
        if (
            batches
            and len(batches[-1]) < batch_size
            and chunk_size_for(docs[batches[-1][0]][1], chunk_size, steps) == c
        ):
            batches[-1].append(i)
        else:
            batches.append([i])
    random.Random(seed).shuffle(batches)
    if shard is not None:
        batches = batches[shard.rank :: shard.world_size]
    share = sum(docs[i][1] for batch in batches for i in batch)
    progress = Progress("ttt", log) if log is not None else None

    lora = LoRAModel(model, target_names, rank, min(batch_size, len(docs)), seed)
    luts = luts.to(device)
    tokens = val_tokens.to(device)
    state = _Sums(device)
    result_chunks: list[tuple[int, int, float, int]] = []
    docs_done, stopped = 0, False
    for batch in batches:
        c = chunk_size_for(docs[batch[0]][1], chunk_size, steps)
        stopped = _adapt_batch(
            lora,
            [docs[i] for i in batch],
            batch,
            c,
            tokens,
            luts,
            state,
            seq_len=seq_len,
            lr=lr,
            betas=(beta1, beta2),
            weight_decay=weight_decay,
            device=device,
            autocast_dtype=autocast_dtype,
            deadline=None if max_seconds is None else t0 + max_seconds,
            chunk_log=result_chunks if record_chunks else None,
            base=model if score_base else None,
            progress=progress,
            share=share,
        )
        if stopped:
            break
        docs_done += len(batch)
    if shard is not None:
        counts = torch.tensor([state.tokens, docs_done], dtype=torch.int64, device=device)
        shard.sum_(state.nats), shard.sum_(state.bytes), shard.sum_(state.base_nats), shard.sum_(counts)
        state.tokens, docs_done = (int(v) for v in counts.tolist())
        stopped = bool(shard.max(1.0 if stopped else 0.0))
    seconds = time.perf_counter() - t0 if shard is None else shard.max(time.perf_counter() - t0)
    nats, n_bytes, n_tokens = state.totals()
    base_nats = float(state.base_nats.item()) if score_base else None
    total = val_tokens.numel() - 1
    if stopped and log:
        log(f"ttt: max_seconds={max_seconds:g} reached after {seconds:.1f} s; scored {n_tokens:,} of {total:,} tokens")
    return TTTResult(
        val_loss=nats / n_tokens if n_tokens else None,
        val_bpb=nats / math.log(2) / n_bytes if n_bytes else None,
        base_val_loss=base_nats / n_tokens if base_nats is not None and n_tokens else None,
        base_val_bpb=base_nats / math.log(2) / n_bytes if base_nats is not None and n_bytes else None,
        tokens_scored=n_tokens,
        tokens_total=total,
        bytes=n_bytes,
        docs_done=docs_done,
        docs_total=len(docs),
        seconds=seconds,
        complete=n_tokens == total,
        chunks=result_chunks,
    )


class _Sums:
    def __init__(self, device: str):
        self.nats = torch.zeros((), dtype=torch.float64, device=device)
        self.base_nats = torch.zeros((), dtype=torch.float64, device=device)
        self.bytes = torch.zeros((), dtype=torch.int64, device=device)
        self.tokens = 0

    def totals(self) -> tuple[float, int, int]:
        return float(self.nats.item()), int(self.bytes.item()), self.tokens


def _width(n: int, seq_len: int) -> int:
    """Pad window widths to a power of two (>= 64, at most seq_len): a handful of shapes for the whole run,
    so kernels that compile or plan per shape (flex, cuDNN) do so a few times, not once per chunk."""
    return min(seq_len, max(64, 1 << max(0, n - 1).bit_length()))


def _nats(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: str, autocast_dtype: torch.dtype | None
) -> torch.Tensor:
    if autocast_dtype is None:
        return model(x, y, reduction="none")
    with torch.autocast(device, dtype=autocast_dtype):
        return model(x, y, reduction="none")


def _adapt_batch(
    lora: LoRAModel,
    docs: list[tuple[int, int]],
    doc_ids: list[int],
    chunk: int,
    tokens: torch.Tensor,
    luts: ByteLUTs,
    sums: _Sums,
    *,
    seq_len: int,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    device: str,
    autocast_dtype: torch.dtype | None,
    deadline: float | None,
    chunk_log: list | None,
    base: nn.Module | None = None,
    progress: Progress | None = None,
    share: int = 0,
) -> bool:
    """Score-first TTT of one batch of documents (all with chunk size ``chunk``). True if the deadline hit.

    Every step runs one row per document of the batch at one padded width (documents that are done are all
    padding: unscored, untrained), so the shapes stay few: the batch size (smaller only for a last, short
    batch) times a handful of widths."""
    lora.reset()
    opt = torch.optim.AdamW(lora.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)
    n_chunks = [math.ceil(n / chunk) for _, n in docs]
    rows = len(docs)
    last = tokens.numel() - 1
    for k in range(max(n_chunks)):
        if deadline is not None and time.perf_counter() > deadline:
            return True
        # per slot: inputs [lo, hi) of its document (relative to the document start), scored from offset `first`
        begin, length, first, train = [0] * rows, [0] * rows, [0] * rows, [0.0] * rows
        for i, ((start, n), nc) in enumerate(zip(docs, n_chunks)):
            if k < nc:
                hi = min((k + 1) * chunk, n)
                lo = max(0, hi - seq_len)
                begin[i], length[i], first[i] = start + lo, hi - lo, k * chunk - lo
                train[i] = 1.0 if k < nc - 1 else 0.0  # no update after a document's last chunk
        width = _width(max(length), seq_len)
        cols = torch.arange(width, device=device)
        idx = torch.tensor(begin, device=device)[:, None] + cols[None, :]
        valid = cols[None, :] < torch.tensor(length, device=device)[:, None]
        x = torch.where(valid, tokens[idx.clamp(max=last - 1)], 0)
        y = torch.where(valid, tokens[(idx + 1).clamp(max=last)], 0)
        scored = valid & (cols[None, :] >= torch.tensor(first, device=device)[:, None])
        weights = torch.tensor(train, device=device)
        training = any(train)
        with torch.set_grad_enabled(training):
            nats = _nats(lora.model, x, y, device, autocast_dtype)
        with torch.no_grad():  # the score: before this chunk's update
            chunk_nats = torch.where(scored, nats.detach().double(), 0.0)
            sums.nats += chunk_nats.sum()
            if base is not None:  # chunk 0: fresh adapters (B = 0) add exactly nothing, so it is the base score
                base_nats = nats.detach() if k == 0 else _nats(base, x, y, device, autocast_dtype)
                sums.base_nats += torch.where(scored, base_nats.double(), 0.0).sum()
            sums.bytes += torch.where(scored, token_bytes(x, y, luts), 0).sum()
            counts = scored.sum(dim=1)
            sums.tokens += int(counts.sum().item())
            if progress is not None:  # after each chunk: one long document's batch can take minutes
                progress.tick(sums.tokens, share)
            if chunk_log is not None:
                for i, (d_nats, d_count) in enumerate(zip(chunk_nats.sum(dim=1).tolist(), counts.tolist())):
                    if d_count:
                        chunk_log.append((doc_ids[i], k, d_nats, d_count))
        if training:  # then one step on the chunk just scored: it can only change later chunks' scores
            per_doc = (nats * scored).sum(dim=1) / counts.clamp_min(1)
            opt.zero_grad(set_to_none=True)
            (per_doc * weights).sum().backward()
            opt.step()
    return False
