#!/usr/bin/env bash
# GPU check of issue 24: experiment=pgolf_record trained for TRAIN_SECONDS (default 300) on this card, exported with
# the record's quantization levers (sigma clip, GPTQ'd int7 embedding, LQER, pergroup brotli-11) and the wrapped
# code rule; then (STEP=table) scripts/quant_table.py re-quantizes the same float weights under each lever on/off.
# Embedded corpus (vocab 1024), no TTT (not what is checked).
#
# On the offline GPU machine (device_env.sh installs the carried wheels, python-minifier included, and puts src/ on
# PYTHONPATH); two calls, the machine kept warm between them (the run dir stays in outputs/export_check/):
#   . scripts/device_env.sh && STEP=train bash scripts/gpu_check_export.sh
#   . scripts/device_env.sh && STEP=table bash scripts/gpu_check_export.sh
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
work=outputs/export_check
run=$work/run
mkdir -p "$work"
"$py" -c "import torch; print('gpu_check_export.sh:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
t0=$SECONDS
case "${STEP:?STEP is train or table}" in
train)
  rm -rf "$run"
  "$py" -m run experiment=pgolf_record ttt=off eval.tokens="${EVAL_TOKENS:-1048576}" \
    "budget.train_seconds=${TRAIN_SECONDS:-300}" logger.log_every_seconds=30 "results_db=$work/results.sqlite" \
    "hydra.run.dir=$run" data.cache_dir=/tmp/speedrun-cache "$@" >"$work/train.log" 2>&1
  grep -E "warm-up done|layer loop|eval \(|quant:|compressed|status:|error:" "$work/train.log"
  "$py" - "$run" <<'EOF'
import json, sys
from pathlib import Path

result = json.loads((Path(sys.argv[1]) / "result.json").read_text())
for key in ("status", "error", "steps", "tokens_per_s", "val_bpb", "val_bpb_quant", "artifact_bytes",
            "artifact_model_bytes", "artifact_code_bytes", "artifact_code_rule", "artifact_ok", "compress_seconds",
            "quant_hessian_seconds", "train_seconds", "compile_seconds"):
    print(f"{key}: {result.get(key)}")
if result.get("val_bpb_quant") is not None and result.get("val_bpb") is not None:
    print(f"quant gap: {result['val_bpb_quant'] - result['val_bpb']:+.4f}")
EOF
  ;;
table)
  "$py" scripts/quant_table.py "$run" eval.tokens="${EVAL_TOKENS:-1048576}" data.cache_dir=/tmp/speedrun-cache "$@"
  ;;
esac
echo "exit in $((SECONDS - t0)) s"
if [ -n "${OUT:-}" ] && [ -d "$run" ]; then
  for f in result.json artifact.json artifact_tensors.json artifact_code.json run.log quant_table/table.md; do
    [ -f "$run/$f" ] && cp "$run/$f" "$OUT/$(echo "$f" | tr / _)"
  done
fi
