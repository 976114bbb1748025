"""The TTT tests' model, settings and stand-ins: the tiny GPT they adapt (ttt_gpt), ttt_evaluate with their usual
settings (run), the score-first settings (CONFIGS) and RecordingGraphs, which stands in for CUDA graphs on a CPU."""

from __future__ import annotations

import dataclasses

import torch

from speedrun.core.ttt_graphs import StepKey, StepOut, store_rows_grads
from speedrun.core.ttt_lora import GlobalSettings, TTTSettings
from speedrun.core.ttt_score import ttt_evaluate
from support.tiny import BOS, TTT_TINY, byte_luts, tiny_gpt

CHUNK = 8
PHASED = GlobalSettings(phases=2, prefix_docs=4, lr=0.05, momentum=0.5, chunk_tokens=40, batch_seqs=3)
CONFIGS = {
    # per-document adapters only: a document's scores depend on nothing but its own earlier tokens
    "lora": TTTSettings(rank=4, lr=0.05, chunk_size=CHUNK, batch_size=2, score_base=False),
    # the model fine-tuned after batches 0 and 1 (4 documents, 2 phases), adapters on the head and beside sublayers
    "phased": TTTSettings(
        rank=4, lr=0.05, chunk_size=CHUNK, batch_size=2, targets="q,v,head,attn_bypass,mlp_bypass", alpha=8.0,
        optimizer="sgd", momentum=0.9, phased=PHASED, score_base=False,
    ),
    # A carried from batch to batch, with the records' adapters and Adam (beta1 0, weight decay): and phases
    "warm": TTTSettings(
        rank=4, lr=0.05, chunk_size=CHUNK, batch_size=2, targets="record", alpha=8.0, warm_start_a=True,
        beta1=0.0, beta2=0.999, eps=1e-10, weight_decay=1.0, phased=PHASED, score_base=False,
    ),
}  # fmt: skip
"""Score-first TTT's settings, by what they carry across documents."""

LORA_KEYS = {f.name for f in dataclasses.fields(TTTSettings)}
KW = dict(bos_id=BOS, seq_len=TTT_TINY.seq_len, rank=4, lr=0.05, chunk_size=8, targets="all", seed=0)


def ttt_gpt(seed: int = 0, tied: bool = True):
    """TTT_TINY (its embeddings untied: ``tied=False``) off its init, the model TTT adapts in these tests."""
    return tiny_gpt(TTT_TINY if tied else dataclasses.replace(TTT_TINY, tie_embeddings=False), seed=seed)


def run(m, tokens, **kw):
    """ttt_evaluate with KW and ``kw``: the LoRA settings' keys become its TTTSettings, the rest stay keywords."""
    kw = {**KW, **kw, "record_chunks": True}
    settings = TTTSettings(**{k: kw.pop(k) for k in list(kw) if k in LORA_KEYS})
    return ttt_evaluate(m, tokens, byte_luts(), settings, **kw)


class RecordingGraphs:
    """Stands in for GraphedChunkSteps on a CPU: runs each step directly, as a replay would (the step steps the rows'
    slots optimizer itself, or writes the gradients of its rows' slots into .grad, which no optimizer zeroes), and
    counts the shapes that prepare() did not announce."""

    instances: list[RecordingGraphs] = []

    def __init__(self, run_step, params, device, update=None):
        self.run_step, self.params, self.update = run_step, params, update
        self.graphs: dict[StepKey, None] = {}
        self.grads: list[torch.Tensor] = []
        self.late = 0
        self.used: set[StepKey] = set()
        RecordingGraphs.instances.append(self)

    def prepare(self, keys, dummy_rows):
        for key in keys:
            rows = dummy_rows(key)
            assert tuple(rows.shape) == (4, key[0])
            self.graphs[key] = None

    def step(self, rows: torch.Tensor, key: StepKey) -> StepOut:
        self.used.add(key)
        if key not in self.graphs:
            self.late += 1
            self.graphs[key] = None
        if self.update is not None:  # the optimizer's update is part of the step: no gradient is left in .grad
            out = self.run_step(rows, key, self.update.apply if key[2] else None)
            assert all(p.grad is None for p in self.params) and (out.updated is not None) == key[2]
            return out
        if not self.grads:
            self.grads = [torch.zeros_like(p) for p in self.params]
            for p, g in zip(self.params, self.grads):
                p.grad = g
        # a graph writes the gradients where they were at capture: nothing may clear or swap them (a global phase's
        # zero_grad did), and the step must write into them in place
        assert all(p.grad is g for p, g in zip(self.params, self.grads)), "a .grad was replaced after capture"
        out = self.run_step(rows, key, self.store_grads if key[2] else None)
        assert all(p.grad is g for p, g in zip(self.params, self.grads)), "the step swapped a .grad tensor"
        assert out.updated is None
        return out

    def store_grads(self, rows, grads):
        store_rows_grads(self.grads, rows, grads)
