"""Measure the GPU-pool launcher: one 4-job sweep on every visible GPU at once, then the same 4 jobs one at a time
(the pool restricted to the first GPU). Prints both wall times, where and when each job ran, and a short table.

    python scripts/bench_sweep_gpus.py                              # seed=0,1,2,3, 20 s training budget each
    python scripts/bench_sweep_gpus.py --budget 30 --out $OUT -- attn=sdpa model=pgolf_baseline
    python scripts/bench_sweep_gpus.py --mode pool                  # only the parallel half (or --mode seq)

Everything goes under --out (sweep dirs, a results.sqlite of its own, bench_sweep_gpus.md), so outputs/ is left
alone. Wall time is the whole `python -m run -m ...` command: composition, process start, compile, training,
evaluation and export of every job.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

from hydra_plugins.speedrun_plugins.pool_launcher import visible_gpus  # noqa: E402


def run_sweep(
    label: str, out: Path, jobs: int, budget: float, gpus: list[str], extra: list[str], timeout: float
) -> dict:
    sweep_dir = out / label
    cmd = [
        sys.executable,
        "-m",
        "run",
        "-m",
        f"seed={','.join(str(i) for i in range(jobs))}",
        f"budget.train_seconds={budget:g}",
        f"name=bench_{label}",
        f"results_db={out / 'results.sqlite'}",
        f"hydra.sweep.dir={sweep_dir}",
        f"hydra.launcher.gpus=[{','.join(gpus)}]",
        *extra,
    ]
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    start = time.time()
    with open(out / f"{label}.log", "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.time() - start
    return {"label": label, "wall": wall, "rc": rc, "start": start, "jobs": read_jobs(sweep_dir, out)}


def read_jobs(sweep_dir: Path, out: Path) -> list[dict]:
    manifest = sweep_dir / "sweep.json"
    if not manifest.exists():
        return []
    db = sqlite3.connect(out / "results.sqlite")
    db.row_factory = sqlite3.Row
    jobs = []
    for job in json.loads(manifest.read_text())["jobs"]:
        run_dir = Path(job["run_dir"]) if job.get("run_dir") else None
        row = db.execute("SELECT * FROM runs WHERE run_id = ?", (str(run_dir),)).fetchone() if run_dir else None
        env = json.loads((run_dir / "env.json").read_text()) if run_dir and (run_dir / "env.json").exists() else {}
        jobs.append(
            {
                "overrides": " ".join(o for o in job["overrides"] if o.startswith("seed=")),
                "status": row["status"] if row else job.get("status"),
                "gpu": env.get("cuda_visible_devices"),
                "device": row["device_name"] if row else None,
                "t0": row["started_at"] if row else None,
                "t1": row["finished_at"] if row else None,
                "tokens_per_s": row["tokens_per_s"] if row else None,
                "val_bpb": row["val_bpb"] if row else None,
                "error": row["error"] if row else job.get("error"),
            }
        )
    return jobs


def max_concurrency(jobs: list[dict]) -> int:
    events = sorted(
        [(j["t0"], 1) for j in jobs if j["t0"] and j["t1"]] + [(j["t1"], -1) for j in jobs if j["t0"] and j["t1"]]
    )
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def fmt(v, spec="{:.1f}") -> str:
    return "" if v is None else spec.format(v) if isinstance(v, (int, float)) else str(v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("extra", nargs="*", help="overrides for every job (after --)")
    p.add_argument("--jobs", type=int, default=4, help="jobs per sweep (seed=0..N-1)")
    p.add_argument("--budget", type=float, default=20.0, help="budget.train_seconds per job")
    p.add_argument("--mode", choices=("both", "pool", "seq"), default="both")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "outputs/bench_sweep_gpus")))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per sweep")
    args = p.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = visible_gpus()
    if not gpus:
        print("no GPU visible: this benchmark compares parallel and sequential sweeps on GPUs", file=sys.stderr)
        return 2
    print(f"visible GPUs: {gpus}; {args.jobs} jobs, budget.train_seconds={args.budget:g}", flush=True)
    sweeps = []
    if args.mode in ("both", "pool"):
        sweeps.append(run_sweep("pool", args.out, args.jobs, args.budget, gpus, args.extra, args.timeout))
    if args.mode in ("both", "seq"):
        sweeps.append(run_sweep("seq", args.out, args.jobs, args.budget, gpus[:1], args.extra, args.timeout))

    lines = [
        "| sweep | job | status | GPU | device | start s | end s | tokens/s | val_bpb |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in sweeps:
        for j in s["jobs"]:
            lines.append(
                f"| {s['label']} | {j['overrides']} | {j['status']} | {j['gpu']} | {j['device']} | "
                f"{fmt(j['t0'] and j['t0'] - s['start'])} | {fmt(j['t1'] and j['t1'] - s['start'])} | "
                f"{fmt(j['tokens_per_s'], '{:,.0f}')} | {fmt(j['val_bpb'], '{:.4f}')} |"
            )
    summary = []
    for s in sweeps:
        used = sorted({j["gpu"] for j in s["jobs"] if j["gpu"] is not None})
        summary.append(
            f"{s['label']}: wall {s['wall']:.1f} s, exit {s['rc']}, {len(s['jobs'])} jobs, "
            f"GPUs used {used}, at most {max_concurrency(s['jobs'])} running at once"
        )
    if len(sweeps) == 2 and sweeps[0]["wall"] > 0:
        summary.append(
            f"speed-up pool vs sequential: {sweeps[1]['wall'] / sweeps[0]['wall']:.2f}x on {len(gpus)} GPU(s)"
        )
    for s in sweeps:
        for j in s["jobs"]:
            if j["status"] != "ok":
                summary.append(
                    f"{s['label']} {j['overrides']}: {j['status']}: {j['error']} (see {args.out / s['label']})"
                )
    text = "\n".join(lines) + "\n\n" + "\n".join(summary) + "\n"
    (args.out / "bench_sweep_gpus.md").write_text(text)
    print("\n" + text, flush=True)
    return 0 if all(s["rc"] in (0,) for s in sweeps) else 1


if __name__ == "__main__":
    sys.exit(main())
