#!/usr/bin/env bash
# Issue 25's TTT checks in one device call on a machine of NGPU GPUs (default 4):
#   1. experiment=pgolf_record trained TRAIN_SECONDS (default 30) on GPU 0, on the embedded corpus cut into short
#      documents (scripts/prepare_data.py --max-doc-chars 2500: 273 val documents), exported as the record does
#      (int6 GPTQ), no TTT of its own;
#   2. TTT of that artifact with scripts/ttt_table.py, the records' settings (conf/ttt/record.yaml) with the global
#      phases over the first PREFIX_DOCS (default 128) documents scored, as jobs that every GPU pulls from a queue:
#      - with LADDER=1, issue 25's table: ttt_table.py's ladder (the records' TTT, phases 1 and 0, each LoRA option
#        off, compiled per block) at LADDER_BATCH (default 64, the records') documents a batch, one row a job, the
#        compiled row first; COMPILED=0 leaves that row out;
#      - "one": eager on one GPU at BATCH (default 16: 18 batches, so 4 ranks get 5, 5, 4 and 4 and can scale up to
#        3.6x) documents a batch;
#      then "all": the same as "one" on all NGPU ranks (torchrun), once every GPU is free;
#   3. the comparison: val_bpb_ttt of NGPU ranks against one (the bar: within 1e-3) and their tokens/s ratio (the
#      bar: >= 3.5x on 4); each ladder row's rate and compile warm-up; the ladder's table in $work/ladder.md.
#   . scripts/device_env.sh && bash scripts/gpu_check_ttt.sh
# The model and the tables stay under WORK (default outputs/ttt_check); a second call on the warm machine reuses
# the model and skips the rows already written (rows.json), so it goes on where a call's time limit cut the first.
# The tables go to $OUT (one tarball) when it is set. MAX_DOC_CHARS (default 2500) cuts the documents shorter, for
# more of them; MODEL_ARGS go to the training run (e.g. hardware.compile=false: no compile, the model in ~2 minutes).
# CUT_ARGS, when set, replace "--max-doc-chars $MAX_DOC_CHARS" in the prepare_data.py call, e.g.
# CUT_ARGS="--doc-chars-lognormal 1650 1.0" for FineWeb-like heavy-tailed lengths (val median ~560, mean ~940 tokens);
# VAL_EVERY, when set, is its --val-every (default 20; 5 gives ~4x the val documents). Each cut has its own dataset
# directory ($WORK/short_docs_<cut>[_val<N>]), but the model in $WORK/model is trained once: give a new cut a new WORK.
# The 4-rank check as measured on 4 H100s (docs/benchmarks.md, eleventh session):
#   WORK=outputs/ttt_check2 MAX_DOC_CHARS=1000 PREFIX_DOCS=32 MODEL_ARGS="hardware.compile=false" bash scripts/gpu_check_ttt.sh
# The same check on the compiled, CUDA-graphed path (SCALING=compiled; its own WORK, as its rows differ):
#   WORK=outputs/ttt_check3 SCALING=compiled BATCH=64 MAX_DOC_CHARS=1000 PREFIX_DOCS=32 MODEL_ARGS="hardware.compile=false" bash scripts/gpu_check_ttt.sh
# The check as it met the 3.5x bar on 4 H200s (docs/benchmarks.md, fourteenth session): documents of FineWeb's
# lengths, the records' 64 a batch, the eager steps replayed from CUDA graphs (SCALING=graphs: no compile warm-up):
#   WORK=outputs/ttt_check4 SCALING=graphs BATCH=64 CUT_ARGS="--doc-chars-lognormal 1650 1.0" VAL_EVERY=3 PREFIX_DOCS=64 TTT_SECONDS=400 MODEL_ARGS="hardware.compile=false" bash scripts/gpu_check_ttt.sh
# A CPU try-out of the plumbing (gloo ranks, a smoke-sized model, the ladder without its compiled row):
#   MODEL_ARGS="debug=smoke" LADDER=1 COMPILED=0 NGPU=2 TTT_SECONDS=120 bash scripts/gpu_check_ttt.sh
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
work=${WORK:-outputs/ttt_check}
ngpu=${NGPU:-4}
mkdir -p "$work"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
t0=$SECONDS
# the dataset's directory names its cut, so that different cuts never reuse each other's data
if [ -n "${CUT_ARGS:-}" ]; then
  read -ra cut_args <<<"$CUT_ARGS"
  cut_tag=$(printf '%s' "$CUT_ARGS" | tr -cs 'A-Za-z0-9.' '_')
  cut_tag=${cut_tag#_}
else
  cut_args=(--max-doc-chars "${MAX_DOC_CHARS:-2500}")
  cut_tag=${MAX_DOC_CHARS:-2500}
fi
split_args=()
if [ -n "${VAL_EVERY:-}" ]; then
  split_args=(--val-every "$VAL_EVERY")
  cut_tag+=_val$VAL_EVERY
fi
short=$work/short_docs_$cut_tag
if [ ! -f "$short/dataset.json" ]; then
  "$py" scripts/prepare_data.py --input src/speedrun/data/assets/pydoc311.jsonl.xz --out "$short" \
    "${cut_args[@]}" ${split_args[@]+"${split_args[@]}"} --overwrite | tail -n 3 || exit 1
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
common=("ttt.phased.prefix_docs=${PREFIX_DOCS:-128}" "ttt.max_seconds=${TTT_SECONDS:-300}")
# The 1-GPU and all-GPU rows of the equality and scaling check: eager; with SCALING=compiled compiled per block
# and replayed from CUDA graphs (ttt.cuda_graphs follows ttt.compile on a GPU), the path a pgolf_record run takes;
# with SCALING=graphs the eager steps replayed from CUDA graphs (no compile warm-up, slower steps)
if [ "${SCALING:-eager}" = compiled ]; then
  mode_name="compiled + CUDA graphs" mode_args="ttt.compile=true"
elif [ "${SCALING:-eager}" = graphs ]; then
  mode_name="eager + CUDA graphs" mode_args="ttt.compile=false ttt.cuda_graphs=true"
else
  mode_name="eager" mode_args="ttt.compile=false"
fi
table() { "$py" scripts/ttt_table.py "$run" "${common[@]}" "$@"; }
# The one-process rows are jobs in a queue that every GPU pulls from (a job is claimed by mkdir, atomic), so no GPU
# waits on another's long row: the compiled ladder row first (its warm-up is the longest), then the 1-GPU eager row
# of the equality check, then the ladder's eager rows. A row whose rows.json exists is done: a second call on the
# warm machine goes on where a first one's time limit cut it.
jobs=()
ladder_rows=0
if [ "${LADDER:-0}" = 1 ]; then
  ladder_rows=$("$py" -c "import sys; sys.path.insert(0, 'scripts'); from ttt_table import LADDER; print(len(LADDER))")
  compiled_row=$((ladder_rows - 1)) # LADDER's last row is the records' TTT compiled
  [ "${COMPILED:-1}" = 1 ] && jobs+=("ladder_$compiled_row")
fi
jobs+=(one)
for ((r = 0; r < ladder_rows; r++)); do [ "$r" = "${compiled_row:-}" ] || jobs+=("ladder_$r"); done
run_job() { # GPU JOB
  local gpu=$1 job=$2
  case $job in
  one) CUDA_VISIBLE_DEVICES=$gpu table "ttt.batch_size=${BATCH:-16}" --out "$work/one" \
    --setting "1 GPU, $mode_name=$mode_args" ;;
  ladder_*) CUDA_VISIBLE_DEVICES=$gpu table "ttt.batch_size=${LADDER_BATCH:-64}" --rows "${job#ladder_}" \
    --out "$work/$job" ;;
  esac >"$work/$job.log" 2>&1 || echo "row $job failed on GPU $gpu: $work/$job.log"
  echo "row $job done on GPU $gpu at $((SECONDS - t0)) s"
}
worker() { # GPU: run the queue's unclaimed, unfinished jobs in order
  local job
  for job in "${jobs[@]}"; do
    [ -f "$work/$job/rows.json" ] && continue
    mkdir "$work/claims/$job" 2>/dev/null || continue
    run_job "$1" "$job"
  done
}
rm -rf "$work/claims" && mkdir -p "$work/claims"
for ((gpu = 0; gpu < ngpu; gpu++)); do worker "$gpu" & done
wait
if [ ! -f "$work/all/rows.json" ]; then
  "$py" -m torch.distributed.run --standalone --nproc_per_node "$ngpu" scripts/ttt_table.py "$run" "${common[@]}" \
    "ttt.batch_size=${BATCH:-16}" --out "$work/all" --setting "$ngpu GPUs, $mode_name=$mode_args" \
    >"$work/all.log" 2>&1 || echo "the $ngpu-rank row failed: $work/all.log"
  echo "$ngpu-rank row done at $((SECONDS - t0)) s"
fi
"$py" - "$work" "$ngpu" <<'PY'
import json, sys
from pathlib import Path

work, n = Path(sys.argv[1]), int(sys.argv[2])
rows = {}
for name in ("one", "all", *sorted(p.parent.name for p in work.glob("ladder_*/rows.json"))):
    path = work / name / "rows.json"
    rows[name] = json.loads(path.read_text())[0] if path.is_file() else None
for name, r in rows.items():
    if r:
        print(f"{name:>9} ({r['setting']}): val_bpb_ttt {r['val_bpb_ttt']} (unadapted {r['val_bpb_ttt_base']}), scored "
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
if [ "$ladder_rows" -gt 0 ]; then # one table of the ladder: the first row's table (its heading) and every other row
  first=1
  for ((r = 0; r < ladder_rows; r++)); do
    t=$work/ladder_$r/table.md
    [ -f "$t" ] || { echo "ladder row $r: not run (see $work/ladder_$r.log)"; continue; }
    if [ "$first" = 1 ]; then cat "$t"; first=0; else tail -n 1 "$t"; fi
  done | tee "$work/ladder.md"
fi
echo "gpu_check_ttt.sh: exit $rc in $((SECONDS - t0)) s"
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/ttt_check.tgz" --exclude='*.bin' --exclude='model.*' --exclude=checkpoints "$work" 2>/dev/null
fi
exit "$rc"
