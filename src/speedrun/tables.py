"""Text formatting shared by the sweep summary and the report: numbers, mean ± std cells, aligned Markdown tables
and CSV text, and the result block every run ends with. Nothing here knows about runs or groups, so both sides
import it without importing each other, and an exported train_gpt.py prints its block with the same code.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any


def fmt_number(value: Any, spec: str = "{:.4g}") -> str:
    """A number through ``spec`` ("" for None, "nan" for NaN); anything ``spec`` cannot format as its str."""
    if value is None:
        return ""
    if isinstance(value, float) and value != value:
        return "nan"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def mean_std_cell(m: float | None, s: float | None, spec: str) -> str:
    """``mean ± std`` (std left out below two values, the cell empty without a mean)."""
    if m is None:
        return ""
    return fmt_number(m, spec) + (f" ± {fmt_number(s, spec)}" if s is not None else "")


def fmt_p(p: float) -> str:
    """A p-value: scientific below 1e-3, where four decimals would print 0.0000."""
    return f"{p:.2e}" if p < 1e-3 else f"{p:.4f}"


def display(value: Any) -> str:
    """A key's value as a table shows it: ``null`` for None, floats to 6 significant digits."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def first_line(text: Any, limit: int = 160) -> str:
    """The first line of an error message, cut to ``limit`` characters."""
    line = str(text or "").strip().splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table padded to aligned columns, readable as plain text on a console too."""
    cells = [[str(h) for h in headers]] + [[("" if c is None else str(c)).replace("|", "\\|") for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def csv_text(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    """CSV with a header; keys a row lacks are empty cells, keys outside ``columns`` are dropped."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)  # DictWriter writes None as an empty cell
    return buf.getvalue()


# The grep-able end of every run, printed by python -m run and by an exported train_gpt.py alike: one aligned
# ``key: value`` line per result key (scripts read it).
BLOCK_KEYS = (
    "status",
    "val_bpb",
    "val_loss",
    "val_bpb_quant",
    "val_bpb_ttt",
    "val_bpb_ttt_base",
    "ttt_complete",
    "artifact_bytes",
    "artifact_model_bytes",
    "artifact_code_bytes",
    "artifact_ok",
    "tokens_per_s",
    "mfu",
    "mfu_profile",
    "peak_mem_mb",
    "steps",
    "tokens",
    "epochs",
    "train_seconds",
    "reached",
    "time_to_target",
    "steps_to_target",
    "tokens_to_target",
    "compile_seconds",
    "eval_seconds",
    "eval_tokens",
    "eval_complete",
    "eval_complete_quant",
    "eval_fingerprint",
    "tokenizer_sha256",
    "data",
    "params",
    "hardware",
    "device_name",
    "world_size",
    "card",
    "emulated",
    "attn_kernel",
    "precision",
    "seed",
    "phase",
    "run_dir",
    "error",
)


def format_result_block(result: dict[str, Any]) -> str:
    """The grep-able end of every run: one aligned ``key: value`` per line."""
    width = max(len(k) for k in BLOCK_KEYS)
    lines = []
    for key in BLOCK_KEYS:
        value = result.get(key)
        if isinstance(value, float) and math.isfinite(value):
            value = f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
        lines.append(f"{key + ':':<{width + 1}} {value}")
    return "\n".join(lines)
