#!/usr/bin/env bash
# GPU check of issue 23's speed bar: experiment=pgolf_record on this card, tokens/s before and after its layer loop
# switches on, the cold warm-up (every stage and loop state compiled) and recompiles during training. Runs on the
# embedded corpus (vocab 1024, as the record script's sp1024 comparison), no export and no TTT (not what is timed).
#
# On the offline GPU machine (device_env.sh installs the carried wheels and puts src/ on PYTHONPATH):
#   . scripts/device_env.sh && bash scripts/gpu_check_record.sh [extra overrides...]
# TRAIN_SECONDS (default 120) sets the budget; the loop switches on at 35% of it. Output under $OUT/record/.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out=${OUT:?OUT must name the output folder}/record
mkdir -p "$out"
"$py" -c "import torch; print('gpu_check_record.sh:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
t0=$SECONDS
"$py" -m run experiment=pgolf_record quant=off ttt=off eval.tokens=1048576 \
  "budget.train_seconds=${TRAIN_SECONDS:-120}" logger.log_every_seconds=5 \
  "results_db=$out/results.sqlite" "hydra.run.dir=$out/run" data.cache_dir=/tmp/speedrun-cache "$@" \
  >"$out/run.log" 2>&1
echo "exit $? in $((SECONDS - t0)) s"
"$py" - "$out/run" <<'EOF'
import json, sys
from pathlib import Path

run = Path(sys.argv[1])
result = json.loads((run / "result.json").read_text())
records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
timed = [r for r in records if "elapsed_s" in r and r.get("kind") != "val"]
loop_at = next((s["start_step"] for s in result.get("stages") or [] if s.get("loop")), None)


def rate(rows):
    """tokens/s between the first and last progress line of a phase (compile-free: warm-up is untimed)."""
    if len(rows) < 2:
        return None
    return (rows[-1]["tokens"] - rows[0]["tokens"]) / (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"])


before = [r for r in timed if loop_at is None or r["step"] < loop_at]
after = [r for r in timed if loop_at is not None and r["step"] > loop_at]
for key in ("status", "error", "steps", "tokens_per_s", "compile_seconds", "recompiles", "mfu", "peak_mem_mb",
            "val_bpb", "micro_batch", "grad_accum"):
    print(f"{key}: {result.get(key)}")
print(f"loop switched on at step: {loop_at}")
print(f"tokens/s before the loop: {rate(before)}")
print(f"tokens/s with the loop:   {rate(after)}")
EOF
