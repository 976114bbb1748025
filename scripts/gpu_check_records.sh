#!/usr/bin/env bash
# GPU check of the records work (issues 13 and 15): what a real card records for the artifact (code counted raw),
# MFU against the card that ran (and mfu_profile when emulating), per-stage MFU of a progressive schedule, and a
# forced CUDA out-of-memory recorded as status oom with its allocation snapshot. About 3 minutes on an H100.
#
# On the offline GPU machine:
#   . scripts/device_env.sh && bash scripts/gpu_check_records.sh
# Writes $OUT/records/: summary.txt (the table below), results.json (every run's result.json), oom_error.txt
# (the OOM run's traceback file) and console.txt (all runs' output). Exits non-zero if a check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out=${OUT:-/tmp/out}/records
work=$(mktemp -d /tmp/records.XXXXXX)
mkdir -p "$out"
common=(data.cache_dir="$work/cache" results_db="$work/results.sqlite" logger.log_every_seconds=5)
log="$out/console.txt"
: >"$log"

run() {  # run <name> <timeout s> overrides...: one `python -m run` into $work/<name>
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*" | tee -a "$log"
  timeout "$limit" "$py" -m run "${common[@]}" name="$name" hydra.run.dir="$work/$name" "$@" >>"$log" 2>&1
  echo "rc=$? ($name)" | tee -a "$log"
}

# 1. pgolf_baseline as `python -m run` runs it (auto profile, compiled), 30 steps, a 262k-token eval.
run baseline 120 model=pgolf_baseline budget.max_steps=30 eval.tokens=262144
# 2. pgolf_progressive (1024 -> 2048 -> 3072) in eager mode, 10 steps with stages by step: per-stage MFU. zlib
#    instead of brotli-11 to keep the export to seconds; TTT capped at 5 s.
run progressive 150 experiment=pgolf_progressive hardware.compile=false budget.max_steps=10 budget.warmup_steps=0 \
  schedule.progress=step eval.tokens=131072 quant.compressor=zlib quant.level=9 quant.calib_batches=2 ttt.max_seconds=5
# 3. Profiles that are not the card: hardware=h100 (emulated on an H200, native on an H100) and hardware=a100
#    (emulated on both): mfu divides by the card that ran, mfu_profile by the profile's peak.
for hw in h100 a100; do
  run "emulate_$hw" 90 hardware=$hw model=pgolf_baseline hardware.compile=false budget.max_steps=3 \
    budget.warmup_steps=0 budget.tokens_per_step=65536 eval.tokens=32768
done
# 4. A real CUDA OOM: math attention at 8192 tokens keeps ~230 GB of B x H x T x T scores. The resolver refuses
#    that before any work (check_scores_memory), so this run bypasses the check, as only a test may.
echo "=== oom: attn=math model.seq_len=8192, resolver's memory check bypassed" | tee -a "$log"
timeout 120 "$py" - "${common[@]}" name=oom hydra.run.dir="$work/oom" model=pgolf_baseline attn=math \
  model.seq_len=8192 hardware.micro_batch=8 budget.tokens_per_step=65536 hardware.compile=false \
  budget.warmup_steps=0 budget.max_steps=3 hardware.memory_snapshot=true >>"$log" 2>&1 <<'EOF'
import runpy, sys
import speedrun.plan

speedrun.plan.check_scores_memory = lambda *args, **kwargs: None  # test-only: let the OOM happen
sys.argv = ["run"] + sys.argv[1:]
runpy.run_module("run", run_name="__main__", alter_sys=True)
EOF
echo "rc=$? (oom; 1 expected)" | tee -a "$log"
cp "$work/oom/error.txt" "$out/oom_error.txt" 2>/dev/null

"$py" - "$work" "$out" <<'EOF' | tee "$out/summary.txt"
import json, sys
from pathlib import Path

from speedrun.finishing.artifact import SRC
from speedrun.hardware.profiles import PROFILES
from speedrun.finishing.quantize import compress
from speedrun.model.shape import ModelShape

work, out = Path(sys.argv[1]), Path(sys.argv[2])
names = ["baseline", "progressive", "emulate_h100", "emulate_a100", "oom"]
results, failures = {}, []
for name in names:
    path = work / name / "result.json"
    results[name] = json.loads(path.read_text()) if path.exists() else None
(out / "results.json").write_text(json.dumps(results, indent=1, default=str))


def old_rule(name, r):
    """artifact_bytes as the code before this change counted it: every .py of the package + run.py, compressed
    with the model's compressor and level (the tree as it is now)."""
    level = json.loads((work / name / "plan.json").read_text())["quant"]["level"]
    code = b"".join(p.read_bytes() for p in sorted((SRC / "speedrun").rglob("*.py"))) + (SRC / "run.py").read_bytes()
    return r["artifact_model_bytes"] + len(compress(code, r["compressor"], level))


def old_mfu(name, r):
    """mfu as the code before this change computed it: every token at the longest length, over the profile's peak."""
    plan = json.loads((work / name / "plan.json").read_text())
    shape = ModelShape(**plan["model"])
    peak = PROFILES[r["hardware"]].peak_flops(plan["matmul_dtype"])
    if not (peak and r["train_seconds"]):
        return None
    return round(r["tokens"] * shape.flops_per_token(shape.seq_len) / r["train_seconds"] / peak, 4)


keys = ["status", "phase", "device_name", "card", "hardware", "emulated", "steps", "tokens_per_s", "mfu", "mfu_profile",
        "train_flops", "flops_per_token", "artifact_model_bytes", "artifact_code_bytes", "artifact_bytes",
        "artifact_ok", "val_bpb", "val_bpb_quant", "val_bpb_ttt", "val_bpb_ttt_base", "eval_tokens",
        "eval_fingerprint", "peak_mem_mb", "memory_estimate_gb", "stages", "error"]
for name in names:
    r = results[name]
    print(f"--- {name}")
    if r is None:
        print("  no result.json")
        failures.append(f"{name}: no result.json")
        continue
    for k in keys:
        if r.get(k) is not None:
            print(f"  {k:<22} {r[k]}")
    if r.get("artifact_bytes"):
        old = old_rule(name, r)
        print(f"  {'old-rule artifact':<22} {old} (code compressed; artifact_ok would read {old <= 16_000_000})")
    if r.get("status") == "ok":
        print(f"  {'old-rule mfu':<22} {old_mfu(name, r)} (every token at the longest length, profile peak)")

for name in ("baseline", "progressive", "emulate_h100", "emulate_a100"):
    r = results[name] or {}
    if r.get("status") != "ok":
        failures.append(f"{name}: status {r.get('status')}: {r.get('error')}")
    elif r.get("artifact_bytes") != r["artifact_model_bytes"] + r["artifact_code_bytes"]:
        failures.append(f"{name}: artifact_bytes is not model + code")
    elif r.get("card") and r.get("mfu") is None:
        failures.append(f"{name}: a known card ({r['card']}) but no mfu")
if (results["emulate_a100"] or {}).get("emulated") and (results["emulate_a100"] or {}).get("mfu_profile") is None:
    failures.append("emulate_a100: emulated but no mfu_profile")
oom = results["oom"] or {}
snapshot = oom.get("memory_snapshot")
print(f"--- oom snapshot: {snapshot} ({Path(snapshot).stat().st_size if snapshot and Path(snapshot).exists() else 0} bytes)")
if oom.get("status") != "oom" or not snapshot or not Path(snapshot).exists():
    failures.append(f"oom: status {oom.get('status')}, snapshot {snapshot}")
print("FAILED: " + "; ".join(failures) if failures else "all records checks passed")
sys.exit(1 if failures else 0)
EOF
rc=${PIPESTATUS[0]}
rm -rf "$work"
exit "$rc"
