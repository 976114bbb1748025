#!/usr/bin/env bash
# One run on 2 GPUs against the same run on 1 GPU, on the offline 2-GPU device machine (about 4 minutes):
#   . scripts/device_env.sh && bash scripts/gpu_check_dist.sh                # pgolf_baseline, 1 vs 2 GPUs
#   NPROC=4 bash scripts/gpu_check_dist.sh                                   # 1 vs 4 GPUs (~4 min on 4 GPUs)
#   . scripts/device_env.sh && bash scripts/gpu_check_dist.sh progressive    # pgolf_progressive on 2 GPUs, briefly
#   NPROC=4 PROGRESSIVE_ARGS='budget.train_seconds=30 ttt.max_seconds=15 quant.compressor=zlib quant.level=9' \
#     bash scripts/gpu_check_dist.sh progressive                            # on 4 GPUs, ~200 s (what was measured)
#   . scripts/device_env.sh && bash scripts/gpu_check_dist.sh slurm_local    # the SLURM path, submitit's local executor
#   . scripts/device_env.sh && bash scripts/gpu_check_dist.sh faults         # a rank raising, Ctrl-C, with NCCL
# Results under $OUT/dist/ (or ./dist_check/ without $OUT).
#
# baseline: model=pgolf_baseline, seed 0, 200 steps of 524,288 tokens on the embedded corpus, on 1 GPU and then
#   on 2 (dist.nproc=2: 4 micro-batches per rank instead of 8); both record every step's loss in metrics.jsonl
#   (logger.dense, the default: losses stay on the GPU and are copied out every 100 steps, so no step waits for
#   the host; until 2026-11-26 the script printed a line per step, which put a host sync in every step of both
#   runs, a fixed cost that weighs more on the shorter multi-GPU step). tokens/s excludes compilation
#   (compile_seconds). Then: the tokens/s ratio, the two per-step loss curves (curves.csv, curves.png), the cost
#   of one gradient all-reduce of the model's size (allreduce.json: what DDP's overlap could save at most), and
#   which processes hold GPU memory during the multi-GPU run (nvidia_smi_apps.txt: the launching process should
#   hold none, or little).
# progressive: experiment=pgolf_progressive on NPROC GPUs (default 2; context 1024 -> 2048 -> 3072, int6 GPTQ + brotli, TTT) with
#   a 60 s training budget and 40 s of TTT; recompiles must be 0.
# faults: pgolf_baseline (compile off, to get there fast) on 2 GPUs, rank 1 raising at its second step (the row must
#   say failed with rank 1's error, the ranks must all end), then Ctrl-C once training runs (interrupted).
# slurm_local: pgolf_baseline for 50 steps as one sweep job of 2 tasks through hydra/launcher=slurm_local (submitit
#   maps its job environment to the rendezvous, as on a cluster). Needs submitit, hydra-submitit-launcher and
#   cloudpickle on the device (pure-Python wheels: `pip download --no-deps submitit hydra-submitit-launcher
#   cloudpickle -d .whl` on a machine with network, then carry .whl as device_env.sh expects).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out=${OUT:-$PWD/dist_check}/dist
mkdir -p "$out"
# NVLink multicast stays off on the lent machines (KINDS.md); speedrun sets these in every rank as well.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
start=$SECONDS
ngpu=$("$py" -c "import torch; print(torch.cuda.device_count())")
if [ "$ngpu" -lt "${NPROC:-2}" ]; then
  echo "gpu_check_dist.sh: needs ${NPROC:-2} GPUs, $ngpu visible" >&2
  exit 2
fi
"$py" -c "import torch; print([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], 'torch', torch.__version__)" \
  | tee "$out/device.txt"
common=(seed=0 results_db="$out/results.sqlite" hydra.job.chdir=false)

if [ "${1:-baseline}" = progressive ]; then
  n=${NPROC:-2}
  # shellcheck disable=SC2086 - PROGRESSIVE_ARGS is a list of overrides
  "$py" -m run experiment=pgolf_progressive dist.nproc="$n" "${common[@]}" name="progressive_${n}gpu" \
    budget.train_seconds=60 ttt.max_seconds=40 logger.log_every_seconds=5 hydra.run.dir="$out/progressive_${n}gpu" \
    ${PROGRESSIVE_ARGS:-} 2>&1 | tee "$out/progressive_${n}gpu.log" \
    | grep -E "starting|context stage|step .*tok/s|eval|quant|ttt|warm-up|^(status|val_bpb|recompiles|error)"
  "$py" - "$out/progressive_${n}gpu/result.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
keys = ("status", "world_size", "steps", "tokens_per_s", "mfu", "stages", "recompiles", "val_bpb", "val_bpb_quant",
        "val_bpb_ttt", "ttt_fraction", "artifact_bytes", "artifact_ok", "train_seconds", "eval_seconds", "error")
for k in keys:
    print(f"{k:>16}: {r.get(k)}")
ok = r.get("status") == "ok" and r.get("recompiles") == 0
print(f"progressive on {r.get('world_size')} GPUs:", "OK" if ok else "NOT OK (status or recompiles)")
sys.exit(0 if ok else 1)
EOF
  rc=$?
  echo "gpu_check_dist.sh progressive: ${SECONDS}s, results in $out"
  exit $rc
fi

if [ "${1:-baseline}" = faults ]; then
  "$py" scripts/dist_check.py faults --out "$out/faults" -- model=pgolf_baseline hardware.compile=false \
    budget.max_steps=100000 budget.train_seconds=300 logger.log_every_seconds=1 seed=0
  rc=$?
  echo "gpu_check_dist.sh faults: ${SECONDS}s, rc=$rc, results in $out/faults"
  exit $rc
fi

if [ "${1:-baseline}" = slurm_local ]; then
  if ! "$py" -c "import submitit, hydra_plugins.hydra_submitit_launcher" 2>/dev/null; then
    echo "gpu_check_dist.sh slurm_local: submitit / hydra-submitit-launcher not installed here (see the header)" >&2
    exit 2
  fi
  "$py" -m run -m hydra/launcher=slurm_local dist.nproc=2 model=pgolf_baseline budget.max_steps=50 "${common[@]}" \
    name=slurm_local_2gpu hydra.sweep.dir="$out/slurm_local" > "$out/slurm_local.log" 2>&1
  rc=$?
  tail -n 8 "$out/slurm_local.log"
  "$py" - "$out/slurm_local/0/result.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for k in ("status", "world_size", "gpu_names", "steps", "tokens_per_s", "val_bpb", "error"):
    print(f"{k:>14}: {r.get(k)}")
sys.exit(0 if r.get("status") == "ok" and r.get("world_size") == 2 else 1)
EOF
  rc=$((rc || $?))
  echo "gpu_check_dist.sh slurm_local: ${SECONDS}s, rc=$rc, results in $out/slurm_local"
  exit $rc
fi

base=(model=pgolf_baseline budget.max_steps=200 budget.train_seconds=240 "${common[@]}")
echo "== 1 GPU" | tee "$out/summary.txt"
"$py" -m run "${base[@]}" name=baseline_1gpu hydra.run.dir="$out/gpu1" > "$out/gpu1.log" 2>&1
rc1=$?
tail -n 26 "$out/gpu1.log"
n=${NPROC:-2}
echo "== $n GPUs (dist.nproc=$n) after $((SECONDS - start))s"
"$py" -m run "${base[@]}" dist.nproc="$n" name="baseline_${n}gpu" hydra.run.dir="$out/gpu$n" > "$out/gpu$n.log" 2>&1 &
run=$!
# the launcher's pid first, then the sampler appends (one writer at a time: a second ">" would overwrite the line)
echo "launching process: pid $run" > "$out/nvidia_smi_apps.txt"
( for i in 1 2 3 4 5 6; do sleep 20; date +%T; nvidia-smi --query-compute-apps=pid,process_name,used_memory \
    --format=csv,noheader; done ) >> "$out/nvidia_smi_apps.txt" 2>&1 &
smi=$!
wait $run
rc2=$?
kill $smi 2>/dev/null
tail -n 26 "$out/gpu$n.log"
echo "== all-reduce of the model's gradients (fp32), $n GPUs"
params=$("$py" -c "import json; print(json.load(open('$out/gpu1/result.json'))['params'])" 2>/dev/null || echo 17059912)
timeout 120 "$py" -m torch.distributed.run --standalone --nproc_per_node="$n" scripts/dist_check.py allreduce \
  --params "$params" --out "$out/allreduce.json" 2>&1 | grep -v "^W\|OMP_NUM_THREADS\|^\*"
echo "== comparison"
# the multi-GPU issue's bar: 1.90x on 2 GPUs, 3.70x on 4 (MIN_RATIO overrides; other counts: 0.925 per GPU)
bar=${MIN_RATIO:-$(case $n in 2) echo 1.90 ;; 4) echo 3.70 ;; *) "$py" -c "print(round(0.925 * $n, 2))" ;; esac)}
"$py" scripts/dist_check.py compare "$out/gpu1" "$out/gpu$n" --out "$out" --min-ratio "$bar" | tee -a "$out/summary.txt"
"$py" - "$out" "$n" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/summary.json"))
try:
    a = json.load(open(f"{out}/allreduce.json"))
    r2 = s["many_gpus"]
    step_ms = 1e3 * r2["train_seconds"] / r2["steps"]
    print(f"one gradient all-reduce {a['ms_per_all_reduce']:.2f} ms per step of {step_ms:.1f} ms on {sys.argv[2]} GPUs "
          f"({100 * a['ms_per_all_reduce'] / step_ms:.2f}%: the most DDP's overlap could win)")
except (OSError, KeyError, TypeError, ZeroDivisionError) as e:
    print("all-reduce share: n/a", e)
EOF
echo "gpu_check_dist.sh: ${SECONDS}s, 1 GPU rc=$rc1, $n GPUs rc=$rc2; results in $out"
[ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ]
