"""python -m speedrun.tune: time kernel settings on this card for the composed model, keep the fastest one whose
losses match the default's, and write it to conf/kernel/tuned/<card>.yaml, which ``kernel=tuned`` reads.

    python -m speedrun.tune model=pgolf_baseline                  # the full search
    python -m speedrun.tune --quick --steps 10 model=pgolf_baseline

Overrides are the run CLI's (any group.field=value); the search always starts from kernel=default. Each candidate
is the composed config plus a few kernel.* overrides, resolved like a run (a combination the resolver refuses is
listed with its reason, not measured), built from the same seed and trained on the same batches: after its warm-up
(compilation, autotuning, graph capture; untimed), ``--steps`` optimizer steps are each timed between CUDA
synchronisations and the median gives tokens/s. Numerics: every step's loss must be within
``atol + rtol * |default's loss|`` of the default's loss on the same batch (defaults 0.03 and 1%: bf16
reassociation moves a loss by ~1e-3, fp8 rounding by ~1e-2; a wrong kernel by far more). The winner is the fastest
candidate that passes and beats the default by ``--min-gain``; otherwise the default itself is written, so the
table always says what was measured.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedrun.config import CONF_DIR, register_configs, to_config
from speedrun.core.train import Stepper, TrainState, warm_up
from speedrun.errors import ConfigError
from speedrun.hardware.profiles import PROFILES, detect
from speedrun.kernels.tuned import write_entry
from speedrun.plan import Plan, PlanError, resolve
from speedrun.plan.settings import train_settings
from speedrun.run.build import build_attention, build_data, build_model, configure_torch
from speedrun.tables import format_table

DEFAULT_ATOL, DEFAULT_RTOL = 0.03, 0.01


@dataclass
class Candidate:
    overrides: list[str]
    """kernel.* overrides on top of the composed config ([] is the default)."""
    plan: Plan | None = None
    """The candidate's resolved plan (None: refused)."""
    kernel_settings: dict[str, Any] = field(default_factory=dict)
    """The candidate's kernel-group fields (KernelConfig.explicit()): what the table stores."""
    refused: str | None = None
    tokens_per_s: float | None = None
    step_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    numerics: str | None = None
    """None until checked; "ok" or why the losses differ from the default's."""
    error: str | None = None

    @property
    def label(self) -> str:
        return " ".join(self.overrides) or "default"


def candidate_overrides(plan: Plan, quick: bool = False) -> list[list[str]]:
    """kernel.* override sets worth timing for this plan (the default first); the resolver refuses what cannot
    run, so this lists what is worth asking, not what is possible."""
    out: list[list[str]] = [[]]
    if plan.device != "cuda":
        return out
    graphs, cdt = ["kernel.cuda_graphs=true"], ["kernel.coordinate_descent_tuning=true"]
    fused = ["kernel.fused_qkv=true"]
    fp8 = plan.precision == "bf16" and _has_fp8(plan)
    # twice (and four times) the micro-batch, where the step still splits evenly: fewer, larger kernels per step
    # (a size that runs out of memory is recorded as failed)
    bigger = [f"kernel.micro_batch={2 * plan.micro_batch}"] if plan.grad_accum % 2 == 0 else []
    biggest = [f"kernel.micro_batch={4 * plan.micro_batch}"] if plan.grad_accum % 4 == 0 else []
    if quick:  # each lever alone, and all of them together
        out += [graphs] + ([cdt] if plan.compile else []) + ([["kernel.fp8=[mlp_down]"]] if fp8 else [])
        out += [bigger] if bigger else []
        out.append(bigger + graphs + (cdt if plan.compile else []) + (["kernel.fp8=[mlp_down]"] if fp8 else []))
        return out
    if bigger:
        out += [bigger, bigger + graphs] + ([bigger + graphs + cdt] if plan.compile else [])
    if biggest:
        out += [biggest, biggest + graphs]
    out.append(fused)  # alone: no faster on an H100, by default or on top of the tuned table (kernel_fused_qkv)
    # the fused loss never holds the (tokens, vocab) logits: alone, and with the larger micro-batches that frees
    loss = ["kernel.fused_ce=true"]
    out += [loss] + [size + loss for size in (bigger, biggest) if size]
    if plan.compile:
        out += [
            ["kernel.compile_mode=max-autotune-no-cudagraphs"],
            ["kernel.compile_mode=reduce-overhead"],
            cdt,
            graphs + cdt,
            graphs + ["kernel.compile_mode=max-autotune-no-cudagraphs"],
        ]
    out.append(graphs)
    if fp8:
        for targets in ("[mlp_down]", "[mlp]"):
            out += [[f"kernel.fp8={targets}"], graphs + [f"kernel.fp8={targets}"]]
        if plan.compile:
            out.append(bigger + graphs + cdt + ["kernel.fp8=[mlp_down]"])
    if plan.attn == "flex":
        out += [
            ["kernel.flex_fwd.block_m=128", "kernel.flex_fwd.block_n=64"],
            ["kernel.flex_fwd.block_m=64", "kernel.flex_fwd.block_n=64"],
            [
                "kernel.flex_bwd.block_m1=64",
                "kernel.flex_bwd.block_n1=128",
                "kernel.flex_bwd.block_m2=128",
                "kernel.flex_bwd.block_n2=64",
            ],
            [
                "kernel.flex_bwd.block_m1=32",
                "kernel.flex_bwd.block_n1=64",
                "kernel.flex_bwd.block_m2=64",
                "kernel.flex_bwd.block_n2=32",
            ],
        ]
    return out


def _has_fp8(plan: Plan) -> bool:
    profile = PROFILES.get(plan.hardware)
    return bool(profile and profile.capability and profile.capability >= (8, 9))


def check_numerics(
    reference: list[float], losses: list[float], atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL
) -> str:
    """ "ok", or which step's loss is how far from the reference's (same batches, same initial weights)."""
    if len(losses) != len(reference) or not reference:
        return f"{len(losses)} losses against {len(reference)} of the default"
    for i, (ref, got) in enumerate(zip(reference, losses)):
        bound = atol + rtol * abs(ref)
        if not abs(got - ref) <= bound:  # a NaN fails too
            return f"step {i + 1}: loss {got:.4f} vs default {ref:.4f} (|diff| {abs(got - ref):.4f} > {bound:.4f})"
    return "ok"


def pick_winner(candidates: list[Candidate], min_gain: float = 0.01) -> Candidate:
    """The fastest measured candidate with numerics ok that beats the default (candidates[0]) by more than
    ``min_gain``; else the default."""
    default = candidates[0]
    measured = [(c.tokens_per_s, c) for c in candidates[1:] if c.numerics == "ok" and c.tokens_per_s]
    if not measured:
        return default
    speed, best = max(measured, key=lambda m: m[0])  # the first of equals, as max over the candidates was
    if default.tokens_per_s and speed > default.tokens_per_s * (1 + min_gain):
        return best
    return default


def provenance(plan: Plan, default: Candidate, winner: Candidate, steps: int, argv: list[str]) -> dict[str, Any]:
    """Where the table's numbers come from: card, versions, date, model, what was measured and how."""
    import dataclasses

    import torch

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    speedup = winner.tokens_per_s / default.tokens_per_s if winner.tokens_per_s and default.tokens_per_s else None
    info = {
        "device_name": plan.device_name,
        "hardware": plan.hardware,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": plan.model_name,
        "model_shape": dataclasses.asdict(plan.model),
        "attn_kernel": plan.attn_kernel,
        "precision": plan.precision,
        "tokens_per_step": plan.tokens_per_step,
        "micro_batch": plan.micro_batch,
        "steps_timed": steps,
        "winner": winner.label,
        "default_tokens_per_s": round(default.tokens_per_s or 0.0, 1),
        "winner_tokens_per_s": round(winner.tokens_per_s or 0.0, 1),
        "speedup": round(speedup, 4) if speedup else None,
        "command": "python -m speedrun.tune " + " ".join(argv),
    }
    return json.loads(json.dumps(info, default=str))  # plain types only (torch.__version__ is a str subclass)


def results_table(candidates: list[Candidate], winner: Candidate) -> str:
    base = candidates[0].tokens_per_s
    rows = []
    for c in candidates:
        ratio = f"{c.tokens_per_s / base:.3f}" if c.tokens_per_s and base else ""
        med = f"{statistics.median(c.step_ms):.1f}" if c.step_ms else ""
        status = c.refused and f"refused: {c.refused}" or c.error and f"failed: {c.error}" or c.numerics or ""
        rows.append(
            [
                ("* " if c is winner else "  ") + c.label,
                f"{c.tokens_per_s:,.0f}" if c.tokens_per_s else "",
                ratio,
                med,
                status[:110],
            ]
        )
    return format_table(["candidate", "tokens/s", "vs default", "median ms/step", "numerics / status"], rows)


# ---------------------------------------------------------------------------------------------------------------
# measuring (needs the device; the CPU tests run it on the tiny model)


def measure(candidate: Candidate, data: Any, steps: int, log: Callable[[str], None]) -> None:
    """Build the candidate's model from its plan's seed, warm it up, time ``steps`` steps on the data's first
    batches; fills tokens_per_s, step_ms and losses."""
    import torch

    plan = candidate.plan
    assert plan is not None  # a refused candidate is never measured
    cuda = plan.device == "cuda"
    _release(cuda)  # what a candidate that failed (e.g. out of memory) left behind
    torch.manual_seed(plan.seed)
    attention = build_attention(plan)
    model, forward, _, optimizers = build_model(plan, attention, data.bos_id)
    stepper = Stepper(model, forward, optimizers, train_settings(plan))
    warm_up(stepper, data.train_batches, TrainState(), log)
    stage = plan.stages[-1]
    batches = data.train_batches(stage.seq_len, stage.micro_batch)
    for _ in range(steps):
        _sync(cuda)
        t0 = time.perf_counter()
        loss = stepper(batches)
        _sync(cuda)
        candidate.step_ms.append((time.perf_counter() - t0) * 1000.0)
        candidate.losses.append(float(loss.item()))
    candidate.tokens_per_s = plan.tokens_per_step / (statistics.median(candidate.step_ms) / 1000.0)
    del stepper, model, forward, optimizers, attention
    _release(cuda)


def _sync(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.synchronize()


def _release(cuda: bool) -> None:
    """Forget compiled graphs and captured CUDA graphs between candidates, so each compiles its own way."""
    import torch
    import torch._inductor.config as inductor_config

    gc.collect()
    torch._dynamo.reset()
    inductor_config.coordinate_descent_tuning = False  # a candidate's setting must not leak into the next
    if cuda:
        torch.cuda.empty_cache()


def tune(
    candidates: list[Candidate],
    run: Callable[[Candidate], None],
    atol: float,
    rtol: float,
    log: Callable[[str], None],
    min_gain: float = 0.01,
) -> Candidate:
    """Measure every resolvable candidate with ``run`` (progress on ``log``), check numerics against the first
    (the default), and return the winner. A candidate that raises is recorded as failed, never the winner."""
    todo = [c for c in candidates if c.refused is None]
    t0 = time.perf_counter()
    for i, c in enumerate(todo):
        log(f"[{i + 1}/{len(todo)}] {c.label}: measuring ({time.perf_counter() - t0:.0f}s elapsed)")
        try:
            run(c)
        except Exception as e:  # noqa: BLE001 - one candidate failing must not end the search
            if c is candidates[0]:
                raise
            c.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log(f"    failed: {c.error}")
            continue
        c.numerics = "ok" if c is candidates[0] else check_numerics(candidates[0].losses, c.losses, atol, rtol)
        log(f"    {c.tokens_per_s:,.0f} tok/s (median of {len(c.step_ms)} steps), numerics {c.numerics}")
    return pick_winner(candidates, min_gain)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    intro, rest = __doc__.split("\n\n", 1)  # the whole first paragraph, then the examples and the method
    parser = argparse.ArgumentParser(
        prog="python -m speedrun.tune",
        description=intro,
        epilog=rest,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=12, help="timed steps per candidate (median taken)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short search: CUDA graphs, coordinate descent, fp8 mlp_down, each alone and together",
    )
    parser.add_argument(
        "--candidate",
        action="append",
        default=None,
        metavar="OVERRIDES",
        help='time these kernel.* overrides (space-separated, e.g. "kernel.cuda_graphs=true kernel.micro_batch=128")'
        " instead of the built-in list; repeat for more; the default is always measured first",
    )
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL, help="numerics: absolute loss tolerance")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="numerics: relative loss tolerance")
    parser.add_argument("--min-gain", type=float, default=0.01, help="a winner must beat the default by this")
    parser.add_argument("--table-dir", type=Path, default=None, help="where tables go (default conf/kernel/tuned)")
    parser.add_argument("--dry-run", action="store_true", help="measure and print; write no table")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for python -m run")
    args = parser.parse_args(argv)
    try:
        return _main(args, argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    def log(msg: str) -> None:
        print(msg, flush=True)

    given = [c.split() for c in args.candidate or []]
    bad = [o for c in given for o in c if not o.startswith("kernel.")]
    if bad:
        raise ConfigError(
            f"--candidate takes kernel.* overrides only, got {bad}; pass other overrides as arguments after the options"
        )
    device = detect()
    base = ["kernel=default", *args.overrides]
    default_plan = resolve(to_config(_compose(base)), device)
    candidates = []
    wanted = [[]] + [c for c in given if c] if given else candidate_overrides(default_plan, args.quick)
    for extra in wanted:
        c = Candidate(overrides=extra)
        try:
            cfg = to_config(_compose(base + extra))
            c.plan, c.kernel_settings = resolve(cfg, device), cfg.kernel.explicit()
        except PlanError as e:
            c.refused = str(e)
        candidates.append(c)
    plan = default_plan
    log(
        f"tune: {plan.device_name} ({plan.hardware}), model {plan.model_name}, {plan.attn_kernel}, {plan.precision}; "
        f"{sum(c.refused is None for c in candidates)} candidate(s), {args.steps} timed steps each"
    )
    configure_torch(plan)
    data = build_data(plan, log)
    winner = tune(
        candidates, lambda c: measure(c, data, args.steps, lambda m: None), args.atol, args.rtol, log, args.min_gain
    )
    log(results_table(candidates, winner))
    info = provenance(plan, candidates[0], winner, args.steps, argv)
    log(
        f"winner: {winner.label} ({info['winner_tokens_per_s']:,.0f} tok/s, default "
        f"{info['default_tokens_per_s']:,.0f}, x{info['speedup']})"
    )
    if not args.dry_run:
        path = write_entry(plan.hardware, plan.model_name, winner.kernel_settings, info, args.table_dir)
        log(f"wrote {path} (kernel=tuned on {plan.hardware} now runs: {winner.label})")
    return 0


def _compose(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


if __name__ == "__main__":
    sys.exit(main())
