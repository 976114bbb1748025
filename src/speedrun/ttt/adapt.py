"""Score-first TTT of one batch of documents: each chunk scored with the adapters as the earlier chunks left them,
then one step on it; and warm_start_a's chains of A from batch to batch."""

from __future__ import annotations

import time

import torch

from speedrun.progress import Progress
from speedrun.ttt.graphs import TokenScoresHook, token_scores
from speedrun.ttt.lora import LoRAModel
from speedrun.ttt.optim import AdapterOptimizer
from speedrun.ttt.result import ScoredChunk, Sums
from speedrun.ttt.settings import LoRASettings
from speedrun.ttt.steps import Stepper, batch_steps, longest_first


def adapt_batch(
    lora: LoRAModel,
    opt: AdapterOptimizer,
    docs: list[tuple[int, int]],
    doc_ids: list[int],
    chunk: int,
    sums: Sums,
    stepper: Stepper,
    *,
    settings: LoRASettings,
    seq_len: int,
    deadline: float | None,
    chunk_log: list[ScoredChunk] | None,
    progress: Progress | None = None,
    share: int = 0,
    batch_index: int = 0,
    on_token_scores: TokenScoresHook | None = None,
) -> bool:
    """Score-first TTT of one batch of documents (all with chunk size ``chunk``). True if the deadline hit.

    The documents take the adapter slots longest first, so at every step the documents not yet done are the first
    rows. Eager, a step runs one row per document of the batch at one padded width (documents that are done are all
    padding: unscored, untrained), so the shapes stay few: the batch size (smaller only for a last, short batch)
    times a handful of widths. Compiled (dynamic shapes: any row count of at least 2 runs on the warm-up's graphs),
    a step runs only the rows still going, at least 2: a batch's long tail, one long document and many done, no
    longer costs a full batch of padding per step. With CUDA graphs, that row count padded to a power of two. The
    documents that are done would get zero gradients either way; the optimizer (speedrun.ttt.optim) steps
    the rows' slots only where that leaves the adapters as a step of every slot would (Adam with beta1 = 0). The
    unadapted scores of the batch's chunks (val_bpb_ttt_base) come from speedrun.ttt.base_scores, each counted
    when its chunk is scored. The time budget is checked before every step but the first: a batch begun scores at
    least its chunks 0."""
    if deadline is not None and time.perf_counter() > deadline:
        return True
    lora.reset(keep_a=settings.warm_start_a)
    opt.begin()
    try:
        order = longest_first(docs, chunk)
        docs, doc_ids = [docs[i] for i in order], [doc_ids[i] for i in order]
        base = stepper.base_scores(docs, chunk, seq_len)
        for k, table, width, training in batch_steps(
            docs, chunk, seq_len, stepper.mode, stepper.slots, stepper.widths, stepper.half_rows
        ):
            if k > 0 and deadline is not None and time.perf_counter() > deadline:  # a batch begun scores its chunk 0
                return True
            if training and stepper.graphs is None:
                opt.zero_grad()  # a graphed step writes its gradients (or steps) itself
            out = stepper.step(table, (len(table[0]), width, training))
            if on_token_scores is not None:  # before the update below, and before a graph's next replay
                on_token_scores(*token_scores(torch.tensor(table, dtype=torch.int64), out))
            sums.nats += out.row_nats.sum()
            if base is not None:  # the chunks scored now: the documents still going, the first rows
                sums.base_nats += base.chunk(k)[: sum(1 for n in table[1] if n)].sum()
            sums.bytes += out.n_bytes
            sums.tokens += sum(max(0, n - f) for n, f in zip(table[1], table[2]))  # counted on the host: no sync
            if progress is not None:  # after each chunk: one long document's batch can take minutes
                progress.tick(sums.tokens, share)
            if chunk_log is not None:
                for i, (d_nats, d_count) in enumerate(zip(out.row_nats.tolist(), out.counts.tolist())):
                    if d_count:
                        chunk_log.append(ScoredChunk(batch_index, k, doc_ids[i], d_nats, d_count))
            if training and out.updated is not None:  # the step took its update itself (in its CUDA graph)
                opt.stepped(len(table[0]), out.updated)
            elif training:  # the step on the chunk just scored: it can only change later chunks' scores
                opt.step(len(table[0]))
    finally:
        opt.finish()  # the adapters as every step left them (warm_start_a carries A on)
    return False


class ChainsOfA:
    """warm_start_a's chains (speedrun.ttt.documents.deal_batches): a batch starts from the A that the previous
    batch of its chain left, or from the seeded draw for a chain's first batch and again after a global phase. The
    rank keeps a copy of every adapter's A per chain it runs."""

    def __init__(self, lora: LoRAModel, on: bool):
        self.lora, self.on = lora, on
        self.saved: dict[int, list[torch.Tensor]] = {}

    def enter(self, chain: int) -> None:
        if not self.on:
            return
        state = self.saved.get(chain)
        if state is None:
            self.lora.reset(keep_a=False)
        else:
            self.lora.load_a(state)

    def leave(self, chain: int) -> None:
        if self.on:
            self.saved[chain] = self.lora.a_state()

    def restart(self) -> None:
        self.saved.clear()
