#!/usr/bin/env bash
# GPU ablation of experiment=pgolf_record (issue 23): one lever off at a time (conf/ablate/), each at the same
# wall-clock budget and seeds, as one speedrun sweep; then speedrun.report ranks them against ablate=none with the
# two-sided Welch t-test (at a short budget a lever may help or hurt). Training only (quant=off ttt=off): the levers
# act on training; eval on EVAL_TOKENS.
#
# On the offline GPU machine (device_env.sh installs the carried wheels and puts src/ on PYTHONPATH):
#   . scripts/device_env.sh && ABLATE=none,xsa,loop SEEDS=0,1 bash scripts/gpu_ablate_record.sh
# TRAIN_SECONDS (default 90), EVAL_TOKENS (default 1048576). The results DB is $DB (default
# outputs/ablate/results.sqlite): the sweeper skips runs the DB already holds `ok`, so a sweep cut by a call's time
# limit continues where it stopped when the same command runs again with the DB carried back.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
db=${DB:-outputs/ablate/results.sqlite}
mkdir -p "$(dirname "$db")"
"$py" -c "import torch; print('gpu_ablate_record.sh:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
t0=$SECONDS
"$py" -m run -m experiment=pgolf_record "ablate=${ABLATE:?ABLATE lists the levers, e.g. none,xsa}" \
  "seed=${SEEDS:-0}" hydra.sweeper.resume=true quant=off ttt=off "budget.train_seconds=${TRAIN_SECONDS:-90}" \
  "eval.tokens=${EVAL_TOKENS:-1048576}" logger.log_every_seconds=15 "results_db=$db" \
  data.cache_dir=/tmp/speedrun-cache "$@"
echo "sweep exit $? in $((SECONDS - t0)) s"
"$py" -m speedrun.report --db "$db" --name pgolf_record --group-by ablate --baseline ablate=none --no-plots \
  --alternative two-sided --out "${OUT:-outputs}/ablate_report"
# The DB comes back with the call's files, to be carried into the next call (DB=...) or reported here.
[ -n "${OUT:-}" ] && cp "$db" "$OUT/ablate_results.sqlite"
