"""kernel.profile=true: a few training steps under torch.profiler after warm-up, untimed and undone, leaving
``trace.json`` (open in chrome://tracing or Perfetto) in the run dir and a top-kernels table in run.log: where a
step's time goes, before deciding what to optimise.

Times are the device's (CUDA kernel time) on a GPU and the operators' own CPU time on CPU. "% of step" divides a
kernel's total by the profiled steps' wall time (CUDA-synchronised), so the column sums to the share of the step
the GPU was busy; launch gaps are what is left. A line under the table splits the step by kind of kernel (GEMM,
attention, communication, the rest: norms, activations, optimizer updates and other elementwise work, and idle, the
wall time no kernel ran) and gives the step's MFU on the card's dense peak (result.json: profile_split,
profile_mfu).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from speedrun.tables import format_table


@dataclass
class KernelRow:
    name: str
    calls: int
    total_ms: float


def _self_device_us(event: Any) -> float:
    """An event's self_device_time_total in us (self_cuda_time_total where the torch has no self_device_time_total)."""
    us = getattr(event, "self_device_time_total", None)
    return getattr(event, "self_cuda_time_total", 0) if us is None else us


def kernel_rows(events: Iterable[Any], cuda: bool) -> list[KernelRow]:
    """Rows from profiler key_averages(): device kernels on CUDA (self_device_time_total), operators on CPU."""
    rows = []
    for e in events:
        if cuda:
            us = _self_device_us(e)
            is_kernel = str(getattr(e, "device_type", "")).endswith("CUDA")
            if not is_kernel or us <= 0:
                continue
        else:
            us = e.self_cpu_time_total
            if us <= 0:
                continue
        rows.append(KernelRow(e.key, int(e.count), us / 1000.0))
    return rows


KINDS = (
    ("comms", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast|c10d", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|scaled_dot_product|cudnn_mha", re.I)),
    ("GEMM", re.compile(r"gemm|matmul|cutlass|xmma|nvjet|cublas|^aten::(mm|addmm|bmm|baddbmm|linear)$", re.I)),
)
"""A kernel's kind by its name (the first pattern that matches); anything else is "elementwise" (norms,
activations, softcap and loss, optimizer updates, copies: the fused and unfused pointwise and reduction work)."""
SPLIT = ("GEMM", "attention", "elementwise", "comms", "idle")


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "elementwise")


def step_split(rows: list[KernelRow], step_ms: float, steps: int) -> dict[str, float]:
    """Milliseconds per step of each kind of kernel (SPLIT), and idle: the step's wall time no kernel ran (0 when
    kernels overlap, as on several streams)."""
    split = dict.fromkeys(SPLIT, 0.0)
    for r in rows:
        split[kind_of(r.name)] += r.total_ms / steps
    split["idle"] = max(0.0, step_ms - sum(split.values()))
    return {kind: round(ms, 3) for kind, ms in split.items()}


def split_line(split: dict[str, float], step_ms: float, mfu: float | None) -> str:
    """The split as one line under the table, each kind with its share of the step, then the step's MFU."""
    parts = [f"{kind} {ms:.1f} ms ({100.0 * ms / step_ms if step_ms > 0 else 0.0:.0f}%)" for kind, ms in split.items()]
    tail = f"; MFU {100.0 * mfu:.1f}% of the card's dense peak" if mfu is not None else "; MFU: no peak for this device"
    return "step split: " + ", ".join(parts) + tail


def top_kernels_table(rows: list[KernelRow], step_ms: float, steps: int, top: int = 15, label: str = "") -> str:
    """The table run.log gets: name, calls, total ms, ms per step, % of step, the top ``top`` by total time, and a
    line for the rest. ``label`` follows "profile" in its first line (e.g. " (layer loop on)")."""
    rows = sorted(rows, key=lambda r: r.total_ms, reverse=True)
    step_total = step_ms * steps
    body = []
    for r in rows[:top]:
        pct = 100.0 * r.total_ms / step_total if step_total > 0 else 0.0
        body.append([_short(r.name), str(r.calls), f"{r.total_ms:.2f}", f"{r.total_ms / steps:.2f}", f"{pct:.1f}"])
    rest = rows[top:]
    if rest:
        ms = sum(r.total_ms for r in rest)
        body.append(
            [
                f"({len(rest)} more)",
                str(sum(r.calls for r in rest)),
                f"{ms:.2f}",
                f"{ms / steps:.2f}",
                f"{100.0 * ms / step_total if step_total > 0 else 0.0:.1f}",
            ]
        )
    busy = sum(r.total_ms for r in rows)
    head = (
        f"profile{label}: {steps} step(s), {step_ms:.1f} ms per step (wall), kernels busy {busy / steps:.1f} ms per "
        f"step ({100.0 * busy / step_total if step_total > 0 else 0.0:.0f}%)"
    )
    return head + "\n" + format_table(["kernel", "calls", "total ms", "ms/step", "% of step"], body)


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def profile_steps(
    stepper: Any,
    make_batches: Callable[..., Any],
    run_dir: Path,
    log: Callable[[str], None],
    steps: int,
    shapes: Sequence[tuple[int, bool]] | None = None,
    peak_flops: float | None = None,
) -> dict[str, Any]:
    """Profile ``steps`` optimizer steps in each model.loop state training will run, at the longest context length
    it runs in that state (``shapes``: the (stage index, loop on) pairs of speedrun.core.train.trained_shapes, which
    warm-up compiled; None: the last stage, loop off), off first, then on (on alone when the loop is on from the
    first step), then restore model, optimizers and scaler (as warm-up does), so training starts from the same
    state; the loop is left off, as warm-up leaves it. Returns result keys: profile_trace and profile_step_ms for the state
    training starts in (profile_layer_loop says whether the loop was on in it), profile_trace_looped and
    profile_step_ms_looped for the loop switched on mid-run; profile_split (ms per step of each kind of kernel, and
    idle) and profile_mfu (the step's FLOPs over its wall time and ``peak_flops``, the card's dense peak per GPU;
    None without one, as on CPU) likewise."""
    from torch.profiler import ProfilerActivity, profile

    from speedrun.core.train import flops_per_token

    plan = stepper.settings
    cuda = plan.device == "cuda"
    looping = plan.model.loop.on
    saved_model = copy.deepcopy(stepper.model.state_dict())
    saved_opts = [copy.deepcopy(opt.state_dict()) for opt in stepper.optimizers]
    saved_scaler = copy.deepcopy(stepper.scaler.state_dict()) if stepper.scaler else None
    # warm-up compiled exactly these pairs: profiling another would time its compile
    pairs = shapes if shapes is not None else [(len(plan.stages) - 1, False)]
    longest = {looped: max(i for i, on in pairs if on == looped) for _, looped in pairs}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    keys: dict[str, Any] = {}
    for i, looped in enumerate(sorted(longest) if looping else [False]):
        stage = plan.stages[longest.get(looped, len(plan.stages) - 1)]
        batches = make_batches(stage.seq_len, stage.micro_batch)
        if looping:
            stepper.model.set_loop(looped)
        with profile(activities=activities) as prof:
            _sync(cuda)
            t0 = time.perf_counter()
            for _ in range(steps):
                stepper(batches)
            _sync(cuda)
            step_ms = (time.perf_counter() - t0) * 1000.0 / steps
        suffix = "_looped" if i > 0 else ""
        trace = Path(run_dir) / f"trace{suffix}.json"
        prof.export_chrome_trace(str(trace))
        label = f" (layer loop {'on' if looped else 'off'})" if looping else ""
        rows = kernel_rows(prof.key_averages(), cuda)
        split = step_split(rows, step_ms, steps)
        flops = flops_per_token(plan, stage.seq_len, looped=looped) * plan.tokens_per_step
        ranks = getattr(getattr(stepper, "world", None), "world_size", 1)
        mfu = flops / (step_ms / 1000.0) / (peak_flops * ranks) if peak_flops else None
        log(top_kernels_table(rows, step_ms, steps, label=label) + "\n" + split_line(split, step_ms, mfu))
        keys.update({f"profile_trace{suffix}": str(trace), f"profile_step_ms{suffix}": round(step_ms, 3)})
        keys[f"profile_seq_len{suffix}"] = stage.seq_len
        keys.update({f"profile_split{suffix}": split, f"profile_mfu{suffix}": round(mfu, 4) if mfu else None})
        if looping and i == 0:  # which state profile_step_ms is: off for a loop switched on mid-run, else on
            keys["profile_layer_loop"] = "on" if looped else "off"
    if looping:
        stepper.model.set_loop(False)  # train() switches it when the budget says
    stepper.model.load_state_dict(saved_model)
    for opt, state in zip(stepper.optimizers, saved_opts):
        opt.load_state_dict(state)
    if stepper.scaler and saved_scaler:
        stepper.scaler.load_state_dict(saved_scaler)
    return keys


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()
