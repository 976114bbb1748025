"""Run `python -m run` once per line of overrides and print one table of what each run recorded.

    python scripts/bench_matrix.py --out bench.md -- "model=pgolf_baseline budget.train_seconds=60" \
        "model=pgolf_baseline attn.kernel=cudnn budget.train_seconds=60"

Each case is a separate process (a fresh CUDA context, compile cache aside), so one failure does not stop the
rest; failures are rows with their status and error. The table is printed last and written as Markdown and CSV.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

COLUMNS = (
    "case",
    "status",
    "device_name",
    "hardware",
    "emulated",
    "attn_kernel",
    "precision",
    "tokens_per_s",
    "mfu",
    "peak_mem_mb",
    "val_bpb",
    "val_bpb_quant",
    "artifact_bytes",
    "steps",
    "train_seconds",
    "compile_seconds",
    "error",
)


def run_case(overrides: list[str], extra: list[str], timeout: float) -> dict:
    marker = f"bench-{time.time_ns()}"
    cmd = [sys.executable, "-m", "run", *overrides, *extra, f"name={marker}"]
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    try:
        proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True)
        tail = (proc.stdout + proc.stderr)[-4000:]
    except subprocess.TimeoutExpired as e:
        tail = f"timeout after {timeout:.0f}s: {e}"
    found = sorted(Path("outputs/runs").glob(f"*/*_{marker}/result.json"))
    if not found:
        print(tail, flush=True)
        return {"status": "no result", "error": tail[-300:]}
    result = json.loads(found[-1].read_text())
    if result.get("status") != "ok":
        print(tail, flush=True)
    return result


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value).replace("|", "/")[:120]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="one quoted string of overrides per run")
    parser.add_argument("--common", default="", help="overrides added to every case")
    parser.add_argument("--out", type=Path, default=Path("bench.md"), help="Markdown table (CSV beside it)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    args = parser.parse_args()
    rows = []
    for case in args.cases:
        result = run_case(shlex.split(case), shlex.split(args.common), args.timeout)
        rows.append({"case": case, **{k: result.get(k) for k in COLUMNS if k != "case"}})
        print(
            f"  -> {rows[-1]['status']} {fmt(rows[-1]['tokens_per_s'])} tok/s val_bpb {fmt(rows[-1]['val_bpb'])}",
            flush=True,
        )
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in COLUMNS) + " |" for r in rows]
    table = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table + "\n")
    with open(args.out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(table)


if __name__ == "__main__":
    main()
