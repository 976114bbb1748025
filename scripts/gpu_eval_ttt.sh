#!/usr/bin/env bash
# GPU check of issue 25: experiment=pgolf_record trained for TRAIN_SECONDS (default 60; speed, not quality, is what
# is measured), then evaluated plain and through the record's test-time training (ttt=record: LoRA rank 96 on
# q/k/v, MLP and head, 64 documents side by side, chunks of 48, and PHASES global phases, default the record's 3),
# cut at TTT_SECONDS (default 120) with the tokens scored reported. Prints the eval and TTT rates per GPU.
# Embedded corpus (vocab 1024). Extra arguments are Hydra overrides for the run.
#
# On the offline GPU machine (device_env.sh installs the carried wheels and puts src/ on PYTHONPATH):
#   . scripts/device_env.sh && bash scripts/gpu_eval_ttt.sh
#   . scripts/device_env.sh && PHASES=0 TTT_SECONDS=60 bash scripts/gpu_eval_ttt.sh ttt.warm_start_a=false
# DOCS=short trains and evaluates on the same corpus cut into FineWeb-like documents (scripts/prepare_data.py
# --max-doc-chars ${MAX_DOC_CHARS:-2500}: 274 val documents of about 920 tokens instead of 24 of about 10,500; TTT
# adapts per document, and on 24 long ones a step scores 24 x 48 tokens at a 2048-token window), with the global
# phases over the first PREFIX_DOCS (default 128) documents scored, since the records' 2000 exceed the split:
#   . scripts/device_env.sh && DOCS=short bash scripts/gpu_eval_ttt.sh
# The run dir stays under outputs/eval_ttt_check/ while the machine is warm; the next call can tabulate TTT options
# on its exported model (issue 25's table):
#   . scripts/device_env.sh && python3 scripts/ttt_table.py outputs/eval_ttt_check/run_<time> ttt.max_seconds=300
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
work=${WORK:-outputs/eval_ttt_check}
run=$work/run_$(date +%s)
mkdir -p "$work"
"$py" -c "import torch; print('gpu_eval_ttt.sh:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
data=()
if [ "${DOCS:-}" = short ]; then
  short=$work/short_docs_${MAX_DOC_CHARS:-2500}
  if [ ! -f "$short/dataset.json" ]; then
    "$py" scripts/prepare_data.py --input src/speedrun/data/assets/pydoc311.jsonl.xz --out "$short" \
      --max-doc-chars "${MAX_DOC_CHARS:-2500}" --overwrite | tail -n 4 || exit 1
  fi
  data=("data.path=$short" "data.tokenizer=$short/tokenizer.model" data.vocab_size=1024
    "ttt.phased.prefix_docs=${PREFIX_DOCS:-128}")
fi
t0=$SECONDS
"$py" -m run experiment=pgolf_record ttt=record "ttt.phased.phases=${PHASES:-3}" "ttt.max_seconds=${TTT_SECONDS:-120}" \
  "budget.train_seconds=${TRAIN_SECONDS:-60}" logger.log_every_seconds=30 "results_db=$work/results.sqlite" \
  "hydra.run.dir=$run" data.cache_dir=/tmp/speedrun-cache "${data[@]}" "$@" >"$run.log" 2>&1
rc=$?
grep -E "warm-up done|eval \(|ttt|status:|error:" "$run.log" | tail -n 20
[ -f "$run/result.json" ] && "$py" - "$run" <<'PY'
import json, sys
from pathlib import Path

result = json.loads((Path(sys.argv[1]) / "result.json").read_text())
for key in ("status", "error", "device_name", "steps", "tokens_per_s", "val_bpb", "val_bpb_quant", "eval_seconds",
            "eval_tokens_per_s", "eval_tokens_per_s_quant", "eval_recompiles", "val_tokens", "val_bpb_ttt",
            "val_bpb_ttt_base", "ttt_seconds", "ttt_tokens_scored", "ttt_fraction", "ttt_complete", "ttt_docs",
            "ttt_tokens_per_s", "ttt_phases_done", "ttt_phased_steps", "ttt_phased_seconds"):
    print(f"{key}: {result.get(key)}")
PY
echo "exit $rc in $((SECONDS - t0)) s"
if [ -n "${OUT:-}" ]; then
  [ -f "$run/result.json" ] && cp "$run/result.json" "$OUT/$(basename "$run")_result.json"
  cp "$run.log" "$OUT/$(basename "$run").log"
fi
exit "$rc"
