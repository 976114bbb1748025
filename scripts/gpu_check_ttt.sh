#!/usr/bin/env bash
# Issue 25's TTT checks in one device call on a machine of NGPU GPUs (default 4):
#   1. experiment=pgolf_record trained TRAIN_SECONDS (default 30) on GPU 0, on the embedded corpus cut into short
#      documents (scripts/prepare_data.py --max-doc-chars 2500: 273 val documents), exported as the record does
#      (int6 GPTQ), no TTT of its own;
#   2. TTT of that artifact with scripts/ttt_table.py, the records' settings with BATCH documents a batch (default
#      16: 18 batches, so 4 ranks get 5, 5, 4 and 4 and can scale up to 3.6x) and the global phases over the first
#      PREFIX_DOCS (default 128) documents scored: eager on GPU 0 and compiled (ttt.compile=true, per block) on GPU 1
#      side by side, then eager on all NGPU ranks (torchrun);
#   3. the comparison: val_bpb_ttt of NGPU ranks against one (the bar: within 1e-3) and their tokens/s ratio (the
#      bar: >= 3.5x on 4), and the compiled row's warm-up and rate against eager;
#   4. with LADDER=1, issue 25's table: ttt_table.py's ladder (the records' TTT, phases 1 and 0, each LoRA option
#      off, compiled) on the same model, its rows dealt over the NGPU GPUs (one process each), in $work/ladder_<gpu>.
#   . scripts/device_env.sh && bash scripts/gpu_check_ttt.sh
# The model and the tables stay under WORK (default outputs/ttt_check); a second call on the warm machine reuses
# the model. The tables go to $OUT (one tarball) when it is set. A CPU try-out of the plumbing (gloo ranks, a
# smoke-sized model, no compiled row):
#   MODEL_ARGS="debug=smoke" COMPILED=0 NGPU=2 TTT_SECONDS=120 bash scripts/gpu_check_ttt.sh
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
work=${WORK:-outputs/ttt_check}
ngpu=${NGPU:-4}
mkdir -p "$work"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
t0=$SECONDS
short=$work/short_docs_${MAX_DOC_CHARS:-2500}
if [ ! -f "$short/dataset.json" ]; then
  "$py" scripts/prepare_data.py --input src/speedrun/data/assets/pydoc311.jsonl.xz --out "$short" \
    --max-doc-chars "${MAX_DOC_CHARS:-2500}" --overwrite | tail -n 3 || exit 1
fi
run=$work/model
if [ ! -f "$run/result.json" ]; then
  CUDA_VISIBLE_DEVICES=0 "$py" -m run experiment=pgolf_record ttt=off "budget.train_seconds=${TRAIN_SECONDS:-30}" \
    "data.path=$short" "data.tokenizer=$short/tokenizer.model" data.vocab_size=1024 "results_db=$work/results.sqlite" \
    "hydra.run.dir=$run" data.cache_dir=/tmp/speedrun-cache ${MODEL_ARGS:-} >"$work/model.log" 2>&1 || {
    tail -n 20 "$work/model.log"
    exit 1
  }
  echo "model trained and exported at $((SECONDS - t0)) s"
fi
common=("ttt.phased.prefix_docs=${PREFIX_DOCS:-128}" "ttt.batch_size=${BATCH:-16}" "ttt.max_seconds=${TTT_SECONDS:-300}")
table() { "$py" scripts/ttt_table.py "$run" "${common[@]}" "$@"; }
CUDA_VISIBLE_DEVICES=0 table --out "$work/one" --setting "1 GPU, eager=ttt.compile=false" >"$work/one.log" 2>&1 &
one=$!
if [ "${COMPILED:-1}" = 1 ]; then
  CUDA_VISIBLE_DEVICES=1 table --out "$work/compiled" --setting "1 GPU, compiled per block=ttt.compile=true" \
    >"$work/compiled.log" 2>&1 &
  compiled=$!
fi
wait "$one" || echo "the 1-GPU row failed: $work/one.log"
echo "1-GPU eager row done at $((SECONDS - t0)) s"
if [ "${COMPILED:-1}" = 1 ]; then
  wait "$compiled" || echo "the compiled row failed: $work/compiled.log"
  echo "compiled row done at $((SECONDS - t0)) s"
fi
"$py" -m torch.distributed.run --standalone --nproc_per_node "$ngpu" scripts/ttt_table.py "$run" "${common[@]}" \
  --out "$work/all" --setting "$ngpu GPUs, eager=ttt.compile=false" >"$work/all.log" 2>&1 || echo "the $ngpu-rank row failed"
echo "$ngpu-rank row done at $((SECONDS - t0)) s"
"$py" - "$work" "$ngpu" <<'PY'
import json, sys
from pathlib import Path

work, n = Path(sys.argv[1]), int(sys.argv[2])
rows = {}
for name in ("one", "compiled", "all"):
    path = work / name / "rows.json"
    rows[name] = json.loads(path.read_text())[0] if path.is_file() else None
for name, r in rows.items():
    if r:
        print(f"{name:>9}: val_bpb_ttt {r['val_bpb_ttt']} (unadapted {r['val_bpb_ttt_base']}), scored "
              f"{r['ttt_fraction']:.1%}, {r['ttt_seconds']} s, {r['ttt_tokens_per_s']} tokens/s, "
              f"compile {r['ttt_compile_seconds']} s, recompiles {r['ttt_recompiles']}")
one, everyone = rows["one"], rows["all"]
ok = True
if one and everyone and one["ttt_complete"] and everyone["ttt_complete"]:
    delta = abs(everyone["val_bpb_ttt"] - one["val_bpb_ttt"])
    ratio = everyone["ttt_tokens_per_s"] / one["ttt_tokens_per_s"]
    ok = delta <= 1e-3 and (n != 4 or ratio >= 3.5)
    print(f"{n} ranks against 1: |delta val_bpb_ttt| {delta:.6f} (bar 1e-3), tokens/s {ratio:.2f}x (bar 3.5x on 4)")
else:
    ok = False
    print("no comparison: a row is missing or did not score every token (raise TTT_SECONDS)")
sys.exit(0 if ok else 1)
PY
rc=$?
if [ "${LADDER:-0}" = 1 ]; then
  rows=$("$py" -c "import sys; sys.path.insert(0, 'scripts'); from ttt_table import LADDER; print(len(LADDER))")
  for ((gpu = 0; gpu < ngpu; gpu++)); do
    mine=$(seq -s, "$gpu" "$ngpu" $((rows - 1)))
    [ -n "$mine" ] || continue
    CUDA_VISIBLE_DEVICES=$gpu table --rows "$mine" --out "$work/ladder_$gpu" >"$work/ladder_$gpu.log" 2>&1 &
  done
  wait
  cat "$work"/ladder_*/table.md 2>/dev/null || echo "no ladder table: see $work/ladder_*.log"
fi
echo "gpu_check_ttt.sh: exit $rc in $((SECONDS - t0)) s"
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/ttt_check.tgz" --exclude='*.bin' --exclude='model.*' --exclude=checkpoints "$work" 2>/dev/null
fi
exit "$rc"
