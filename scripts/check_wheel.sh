#!/usr/bin/env bash
# The wheel works away from the repository: build it, install it with CPU torch into a fresh virtual environment,
# and from an empty folder run a smoke job and the report with the installed code alone; then re-run the smoke
# job's self-extracting train_gpt.py, and its readable train_gpt_human.py, in a second venv holding only torch, numpy,
# sentencepiece and brotli.
#   bash scripts/check_wheel.sh [python]      (python: the interpreter to build with and base the venv on)
# .ci/run calls it after the tests; about a minute, most of it installing torch (2.13.0, from the machine's disk).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=$("${1:-python3}" -c "import sys; print(sys.executable)")  # absolute: the script changes folders
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
unset PYTHONPATH  # nothing of the checkout may be importable: only the wheel

echo "check_wheel: building the wheel"
"$PYTHON" -m pip wheel -q --no-deps -w "$TMP/dist" .
WHEEL=$(ls "$TMP"/dist/speedrun-*.whl)

echo "check_wheel: installing $(basename "$WHEEL") and torch==2.13.0 into a fresh venv"
"$PYTHON" -m venv "$TMP/venv"
VENV="$TMP/venv/bin"
"$VENV/python" -m pip install -q --upgrade pip
# torch first and pinned, as .ci/run does: a bare "torch" would fetch the multi-GB CUDA build
"$VENV/python" -m pip install -q torch==2.13.0
"$VENV/python" -m pip install -q "$WHEEL[report]"

WORK="$TMP/work"
mkdir "$WORK"
cd "$WORK"
where=$("$VENV/python" -c 'import speedrun.paths as p; print(p.REPO_ROOT, p.CONF_DIR)')
case "$where" in
  "None $TMP/venv/"*) ;;
  *) echo "check_wheel: FAIL: speedrun is not running from the wheel (REPO_ROOT, CONF_DIR: $where)"; exit 1 ;;
esac

echo "check_wheel: python -m run debug=smoke (in an empty folder)"
"$VENV/python" -m run debug=smoke | tee "$TMP/run.out"
grep -Eq '^ *status: *ok$' "$TMP/run.out" || { echo "check_wheel: FAIL: the smoke run's result block lacks status: ok"; exit 1; }
test -f outputs/results.sqlite || { echo "check_wheel: FAIL: no outputs/results.sqlite in the current folder"; exit 1; }
grep -q '"code_layout": "installed"' outputs/runs/*/*/env.json \
  || { echo "check_wheel: FAIL: env.json does not say the code ran installed"; exit 1; }

echo "check_wheel: speedrun report"
"$VENV/speedrun" report
test -f outputs/report/report.html || { echo "check_wheel: FAIL: speedrun report wrote no outputs/report/report.html"; exit 1; }

echo "check_wheel: speedrun --help, speedrun run --help"
# captured first: grep -q stops reading at its match, and the writer's broken pipe would fail the pipeline
help=$("$VENV/speedrun" --help)
grep -q "speedrun report" <<<"$help" || { echo "check_wheel: FAIL: speedrun --help"; exit 1; }
help=$("$VENV/speedrun" run --help)
grep -q "^experiment: .*t4_colab" <<<"$help" || { echo "check_wheel: FAIL: speedrun run --help"; exit 1; }

# The exported file needs no speedrun, Hydra or OmegaConf: a venv with the four packages its re-run imports.
files=(outputs/runs/*/*/train_gpt.py)  # the smoke run's, the only run here
RUN_DIR=$(dirname "${files[0]}")
DATA_PATH=$("$VENV/python" -c 'from speedrun.data.layout import embedded_dir; from speedrun.paths import CACHE_DIR; print(embedded_dir(CACHE_DIR, 1024))')
echo "check_wheel: re-running $RUN_DIR/train_gpt.py in a venv of torch, numpy, sentencepiece and brotli alone"
"$PYTHON" -m venv "$TMP/lean"
LEAN="$TMP/lean/bin"
"$LEAN/python" -m pip install -q --upgrade pip
"$LEAN/python" -m pip install -q torch==2.13.0 numpy sentencepiece brotli
if "$LEAN/python" -c 'import omegaconf' 2>/dev/null || "$LEAN/python" -c 'import hydra' 2>/dev/null \
  || "$LEAN/python" -c 'import speedrun' 2>/dev/null; then
  echo "check_wheel: FAIL: the lean venv holds speedrun, hydra or omegaconf"; exit 1
fi
mkdir "$TMP/rerun"
cp "$RUN_DIR/train_gpt.py" "$RUN_DIR/train_gpt_human.py" "$TMP/rerun/"
for file in train_gpt.py train_gpt_human.py; do
  (cd "$TMP/rerun" && DATA_PATH="$DATA_PATH" "$LEAN/python" "$file" > "$file.log" 2>&1) \
    || { tail -n 20 "$TMP/rerun/$file.log"; echo "check_wheel: FAIL: $file did not run"; exit 1; }
  "$LEAN/python" "$REPO/scripts/check_rerun_matches.py" "$RUN_DIR/result.json" "$TMP/rerun/$file.log" \
    "$TMP/rerun/train_gpt.py"
done
echo "check_wheel: ok"
