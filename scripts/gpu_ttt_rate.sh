#!/usr/bin/env bash
# Issue 25's one-GPU TTT rate (bar: 24,000 validation tokens/s per H100), in one device call:
#   1. the embedded corpus cut into documents of FineWeb's lengths in tokens (FineWeb's validation documents at
#      sp8192: mean 944, median 567) with a tokenizer of VOCAB pieces (default 1024; 8192 is pgolf_record's own, as
#      data=fineweb_sp8192 gives it): scripts/prepare_data.py --doc-chars-lognormal DOC_CHARS 1.0 --val-every 3, a
#      median of DOC_CHARS characters, by default 1650 at vocabulary 1024 (1,526 val documents, mean 963 and median
#      585 tokens) and 2500 at 8192 (1,052 documents, mean 925, median 556: a larger vocabulary packs more
#      characters into a token, so the same cut would make documents a third shorter in tokens);
#   2. experiment=pgolf_record trained TRAIN_SECONDS (default 30, eager: ~2 minutes in all), exported as the record
#      does, no TTT of its own;
#   3. scripts/ttt_table.py on that model, the records' TTT (conf/ttt/record.yaml, 64 documents a batch, phases over
#      the first 64 documents), compiled and replayed from CUDA graphs, rows padded to multiples of 48 (the chunk) with
#      half-octave row counts: ROWS (default "nobase base") one row without the base score (the records' TTT
#      computes none), one with it (val_bpb_ttt_base), and on request "shared" (no base score,
#      ttt.shared_attn_a=true); with BASELINE_SRC (the src/ of another tree) the rows of BASELINE_ROWS (default
#      "base") again on that code, for a ratio measured on the same card in the same call.
#   . scripts/device_env.sh && bash scripts/gpu_ttt_rate.sh
#   VOCAB=8192 BASELINE_SRC=/path/to/other/src BASELINE_ROWS=nobase bash scripts/gpu_ttt_rate.sh
# ROW_ARGS (default "ttt.row_widths=48 ttt.graph_rows=half_octave", as pgolf_record) pad every row; a tree from before the
# largest-first capture (39a9c49 and older) runs out of an H100's memory capturing those 101 shapes, so compare
# with it at ROW_ARGS="ttt.row_widths=half_octave ttt.graph_rows=pow2" (60 shapes).
# Each row's line (val_bpb_ttt, TTT seconds, tokens/s, warm-up, shapes captured) goes to $WORK/rates.txt (WORK
# default outputs/ttt_rate_v<VOCAB>); a second call skips the rows already written, and another ROW_ARGS adds rows
# of its own on the same model. The BASELINE_SRC row runs this tree's scripts/ttt_table.py and conf/ against that
# src/: it fails if their TTT configs differ. TTT_ARGS replace the compiled and graphed settings; a CPU try-out of
# the plumbing:
#   VOCAB=1024 MODEL_ARGS="debug=smoke" TTT_ARGS="ttt.compile=false ttt.cuda_graphs=false ttt.max_seconds=20" bash scripts/gpu_ttt_rate.sh
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
vocab=${VOCAB:-1024}
if [ "$vocab" -ge 8192 ]; then doc_chars=${DOC_CHARS:-2500}; else doc_chars=${DOC_CHARS:-1650}; fi
# eager training (no compile) holds fp32 logits of the whole micro-batch: at 8192 the default 48 rows of 2048 ran
# out of an H100's memory in the warm-up (sixteenth session), so 16 rows, the tokens per step kept by accumulation
if [ "$vocab" -ge 8192 ]; then model_args=${MODEL_ARGS-hardware.micro_batch=16}; else model_args=${MODEL_ARGS-}; fi
work=${WORK:-outputs/ttt_rate_v$vocab}
data=$work/data
mkdir -p "$work"
if [ ! -f "$data/dataset.json" ]; then
  "$py" scripts/prepare_data.py --input src/speedrun/data/assets/pydoc311.jsonl.xz --out "$data" \
    --doc-chars-lognormal "$doc_chars" 1.0 --val-every 3 --vocab-size "$vocab" --overwrite | tail -n 3 || exit 1
fi
if [ ! -f "$work/model/.hydra/config.yaml" ] || ! grep -q '"status": "ok"' "$work/model/result.json" 2>/dev/null; then
  # shellcheck disable=SC2086  # MODEL_ARGS are several overrides
  "$py" -m run experiment=pgolf_record ttt=off budget.train_seconds="${TRAIN_SECONDS:-30}" data.path="$data" \
    data.tokenizer="$data/tokenizer.model" data.vocab_size="$vocab" results_db="$work/results.sqlite" \
    hydra.run.dir="$work/model" data.cache_dir=/tmp/speedrun-cache hardware.compile=false $model_args \
    > "$work/model.log" 2>&1 || { echo "training failed: $work/model.log"; tail -n 20 "$work/model.log"; exit 1; }
fi
read -ra ttt_args <<<"${TTT_ARGS:-ttt.compile=true ttt.cuda_graphs=true ttt.max_seconds=400}"
read -ra row_args <<<"${ROW_ARGS:-ttt.row_widths=48 ttt.graph_rows=half_octave}"
# each row's name carries its padding: one model, several paddings
pad=$(printf '%s' "${row_args[*]}" | sed 's/ttt\.//g' | tr -cs 'A-Za-z0-9' '_')
row() { # NAME LABEL OVERRIDES [PYTHONPATH]
  set -- "$1-$pad" "${@:2}"
  if [ -f "$work/$1/rows.json" ]; then return; fi
  PYTHONPATH=${4:-${PYTHONPATH:-src}} "$py" scripts/ttt_table.py "$work/model" ttt.phased.prefix_docs=64 \
    ttt.batch_size=64 "${row_args[@]}" "${ttt_args[@]}" --out "$work/$1" \
    --setting "$2=$3" > "$work/$1.log" 2>&1
  echo "$1 rc $?: $(tail -n 1 "$work/$1/table.md" 2>/dev/null)" \
    "$(grep -o '"ttt_cuda_graphs_captured": [0-9]*' "$work/$1/rows.json" 2>/dev/null)" | tee -a "$work/rates.txt"
}
# the bar's row first (the records' TTT computes no base score), so that a call cut short still has it
for name in ${ROWS-nobase base}; do  # ROWS= (empty): the model only
  case $name in
    nobase) row nobase "records' TTT, no base score" "ttt.score_base=false" ;;
    base) row base "records' TTT, base scored" "ttt.score_base=true" ;;
    shared) row shared "records' TTT, no base score, one A product for the attention's input" \
      "ttt.score_base=false ttt.shared_attn_a=true" ;;
    *) echo "ROWS: unknown row $name (nobase, base, shared)"; exit 1 ;;
  esac
done
if [ -n "${BASELINE_SRC:-}" ]; then  # BASELINE_ROWS (default base): which of the rows run again on that code
  for name in ${BASELINE_ROWS:-base}; do
    case $name in
      nobase) row baseline-nobase "records' TTT, no base score, on $BASELINE_SRC" "ttt.score_base=false" \
        "$BASELINE_SRC:${PYTHONPATH:-}" ;;
      base) row baseline "records' TTT, base scored, on $BASELINE_SRC" "ttt.score_base=true" \
        "$BASELINE_SRC:${PYTHONPATH:-}" ;;
      *) echo "BASELINE_ROWS: unknown row $name (nobase, base)"; exit 1 ;;
    esac
  done
fi
if [ -n "${OUT:-}" ]; then
  find "$work" -type f -size -8M -not -name '*.bin' -not -path "$data/*" -not -name 'model.*' \
    | tar czf "$OUT/ttt_rate_v$vocab.tgz" -T -
fi
