"""``hardware.micro_batch=auto`` and ``eval.batch_size=auto``: the largest batch that fits, found before warm-up.

For every context length of the plan, the micro-batch candidates are the divisors of that stage's sequences per
step (tokens_per_step / seq_len), so gradient accumulation keeps tokens per step exactly as planned. A candidate
is tried with one forward and backward pass of the eager (uncompiled) model on random tokens under the plan's
autocast; ``torch.cuda.OutOfMemoryError`` means it does not fit. Fitting is monotone in the batch size, so the
search is a binary search over the candidates (log2 of their number in tries). The eager model keeps more
activations than the compiled one, so a size that fits here leaves the compiled step some room; trying eager also
compiles nothing, where every compiled size would cost a compilation.

Tokens per micro-batch stay the same in every stage (the Plan's rule), so the choice is the largest micro-batch
token count that fits at every length and that each length divides. Evaluation gets its own batch (windows per
forward) by the same search, without gradients, so an eval that would run out of memory never changes training.

On several ranks every rank searches (its own card, and whatever else shares it) and the smallest choice over the
ranks wins (``agree_batches``): a size that fits the tightest rank fits them all, so no rank runs out of memory.

On CPU there is no out-of-memory signal to search by: the plan keeps its starting values (the profile's default
micro-batch, or the nearest smaller divisor of the sequences per step) and says so in the log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from speedrun.core.dist import World
from speedrun.core.train import autocast_dtype
from speedrun.plan import Plan

if TYPE_CHECKING:
    from speedrun.core.model import GPT

OOM = (torch.cuda.OutOfMemoryError,)
"""What "does not fit" looks like (torch.OutOfMemoryError: the caching allocator's refusal, the memory cap included)."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def fits_probe(try_size: Callable[[int], Any], on_free: Callable[[], None] = lambda: None) -> Callable[[int], bool]:
    """try_size(n) -> fits(n): True when it ran, False when it ran out of memory; memory is freed either way."""

    def fits(n: int) -> bool:
        try:
            try_size(n)
            return True
        except OOM:
            return False
        finally:
            gc.collect()
            on_free()

    return fits


def largest_fitting(
    candidates: Sequence[int], fits: Callable[[int], bool], tried: dict[int, bool] | None = None
) -> int | None:
    """The largest candidate (ascending list) that fits, by binary search; None when not even the smallest does.
    ``tried`` collects every size tried and whether it fit."""
    tried = {} if tried is None else tried
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        ok = tried[candidates[mid]] = fits(candidates[mid])
        if ok:
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


def plan_with_batches(
    plan: Plan,
    try_train: Callable[[int, int], Any],
    try_eval: Callable[[int], Any],
    log: Callable[[str], None],
    on_free: Callable[[], None] = lambda: None,
) -> tuple[Plan, dict]:
    """The plan with the micro-batch (and stages, grad_accum) and the eval batch the searches chose, and a report
    of what was tried. try_train(seq_len, micro_batch) and try_eval(batch_size) raise OOM when a size does not fit."""
    report: dict[str, Any] = {}
    if plan.micro_batch_search:
        lengths = [st.seq_len for st in plan.stages]
        longest = plan.model.seq_len
        # micro-batch token counts every length divides and that divide each rank's share of tokens_per_step, as in
        # plan._stages and plan.distributed.check_step_split
        options = [
            d * longest
            for d in divisors(plan.tokens_per_step // (plan.world_size * longest))
            if all((d * longest) % L == 0 for L in lengths)
        ]
        best_tokens = None
        for L in sorted(lengths, reverse=True):
            tried: dict[int, bool] = {}
            ok = [t for t in options if best_tokens is None or t <= best_tokens]

            def try_tokens(n: int, L: int = L) -> Any:
                return try_train(L, n // L)

            found = largest_fitting(ok, fits_probe(try_tokens, on_free), tried)
            report[f"train_seq_{L}"] = {str(t // L): v for t, v in sorted(tried.items())}
            if found is None:
                raise torch.cuda.OutOfMemoryError(
                    f"hardware.micro_batch=auto: not even {ok[0] // L} sequence(s) of {L} tokens fit in memory; use a "
                    f"shorter context, another attention backend or a smaller model"
                )
            best_tokens = found
        assert best_tokens is not None
        plan = with_micro_tokens(plan, best_tokens)
        log(f"micro-batch search: {plan.micro_batch} x {longest} tokens x {plan.grad_accum} accum (tried {report})")
    if plan.eval.batch_search:
        tried = {}
        windows = plan.eval.tokens // plan.model.seq_len if plan.eval.tokens else 4096
        candidates = [2**i for i in range(0, 13) if 2**i <= max(1, windows)]  # more than the windows is no use
        found = largest_fitting(candidates, fits_probe(try_eval, on_free), tried)
        report["eval"] = {str(k): v for k, v in sorted(tried.items())}
        if found is None:
            raise torch.cuda.OutOfMemoryError("eval.batch_size=auto: not even one window fits in memory")
        plan = dataclasses.replace(plan, eval=dataclasses.replace(plan.eval, batch_size=found))
        log(f"eval batch search: {found} windows per forward (tried {report['eval']})")
    return plan, report


def with_micro_tokens(plan: Plan, tokens: int) -> Plan:
    """The plan with micro-batches of ``tokens`` tokens at every context length, and the accumulation that keeps
    tokens_per_step (global: world_size ranks x micro-batch tokens x accumulation)."""
    stages = tuple(dataclasses.replace(st, micro_batch=tokens // st.seq_len) for st in plan.stages)
    accum = plan.tokens_per_step // (plan.world_size * tokens)
    return dataclasses.replace(plan, micro_batch=tokens // plan.model.seq_len, stages=stages, grad_accum=accum)


def agree_batches(plan: Plan, world: World | None, log: Callable[[str], None]) -> Plan:
    """On several ranks, the smallest micro-batch and eval batch any rank's search chose, on every rank. Each rank
    searched its own memory (another process or a fuller card may leave less room); fitting is monotone and every
    rank searched the same candidates, so the smallest choice is one every rank fits, and the ranks must run the
    same batches (the step's split is the Plan's). One process: the plan as it is."""
    if world is None or world.single:
        return plan
    tokens = plan.micro_batch * plan.model.seq_len
    agreed = int(world.min(tokens)) if plan.micro_batch_search else tokens
    eval_batch = int(world.min(plan.eval.batch_size)) if plan.eval.batch_search else plan.eval.batch_size
    if (agreed, eval_batch) != (tokens, plan.eval.batch_size):
        log(
            f"batch search over {world.world_size} ranks: micro-batch {agreed // plan.model.seq_len}, eval batch "
            f"{eval_batch} (the smallest any rank fits; this rank found {plan.micro_batch} and {plan.eval.batch_size})"
        )
    plan = with_micro_tokens(plan, agreed) if plan.micro_batch_search else plan
    return dataclasses.replace(plan, eval=dataclasses.replace(plan.eval, batch_size=eval_batch))


def search_batches(plan: Plan, model: GPT, log: Callable[[str], None], world: World | None = None) -> tuple[Plan, dict]:
    """plan_with_batches with real tries of the eager model on the plan's device (CUDA only), agreed over the
    ranks (``world``: agree_batches)."""
    plan, report = _search_here(plan, model, log)
    return agree_batches(plan, world, log), report


def _search_here(plan: Plan, model: GPT, log: Callable[[str], None]) -> tuple[Plan, dict]:
    if plan.device != "cuda":
        log(
            f"batch-size search needs a CUDA device (it searches by out-of-memory errors): keeping micro-batch "
            f"{plan.micro_batch} and eval batch {plan.eval.batch_size} on {plan.device}"
        )
        return plan, {"skipped": plan.device}
    dtype = autocast_dtype(plan.autocast)
    vocab = plan.model.vocab_size

    def tokens(batch: int, seq_len: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch, seq_len), device=plan.device)

    def autocast() -> Any:
        return torch.autocast("cuda", dtype=dtype) if dtype else torch.autocast("cuda", enabled=False)

    def try_train(seq_len: int, micro_batch: int) -> None:
        x, y = tokens(micro_batch, seq_len), tokens(micro_batch, seq_len)
        try:
            with autocast():
                loss = model(x, y)
            loss.backward()
            torch.cuda.synchronize()
        finally:
            model.zero_grad(set_to_none=True)

    @torch.no_grad()
    def try_eval(batch: int) -> None:
        was = model.training
        model.eval()
        try:
            with autocast():
                model(tokens(batch, plan.model.seq_len), tokens(batch, plan.model.seq_len), reduction="none")
            torch.cuda.synchronize()
        finally:
            model.train(was)

    # with model.loop the looped model (more layer calls, more activations) is the one that must fit
    looped = model.looped() if plan.model.loop.on else contextlib.nullcontext()
    with looped:
        return plan_with_batches(plan, try_train, try_eval, log, on_free=torch.cuda.empty_cache)
