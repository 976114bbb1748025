"""Helpers of scripts/gpu_check_dist.sh.

python scripts/dist_check.py compare RUN_DIR_1GPU RUN_DIR_NGPU --out DIR [--min-ratio R]
    tokens/s of both runs and their ratio (against R when given: the multi-GPU issue's bar is 1.90 on 2 GPUs and
    3.70 on 4), the per-step training loss of both (curves.csv, curves.png when matplotlib is there), and how far
    apart the curves are; summary.json in DIR.
torchrun --standalone --nproc_per_node=2 scripts/dist_check.py allreduce --params N --out FILE
    what one step's gradient all-reduce costs (N fp32 values, as speedrun.distributed.world.World.sync_grads sends them):
    the most an overlap with the backward (DDP) could save per step.
python scripts/dist_check.py faults --out DIR -- OVERRIDES...
    `python -m run dist.nproc=2 OVERRIDES` twice: rank 1 raising at its second training step (failed row
    with rank 1's error, every rank gone in bounded time), then Ctrl-C once training runs (interrupted row).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path


def _losses(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("train_loss") is not None:
            out[int(record["step"])] = float(record["train_loss"])
    return out


def compare(one: Path, many: Path, out: Path, min_ratio: float | None = None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    r1, rn = (json.loads((d / "result.json").read_text()) for d in (one, many))
    l1, ln = _losses(one), _losses(many)
    steps = sorted(set(l1) & set(ln))
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss_1gpu", f"loss_{rn.get('world_size')}gpu", "diff"])
        for s in steps:
            w.writerow([s, l1[s], ln[s], ln[s] - l1[s]])
    diffs = [abs(ln[s] - l1[s]) for s in steps]
    late = [abs(ln[s] - l1[s]) for s in steps if s > 20]  # past the first, steepest steps
    keys = (
        "status",
        "world_size",
        "steps",
        "tokens_per_s",
        "train_seconds",
        "compile_seconds",
        "mfu",
        "peak_mem_mb",
        "val_bpb",
        "val_bpb_quant",
        "recompiles",
        "device_name",
        "gpu_names",
    )
    summary = {
        "one_gpu": {k: r1.get(k) for k in keys},
        "many_gpus": {k: rn.get(k) for k in keys},
        "tokens_per_s_ratio": (rn["tokens_per_s"] / r1["tokens_per_s"])
        if r1.get("tokens_per_s") and rn.get("tokens_per_s")
        else None,
        "tokens_per_s_min_ratio": min_ratio,
        "steps_compared": len(steps),
        "loss_abs_diff_max": max(diffs) if diffs else None,
        "loss_abs_diff_mean": sum(diffs) / len(diffs) if diffs else None,
        "loss_abs_diff_mean_after_step_20": sum(late) / len(late) if late else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{'':28} {'1 GPU':>14} {str(rn.get('world_size')) + ' GPUs':>14}")
    for key in ("tokens_per_s", "train_seconds", "compile_seconds", "steps", "mfu", "peak_mem_mb", "val_bpb"):
        print(f"{key:28} {r1.get(key)!s:>14} {rn.get(key)!s:>14}")
    ratio = summary["tokens_per_s_ratio"]
    print(f"tokens/s ratio               {ratio}")
    if min_ratio is not None:
        verdict = "n/a (a run has no tokens/s)" if ratio is None else ("meets" if ratio >= min_ratio else "BELOW")
        print(f"tokens/s ratio >= {min_ratio}:      {verdict}")
    print(
        f"per-step loss, {len(steps)} steps: |diff| max {summary['loss_abs_diff_max']}, mean "
        f"{summary['loss_abs_diff_mean']}, mean after step 20 {summary['loss_abs_diff_mean_after_step_20']}"
    )
    for s in [s for s in steps if s in (1, 2, 5, 10, 20, 50, 100, 150, 200)]:
        print(f"  step {s:>4}: {l1[s]:.4f}  {ln[s]:.4f}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: curves.csv only")
        return 0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot(steps, [l1[s] for s in steps], label=f"1 GPU ({r1.get('device_name')})")
    top.plot(steps, [ln[s] for s in steps], label=f"{rn.get('world_size')} GPUs", alpha=0.8)
    top.set_ylabel("train loss")
    ratio = summary["tokens_per_s_ratio"]
    title = f"{r1.get('model')}, same seed and tokens per step"
    top.set_title(title + (f"; tokens/s ratio {ratio:.3f}" if ratio else ""))
    top.legend()
    bottom.plot(steps, [ln[s] - l1[s] for s in steps], color="gray")
    bottom.axhline(0, color="black", linewidth=0.5)
    bottom.set_ylabel("difference")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    print(f"wrote {out / 'curves.png'}")
    return 0


def allreduce(params: int, out: Path, iters: int = 30) -> int:
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    flat = torch.randn(params, device="cuda")
    for _ in range(5):
        dist.all_reduce(flat)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(flat)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / iters * 1e3
    if rank == 0:
        gb = params * 4 / 1e9
        record = {
            "params": params,
            "bytes": params * 4,
            "ms_per_all_reduce": ms,
            "algbw_GBps": gb / (ms / 1e3),
            "world_size": dist.get_world_size(),
            "device": torch.cuda.get_device_name(local),
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
        }
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"all-reduce of {params:,} fp32 ({gb * 1e3:.0f} MB) on {dist.get_world_size()} GPUs: {ms:.2f} ms")
    dist.destroy_process_group()
    return 0


INJECT = """import os
if os.environ.get("RANK") == "1":
    import speedrun.training.loop as t
    call, n = t.Stepper.__call__, [0]
    def failing(self, batches):
        n[0] += 1
        if n[0] == 3:  # warm-up is the first call
            raise RuntimeError("injected failure on rank 1")
        return call(self, batches)
    t.Stepper.__call__ = failing
"""


def faults(out: Path, overrides: list[str]) -> int:
    import signal
    import sqlite3
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    (out / "inject").mkdir(exist_ok=True)
    (out / "inject" / "sitecustomize.py").write_text(INJECT)
    db = out / "faults.sqlite"
    base = [sys.executable, "-m", "run", "dist.nproc=2", *overrides, f"results_db={db}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ok = True

    def row(run_dir: Path) -> dict:
        con = sqlite3.connect(db)
        con.row_factory = sqlite3.Row
        found = [dict(r) for r in con.execute("SELECT * FROM runs WHERE run_id = ?", (str(run_dir.resolve()),))]
        return found[0] if found else {}

    fail_env = {**env, "PYTHONPATH": os.pathsep.join([str(out / "inject"), env.get("PYTHONPATH", "")])}
    t0 = time.time()
    with open(out / "fail_rank1.log", "w") as log:
        rc = subprocess.call(
            [*base, "name=fail_rank1", f"hydra.run.dir={out / 'fail_rank1'}"],
            env=fail_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    r = row(out / "fail_rank1")
    good = r.get("status") == "failed" and str(r.get("error")).startswith("rank 1: RuntimeError: injected")
    ok &= good and rc != 0
    print(
        f"rank 1 raises: exit {rc} after {time.time() - t0:.0f}s (start-up and warm-up included); row "
        f"{r.get('status')}: {r.get('error')}  -> {'OK' if good else 'NOT OK'}"
    )

    proc = subprocess.Popen(
        [*base, "name=ctrl_c", f"hydra.run.dir={out / 'ctrl_c'}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with open(out / "ctrl_c.log", "w") as log:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if "tok/s" in line:
                break
        sent = time.time()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=300)
        log.write(rest)
    r = row(out / "ctrl_c")
    good = r.get("status") == "interrupted" and (r.get("steps") or 0) > 0
    ok &= good
    print(
        f"Ctrl-C: every process gone {time.time() - sent:.1f}s after SIGINT, exit {proc.returncode}; row "
        f"{r.get('status')} after {r.get('steps')} steps  -> {'OK' if good else 'NOT OK'}"
    )
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("one", type=Path)
    c.add_argument("many", type=Path)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--min-ratio", type=float, default=None, help="the tokens/s ratio the multi-GPU run should reach")
    a = sub.add_parser("allreduce")
    a.add_argument("--params", type=int, required=True)
    a.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("faults")
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    if args.cmd == "compare":
        return compare(args.one, args.many, args.out, args.min_ratio)
    if args.cmd == "faults":
        return faults(args.out, args.overrides)
    return allreduce(args.params, args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
