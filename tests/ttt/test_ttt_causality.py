"""Causality token by token: a target's score never depends on a later target, for score-first TTT (several
documents a batch, several batches, with and without global phases) and for the sliding-window eval.

The checker changes one target at a time (at the first, a middle and the last target of chunks, in every
document) and compares every per-token score, bit for bit, with the unchanged stream's. Two rules:

- scored before it: a target scored at an earlier step, or at the same step in another document or earlier in
  the same document, keeps its score;
- out of reach: a target of another document keeps its score unless a global phase that trained on the changed
  document ran between the two (or A is carried from batch to batch); documents of one batch never reach each
  other.

The checker is shown to fail: each known way to break score-first is patched in (test-only) and must be caught.

That rule cannot see a score that depends on its own target (an input equal to the target changes no *other*
score): a second check, InputWitness, watches every forward the model runs and asserts that each row's input is the
stream's tokens before its targets (x[j] = tokens[s + j] where y[j] = tokens[s + j + 1], zeros only as padding
after them), in both eval paths and in TTT; a label leak patched in must fail it, while the first checker passes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from speedrun.core import attention as sdpa
from speedrun.core import ttt_docs as schedule
from speedrun.core import ttt_graphs as graphs
from speedrun.core import ttt_score as steps
from speedrun.core import ttt_scorers as scorers
from speedrun.core.evaluate import evaluate, evaluate_sliding
from speedrun.core.model import GPT
from speedrun.core.ttt_docs import phase_schedule, split_documents
from speedrun.core.ttt_graphs import chunk_step
from speedrun.core.ttt_lora import LoRAModel, TTTSettings
from speedrun.core.ttt_score import ttt_evaluate
from support.tiny import BOS, TTT_TINY, byte_luts, docs_stream
from support.ttt import CHUNK, CONFIGS, PHASED, ttt_gpt

LENGTHS = [37, 20, 51, 29, 44, 33, 26, 48]  # 8 documents, 4 batches of 2; up to 7 chunks, windows that slide
EARLIER, OUT_OF_REACH = "scored before it", "out of its reach"


class TokenScores:
    """Per-token scores of one pass (an on_token_scores callback): nats by stream position, and the step (the
    callback's call, in scoring order) that scored each target. Every target must be scored exactly once."""

    def __init__(self, n_targets: int):
        self.nats = torch.full((n_targets + 1,), math.nan, dtype=torch.float64)
        self.step = torch.full((n_targets + 1,), -1, dtype=torch.int64)
        self.calls = 0

    def __call__(self, positions: torch.Tensor, nats: torch.Tensor) -> None:
        positions = positions.cpu()
        assert (self.step[positions] == -1).all(), "a target scored twice"
        self.nats[positions] = nats.cpu()
        self.step[positions] = self.calls
        self.calls += 1

    def complete(self) -> bool:
        return bool((self.step[1:] >= 0).all())


@dataclasses.dataclass
class Stream:
    """A validation stream and what the checker needs to know of it: each target's document, each document's
    batch (in scoring order), and whether something learns across documents (config)."""

    tokens: torch.Tensor
    config: str
    doc_of: torch.Tensor
    batch_of_doc: torch.Tensor
    phase_batches: list[int]

    @classmethod
    def make(cls, tokens: torch.Tensor, config: str, batch_of_doc: dict[int, int]) -> Stream:
        doc_of = torch.full((tokens.numel(),), -1, dtype=torch.int64)
        docs = split_documents(tokens, BOS)
        for d, (start, n) in enumerate(docs):
            doc_of[start + 1 : start + n + 1] = d
        batches = torch.tensor([batch_of_doc[d] for d in range(len(docs))])
        sizes = torch.bincount(batches).tolist()
        phases = sorted(phase_schedule(sizes, CONFIGS[config].phased))
        return cls(tokens, config, doc_of, batches, phases)

    def may_reach(self, batch: int) -> torch.Tensor:
        """Per target: may a change in a document scored in ``batch`` reach its score (another document's)?"""
        scored_in = self.batch_of_doc[self.doc_of.clamp(min=0)]
        if self.config == "warm":  # A goes from batch to batch
            return scored_in > batch
        # a phase after batch p trains on documents of batches 0..p (here every one: the first test below)
        crossing = [p for p in self.phase_batches if p >= batch]
        return scored_in > crossing[0] if crossing else torch.zeros_like(scored_in, dtype=torch.bool)


def violations(stream: Stream, before: TokenScores, after: TokenScores, t: int) -> list[str]:
    """What changing target ``t`` changed that it must not (the module doc's rules), one line per rule broken."""
    positions = torch.arange(stream.tokens.numel())
    d = int(stream.doc_of[t])
    step = int(before.step[t])
    same_step = before.step == step
    earlier = (before.step < step) | (same_step & ((stream.doc_of != d) | (positions < t)))
    reach = stream.may_reach(int(stream.batch_of_doc[d]))
    out_of_reach = (stream.doc_of != d) & ~reach
    problems = []
    if not torch.equal(after.step, before.step):
        problems.append(f"target {t}: the scoring order changed")
    for rule, mask in ((EARLIER, earlier), (OUT_OF_REACH, out_of_reach)):
        mask[0] = False
        if not torch.equal(after.nats[mask], before.nats[mask]):
            moved = (mask & (after.nats != before.nats)).nonzero().flatten().tolist()
            problems.append(f"changing target {t} (document {d}) changed {len(moved)} scores {rule}: {moved[:6]}")
    return problems


def changes(stream: Stream) -> Iterator[tuple[int, str]]:
    """(position, where) of the targets to change: in every document its first, a middle and its last target of
    a chunk, each in another chunk (chunk 1, a middle one, the last or chunk 0, by turns); never a document's
    closing BOS."""
    docs = split_documents(stream.tokens, BOS)
    for d, (start, n) in enumerate(docs):
        n_chunks = math.ceil((n - 1) / CHUNK)  # the chunks that hold more than the closing BOS
        for j, where in enumerate(("first", "middle", "last")):
            c = [1, n_chunks // 2, n_chunks - 1, 0][(d + j) % 4]
            lo, hi = c * CHUNK + 1, min((c + 1) * CHUNK, n - 1)  # the chunk's targets, the closing BOS left out
            offset = {"first": lo, "middle": (lo + hi) // 2, "last": hi}[where]
            yield start + offset, f"document {d} chunk {c} {where}"


def changed(tokens: torch.Tensor, t: int) -> torch.Tensor:
    out = tokens.clone()
    out[t] = out[t] % 63 + 1  # another token, never BOS: the same documents
    assert out[t] not in (BOS, tokens[t])
    return out


def ttt_scores(tokens: torch.Tensor, settings: TTTSettings) -> tuple[TokenScores, dict[int, int]]:
    """Per-token scores of a TTT pass, and each document's batch in the scoring order."""
    scores = TokenScores(tokens.numel() - 1)
    res = ttt_evaluate(
        ttt_gpt(),
        tokens,
        byte_luts(),
        settings,
        bos_id=BOS,
        seq_len=TTT_TINY.seq_len,
        record_chunks=True,
        on_token_scores=scores,
    )
    assert res.complete and scores.complete()
    assert float(scores.nats[1:].sum()) == pytest.approx(sum(c.nats for c in res.chunks), rel=1e-12)
    return scores, {c.doc: c.batch for c in res.chunks}


def ttt_violations(config: str, until: str | None = None) -> list[str]:
    """Every rule a change broke in TTT under ``config`` (as patched by the caller); ``until``: stop at the first
    change that breaks that rule."""
    settings = CONFIGS[config]
    tokens = docs_stream(LENGTHS, seed=1)
    before, batch_of_doc = ttt_scores(tokens, settings)
    stream = Stream.make(tokens, config, batch_of_doc)
    found: list[str] = []
    for t, where in changes(stream):
        after, _ = ttt_scores(changed(stream.tokens, t), settings)
        assert after.nats[t] != before.nats[t], where  # the change itself shows
        found += [f"{where}: {p}" for p in violations(stream, before, after, t)]
        if until is not None and any(until in line for line in found):
            break
    return found


def test_the_fixture_runs_several_documents_and_batches_and_phases_after_batches_0_and_1():
    """What the rules above assume of the stream: 4 batches of 2 documents, each document several chunks, and the
    phases after batches 0 and 1 train on every document of the batches up to theirs."""
    docs = split_documents(docs_stream(LENGTHS, seed=1), BOS)
    assert phase_schedule([2, 2, 2, 2], PHASED) == {0: [2], 1: [4]}
    _, batch_of_doc = ttt_scores(docs_stream(LENGTHS, seed=1), CONFIGS["lora"])
    assert sorted(batch_of_doc.values()) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(math.ceil(n / CHUNK) >= 3 for _, n in docs) and max(n for _, n in docs) > 2 * TTT_TINY.seq_len


@pytest.mark.parametrize("config", CONFIGS)
def test_no_score_depends_on_a_later_target(config):
    assert ttt_violations(config) == []


def test_token_scores_are_each_rows_chunk_whether_the_head_runs_at_the_chunk_or_at_every_column():
    """graphs.token_scores: a step's scored targets are each row's chunk (begin + first + 1 .. begin + length), the
    same with the head at the picked columns as at every column; padding rows score nothing."""
    tokens = docs_stream([70, 30, 9], seed=3)
    lora = LoRAModel(ttt_gpt(), ("q", "v"), 4, 4, 0)
    scorer = scorers.Scorer(lora.model)
    windows = [(0, 24, 16), (80, 16, 8), (101, 7, 0), (0, 0, 0)]  # (begin, length, first): the last is padding
    rows = torch.tensor([[w[i] for w in windows] for i in range(3)] + [[0] * 4])
    nats_of = lambda fn, x, y, pick: fn(x, y, pick=pick)  # noqa: E731
    expected = torch.tensor([i for b, n, f in windows for i in range(b + f + 1, b + n + 1)])
    assert int(expected.max()) == tokens.numel() - 1  # the stream's last target among them
    with torch.no_grad():
        for pick_width in (None, CHUNK):
            out = chunk_step(scorer, tokens, byte_luts(), rows, 24, False, nats_of, None, pick_width)
            positions, nats = graphs.token_scores(rows, out)
            assert torch.equal(positions, expected) and nats.dtype == torch.float64
            assert float(nats.sum()) == pytest.approx(float(out.row_nats.sum()), rel=1e-12)
            if pick_width is None:
                full = nats
            else:
                torch.testing.assert_close(nats, full, rtol=1e-5, atol=1e-6)


# ---- the checker fails: each way to break score-first, patched in ------------------------------------------------


def _adapters(forward) -> list[torch.Tensor]:
    return [p for p in forward.module.parameters() if p.requires_grad]  # the adapted copy's: only the adapters


def update_before_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    """An update on chunk k, then chunk k scored with it (and the usual update after)."""

    def step(forward, tokens, luts, rows, width, training, nats_of, store_grads=None, pick_width=None, bind=None):
        if training:
            chunk_step(forward, tokens, luts, rows, width, True, nats_of, None, pick_width, bind)
            with torch.no_grad():
                for p in _adapters(forward):
                    if p.grad is not None:
                        p.sub_(0.05 * p.grad)
                        p.grad = None
        return chunk_step(forward, tokens, luts, rows, width, training, nats_of, store_grads, pick_width, bind)

    monkeypatch.setattr(steps, "chunk_step", step)


def train_on_next_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk k scored, then the update taken on chunk k+1 (before chunk k+1 is scored)."""

    def step(forward, tokens, luts, rows, width, training, nats_of, store_grads=None, pick_width=None, bind=None):
        out = chunk_step(forward, tokens, luts, rows, width, False, nats_of, None, pick_width, bind)
        if training:
            ahead = next_chunk(rows, tokens)
            chunk_step(forward, tokens, luts, ahead, TTT_TINY.seq_len, True, nats_of, None, pick_width, bind)
        return out

    def next_chunk(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        out = rows.clone()
        for i, (begin, length, _, learn) in enumerate(rows.t().tolist()):
            if not learn:
                continue
            bos = (tokens[begin + 1 :] == BOS).nonzero()
            last = begin + 1 + int(bos[0]) if len(bos) else tokens.numel() - 1  # the document's last target
            hi = min(begin + length + CHUNK, last)
            lo = max(begin, hi - TTT_TINY.seq_len)
            out[:, i] = torch.tensor([lo, hi - lo, begin + length - lo, 1])
        return out

    monkeypatch.setattr(steps, "chunk_step", step)


def shared_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every document of a batch on one adapter slot."""

    def bind_rows(self, rows):
        views = []
        for d in self.deltas:
            d.rows = None if rows is None else (d.A[:1].expand(rows, -1, -1), d.B[:1].expand(rows, -1, -1))
            views.extend(d.rows or ())
        return views

    monkeypatch.setattr(LoRAModel, "bind_rows", bind_rows)


def slots_kept_between_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot's adapters never reset after the first draw: a batch goes on from the last batch's documents."""
    reset = LoRAModel.reset

    def sticky(self, keep_a):
        if not getattr(self, "drawn", False):
            self.drawn = True
            reset(self, keep_a)

    monkeypatch.setattr(LoRAModel, "reset", sticky)


def phase_on_unscored_document(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each phase trains on one document more: the first one of the next batch, not scored yet."""
    scored, phases = schedule.PassSchedule.scored_documents, schedule.phase_schedule
    monkeypatch.setattr(schedule.PassSchedule, "scored_documents", lambda self, b: scored(self, b + 1))
    monkeypatch.setattr(
        schedule, "phase_schedule", lambda sizes, g: {b: [n + 1 for n in ns] for b, ns in phases(sizes, g).items()}
    )


MUTATIONS = {
    "update_on_chunk_before_scoring_it": (update_before_scoring, "lora", EARLIER),
    "train_on_next_chunk_before_scoring_it": (train_on_next_chunk, "lora", EARLIER),
    "documents_share_an_adapter_slot": (shared_slot, "lora", OUT_OF_REACH),
    "adapter_slots_not_reset_between_batches": (slots_kept_between_batches, "lora", OUT_OF_REACH),
    "global_phase_trains_on_an_unscored_document": (phase_on_unscored_document, "phased", EARLIER),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_checker_fails_under_mutation(mutation, monkeypatch):
    patch, config, rule = MUTATIONS[mutation]
    patch(monkeypatch)
    found = ttt_violations(config, until=rule)
    caught = [line for line in found if rule in line]
    assert caught, found
    print(f"\n{mutation}: {caught[0]}")


# ---- sliding-window eval -------------------------------------------------------------------------------------


def eval_scores(forward: Callable, tokens: torch.Tensor, stride: int | None) -> TokenScores:
    scores = TokenScores(tokens.numel() - 1)
    if stride is None:
        evaluate(forward, tokens, byte_luts(), seq_len=TTT_TINY.seq_len, batch_size=3, device="cpu", autocast_dtype=None,
                 on_token_scores=scores)  # fmt: skip
    else:
        evaluate_sliding(forward, tokens, byte_luts(), seq_len=TTT_TINY.seq_len, stride=stride, batch_size=3, device="cpu",
                         autocast_dtype=None, on_token_scores=scores)  # fmt: skip
    return scores


def eval_violations(forward: Callable, stride: int | None) -> list[str]:
    """Targets scored before a changed target (every position before it) whose score moved: in the first
    window, at the windows' edges, in the tail window, in between."""
    tokens = docs_stream([60, 41, 30], seed=2)[: 24 * 5 + 1]  # standard: every target in a window
    n = tokens.numel() - 1
    before = eval_scores(forward, tokens, stride)
    assert before.complete()
    found = []
    for t in sorted({2, 7, 23, 24, 25, 33, 40, 57, 64, 90, n - 3, n - 1, n}):
        after = eval_scores(forward, changed(tokens, t), stride)
        assert after.nats[t] != before.nats[t]
        if not torch.equal(after.nats[1:t], before.nats[1:t]):
            moved = (after.nats[1:t] != before.nats[1:t]).nonzero().flatten() + 1
            found.append(f"changing target {t} changed {len(moved)} scores {EARLIER}: {moved[:6].tolist()}")
    return found


def _forward(m: GPT) -> Callable:
    return lambda x, y: m(x, y, reduction="none")


@pytest.mark.parametrize("stride", [8, 5, None], ids=["sliding8", "sliding5", "standard"])
def test_eval_scores_depend_on_no_later_target(stride):
    with torch.no_grad():
        assert eval_violations(_forward(ttt_gpt()), stride) == []


def inputs_one_ahead(m: GPT, monkeypatch: pytest.MonkeyPatch) -> Callable:
    """A window whose inputs run one token ahead: each column sees the target after its own."""
    return lambda x, y: m(torch.cat([y[:, 1:], y[:, -1:]], dim=1), y, reduction="none")


def attention_sees_ahead(m: GPT, monkeypatch: pytest.MonkeyPatch) -> Callable:
    """Attention without its causal mask."""
    causal = F.scaled_dot_product_attention

    def bidirectional(q, k, v, **kw):
        return causal(q, k, v, **{**kw, "is_causal": False})

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", bidirectional)
    return _forward(m)


@pytest.mark.parametrize("mutation", [inputs_one_ahead, attention_sees_ahead], ids=lambda f: f.__name__)
def test_the_eval_checker_fails_under_mutation(mutation, monkeypatch):
    with torch.no_grad():
        found = eval_violations(mutation(ttt_gpt(), monkeypatch), 8)
    assert found and all(EARLIER in line for line in found)
    print(f"\n{mutation.__name__}: {found[0]}")


# ---- label leaks: each scored position's input is the tokens before it -----------------------------------------


class InputWitness:
    """Records every per-token forward of the built-in GPT (reduction="none": the scoring passes, TTT's steps and
    its global phases) and says which rows are not a window of ``tokens``: a row must read x[j] = tokens[s + j] and
    y[j] = tokens[s + j + 1] for some start s over its first columns, then only zeros (padding) in both."""

    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens.cpu()
        self.rows = 0
        self.problems: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        forward = GPT.forward

        def watched(model, idx, targets=None, reduction="mean", **kw):
            if targets is not None and reduction == "none":
                self.check(idx, targets)
            return forward(model, idx, targets, reduction, **kw)

        monkeypatch.setattr(GPT, "forward", watched)

    def check(self, x: torch.Tensor, y: torch.Tensor) -> None:
        for row_x, row_y in zip(x.detach().cpu(), y.detach().cpu()):
            self.rows += 1
            if not (row_x.any() or row_y.any()):
                continue  # a padding row
            if not any(self._window_at(int(s), row_x, row_y) for s in self._starts(row_x, row_y)):
                self.problems.append(
                    f"inputs {row_x[:6].tolist()}... are not the tokens before targets {row_y[:6].tolist()}..."
                )

    def _starts(self, row_x: torch.Tensor, row_y: torch.Tensor) -> torch.Tensor:
        t = self.tokens
        return ((t[:-1] == row_x[0]) & (t[1:] == row_y[0])).nonzero().flatten()

    def _window_at(self, s: int, row_x: torch.Tensor, row_y: torch.Tensor) -> bool:
        n = min(row_x.numel(), self.tokens.numel() - 1 - s)
        same = (row_x[:n] == self.tokens[s : s + n]) & (row_y[:n] == self.tokens[s + 1 : s + 1 + n])
        length = int(same.long().cumprod(0).sum())  # the matching prefix
        return not (row_x[length:].any() or row_y[length:].any())


@pytest.mark.parametrize("config", CONFIGS)
def test_each_ttt_score_reads_the_tokens_before_its_target(config, monkeypatch):
    tokens = docs_stream(LENGTHS, seed=1)
    witness = InputWitness(tokens)
    witness.install(monkeypatch)
    ttt_scores(tokens, CONFIGS[config])
    assert witness.rows > 0 and witness.problems == []


@pytest.mark.parametrize("stride", [8, None], ids=["sliding8", "standard"])
def test_each_eval_score_reads_the_tokens_before_its_target(stride, monkeypatch):
    tokens = docs_stream([60, 41, 30], seed=2)[: 24 * 5 + 1]
    witness = InputWitness(tokens)
    witness.install(monkeypatch)
    with torch.no_grad():
        assert eval_scores(_forward(ttt_gpt()), tokens, stride).complete()
    assert witness.rows > 0 and witness.problems == []


def inputs_are_the_targets_in_ttt(monkeypatch: pytest.MonkeyPatch) -> None:
    """TTT's step feeds each window its targets as inputs."""

    def step(forward, tokens, luts, rows, width, training, nats_of, *args, **kw):
        leaky = lambda fn, x, y, pick: nats_of(fn, y, y, pick)  # noqa: E731
        return chunk_step(forward, tokens, luts, rows, width, training, leaky, *args, **kw)

    monkeypatch.setattr(steps, "chunk_step", step)


@pytest.mark.parametrize("path", ["ttt", "sliding8", "standard"])
def test_a_label_leak_fails_the_input_check(path, monkeypatch):
    """The input equal to the target: the witness fails; in the eval paths the later-target checker is shown blind
    to it (no later target moves any score), as every check was before the witness."""
    if path == "ttt":
        tokens = docs_stream(LENGTHS, seed=1)
        inputs_are_the_targets_in_ttt(monkeypatch)
        witness = InputWitness(tokens)
        witness.install(monkeypatch)
        ttt_scores(tokens, CONFIGS["lora"])
    else:
        stride = 8 if path == "sliding8" else None
        m = ttt_gpt()
        leak = lambda x, y: m(y, y, reduction="none")  # noqa: E731
        with torch.no_grad():
            assert eval_violations(leak, stride) == []  # blind to it
        tokens = docs_stream([60, 41, 30], seed=2)[: 24 * 5 + 1]
        witness = InputWitness(tokens)
        witness.install(monkeypatch)
        with torch.no_grad():
            eval_scores(leak, tokens, stride)
    assert witness.problems, "a label leak went unseen"
    print(f"\n{path}: {witness.problems[0]}")
