"""Metrics out of a peer script's log: parameter-golf's trainers print their results as text, not a result file.

Each parser takes the whole log and the environment the script ran with (a batch size it read from the
environment is not always printed) and returns metrics named as speedrun's result.json names them, so one bar
compares both sides: ``tokens_per_s`` (training tokens / timed training seconds, compile and warm-up steps
excluded, as speedrun counts them), ``steps``, ``train_seconds``, ``val_loss`` and ``val_bpb`` (the float model
after training), ``val_bpb_quant`` (the artifact's round trip), ``artifact_bytes``, ``peak_mem_mb``, ``params``
and ``stall_seconds`` (speedrun.bench.pace, from the logged steps' train times). A metric the log does not hold is
left out (a run cut short prints fewer lines).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from speedrun.bench.pace import stall_seconds

Metrics = dict[str, float | int]

_NUM = r"([-+0-9.eE]+)"


def _last(pattern: str, text: str) -> re.Match[str] | None:
    """The last line matching ``pattern``: a log repeats a line as training goes, and the last one is the run's."""
    matches = list(re.finditer(pattern, text, flags=re.MULTILINE))
    return matches[-1] if matches else None


def _common(text: str, out: Metrics) -> None:
    """Lines both trainers print the same way."""
    if m := _last(r"^model_params:(\d+)", text):
        out["params"] = int(m.group(1))
    if m := _last(r"^peak memory allocated: (\d+) MiB", text):
        out["peak_mem_mb"] = int(m.group(1))  # MiB, as speedrun's peak_mem_mb (bytes / 2**20)


def pgolf_baseline(text: str, env: Mapping[str, str]) -> Metrics:
    """parameter-golf's train_gpt.py (the repository root's): lines such as
    ``step:100/20000 train_loss:2.1 train_time:36400ms step_avg:364.00ms``, the last step's
    ``step:N/20000 val_loss:2.1 val_bpb:1.26 train_time:...``, ``Total submission size int8+zlib: N bytes`` and
    ``final_int8_zlib_roundtrip_exact val_loss:... val_bpb:...``."""
    out: Metrics = {}
    batch = int(env.get("TRAIN_BATCH_TOKENS", "524288"))
    step_line = r"^step:(\d+)/\d+ (?:train_loss|val_loss):\S+.*?train_time:(\d+)ms"
    if m := _last(step_line, text):
        steps, ms = int(m.group(1)), int(m.group(2))
        out["steps"] = steps
        out["train_seconds"] = ms / 1e3
        out["tokens"] = steps * batch
        if ms > 0:
            out["tokens_per_s"] = steps * batch / (ms / 1e3)
    points = [(int(m.group(1)), int(m.group(2)) / 1e3) for m in re.finditer(step_line, text, flags=re.MULTILINE)]
    if (stalled := stall_seconds(points)) is not None:
        out["stall_seconds"] = stalled
    if m := _last(rf"^step:\d+/\d+ val_loss:{_NUM} val_bpb:{_NUM}", text):
        out["val_loss"], out["val_bpb"] = float(m.group(1)), float(m.group(2))
    if m := _last(rf"^final_int8_zlib_roundtrip_exact val_loss:{_NUM} val_bpb:{_NUM}", text):
        out["val_loss_quant"], out["val_bpb_quant"] = float(m.group(1)), float(m.group(2))
    if m := _last(r"^Total submission size int8\+zlib: (\d+) bytes", text):
        out["artifact_bytes"] = int(m.group(1))
    _common(text, out)
    return out


def pgolf_record(text: str, env: Mapping[str, str]) -> Metrics:
    """parameter-golf's 2026-04-29 record (records/track_10min_16mb/2026-04-29_*/train_gpt.py): lines such as
    ``500/20000 train_loss: 2.5584 train_time: 0.8m tok/s: 8313753``, ``layer_loop:enabled step:2180 frac:0.350``,
    ``stopping_early: wallclock_cap train_time: 592045ms step: 4921/20000``,
    ``diagnostic pre-quantization post-ema val_loss:2.33 val_bpb:1.06 eval_time:9082ms``,
    ``diagnostic quantized val_loss:... val_bpb:...`` and ``Total submission size quantized+brotli: N bytes``.

    ``tokens_per_s_before_loop`` and ``_with_loop`` split training where the layer loop switched on, as speedrun's
    derived metrics of the same names do: the switch is at ``frac`` of the budget left after the GPTQ reserve
    (``gptq:reserving 8.0s, effective=592000ms``), so its train time is ``frac`` x that budget."""
    out: Metrics = {}
    batch = int(env.get("TRAIN_BATCH_TOKENS", "786432"))
    seconds = None
    if m := _last(r"^stopping_early: wallclock_cap train_time: (\d+)ms step: (\d+)/\d+", text):
        seconds, out["steps"] = int(m.group(1)) / 1e3, int(m.group(2))
    elif m := _last(rf"^(\d+)/\d+ train_loss: \S+ train_time: {_NUM}m", text):
        seconds, out["steps"] = float(m.group(2)) * 60, int(m.group(1))  # minutes to one decimal: coarse
    if seconds:
        out["train_seconds"] = seconds
        out["tokens"] = int(out["steps"]) * batch
        out["tokens_per_s"] = out["tokens"] / seconds
    # a step line's tok/s is steps x batch over its train time, so it gives that time to far better than the
    # line's minutes
    rate_line = r"^(\d+)/\d+ train_loss: \S+ train_time: \S+m tok/s: (\d+)"
    points = [
        (int(m.group(1)), int(m.group(1)) * batch / int(m.group(2)))
        for m in re.finditer(rate_line, text, flags=re.MULTILINE)
        if int(m.group(2)) > 0
    ]
    if m := _last(r"^stopping_early: wallclock_cap train_time: (\d+)ms step: (\d+)/\d+", text):
        points.append((int(m.group(2)), int(m.group(1)) / 1e3))
    if (stalled := stall_seconds(points)) is not None:
        out["stall_seconds"] = stalled
    loop = _last(r"^layer_loop:enabled step:(\d+) frac:([0-9.]+)", text)
    budget = _last(r"^gptq:reserving \S+s, effective=(\d+)ms", text)
    if loop and budget and seconds:
        at_step, at_seconds = int(loop.group(1)), float(loop.group(2)) * int(budget.group(1)) / 1e3
        if at_seconds > 0:
            out["tokens_per_s_before_loop"] = at_step * batch / at_seconds
        if seconds > at_seconds:
            out["tokens_per_s_with_loop"] = (int(out["steps"]) - at_step) * batch / (seconds - at_seconds)
    if m := _last(rf"^diagnostic pre-quantization post-ema val_loss:{_NUM} val_bpb:{_NUM}", text):
        out["val_loss"], out["val_bpb"] = float(m.group(1)), float(m.group(2))
    if m := _last(rf"^diagnostic quantized val_loss:{_NUM} val_bpb:{_NUM}", text):
        out["val_loss_quant"], out["val_bpb_quant"] = float(m.group(1)), float(m.group(2))
    if m := _last(rf"^quantized_ttt_phased val_loss:{_NUM} val_bpb:{_NUM}", text):
        out["val_loss_ttt"], out["val_bpb_ttt"] = float(m.group(1)), float(m.group(2))
    if m := _last(r"^Total submission size quantized\+\w+: (\d+) bytes", text):
        out["artifact_bytes"] = int(m.group(1))
    _common(text, out)
    return out


READY_LINES: dict[str, str] = {
    "pgolf_baseline": r"^step:\d+/\d+ train_loss:",
    "pgolf_record": r"^\d+/\d+ train_loss: ",
}
"""Per parser, its script's first training-step line, where the runner's ``startup_seconds`` ends: it counts that
first step too, under a second for either script on an H100."""

PARSERS: dict[str, Callable[[str, Mapping[str, str]], Metrics]] = {
    "pgolf_baseline": pgolf_baseline,
    "pgolf_record": pgolf_record,
}
"""Parsers by the name a PeerArm gives."""
