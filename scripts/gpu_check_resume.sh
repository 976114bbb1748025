#!/usr/bin/env bash
# Issue 26's GPU check: a multi-GPU run stopped with SIGTERM and resumed against the same run uninterrupted.
# Three steps, each within one device call (a cold compile of pgolf_record takes about 110 s), the machine kept warm
# in between so that the run dirs stay under outputs/resume_check/:
#   . scripts/device_env.sh && STEP=full bash scripts/gpu_check_resume.sh        # uninterrupted, TRAIN_SECONDS
#   . scripts/device_env.sh && STEP=stop bash scripts/gpu_check_resume.sh        # SIGTERM after STOP_AFTER s of it
#   . scripts/device_env.sh && STEP=resume bash scripts/gpu_check_resume.sh      # resume=, then the comparison
# NPROC (default 4) GPUs, EXP (default pgolf_record) with checkpoint.every_seconds=60 eval.every_steps=100, quant
# and TTT off (what is checked is training), TRAIN_SECONDS (default 240) of training. The stop step sends SIGTERM
# to the launching process (torch's elastic agent passes it to every rank) once STOP_AFTER seconds (default 120)
# have passed since its "warm-up done" line; every rank stops at the same step with one checkpoint. The resume
# step runs `python -m run resume=<run dir>` and then scripts/resume_check.py: tokens/s of both (the issue asks
# for the resumed run within 2% of the uninterrupted one), the loss curves (resume.png, for docs/img), the step
# resumed from, and each checkpoint's write time. EXTRA: more overrides for every run (e.g. a CPU try-out:
# EXP=pgolf_baseline NPROC=2 EXTRA="debug=smoke budget.max_steps=null" TRAIN_SECONDS=40 STOP_AFTER=10).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
work=${WORK:-outputs/resume_check}
mkdir -p "$work"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
args=(
  "experiment=${EXP:-pgolf_record}" "dist.nproc=${NPROC:-4}" "budget.train_seconds=${TRAIN_SECONDS:-240}"
  checkpoint.every_seconds=60 eval.every_steps=100 quant=off ttt=off logger.log_every_seconds=30
  "results_db=$work/results.sqlite" data.cache_dir=/tmp/speedrun-cache ${EXTRA:-}
)
t0=$SECONDS
rc=0
case "${STEP:?STEP is full, stop or resume}" in
full)
  rm -rf "$work/full"
  "$py" -m run "${args[@]}" "hydra.run.dir=$work/full" >"$work/full.log" 2>&1
  rc=$?
  grep -E "warm-up done|checkpoint at|status:|tokens_per_s|error" "$work/full.log" | tail -n 12
  ;;
stop)
  rm -rf "$work/stopped"
  "$py" -m run "${args[@]}" "hydra.run.dir=$work/stopped" >"$work/stopped.log" 2>&1 &
  pid=$!
  until grep -q "warm-up done" "$work/stopped.log" 2>/dev/null || ! kill -0 "$pid" 2>/dev/null; do sleep 1; done
  sleep "${STOP_AFTER:-120}"
  kill -TERM "$pid" 2>/dev/null && echo "SIGTERM to the launcher $pid at $((SECONDS - t0)) s"
  wait "$pid"
  rc=$?
  echo "the stopped run exited $rc (143: SIGTERM, as expected)"
  [ "$rc" -eq 143 ] && rc=0
  grep -E "warm-up done|checkpoint at|interrupted|status:|error" "$work/stopped.log" | tail -n 12
  ;;
resume)
  "$py" -m run "resume=$work/stopped" >"$work/resumed.log" 2>&1
  rc=$?
  grep -E "resumed from|checkpoint at|status:|tokens_per_s|error" "$work/resumed.log" | tail -n 12
  "$py" scripts/resume_check.py "$work/full" "$work/stopped" --plot "$work/resume.png" --json "$work/resume.json" \
    || rc=$?
  ;;
esac
echo "exit $rc in $((SECONDS - t0)) s"
if [ -n "${OUT:-}" ]; then
  for f in full.log stopped.log resumed.log resume.png resume.json; do
    [ -f "$work/$f" ] && cp "$work/$f" "$OUT/"
  done
fi
exit "$rc"
