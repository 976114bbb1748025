#!/usr/bin/env bash
# Run the gpu-marked tests (CUDA backends against math, fp16/bf16 eval, GPTQ and TTT on the GPU), which the
# CPU suite deselects. Exits non-zero when a test fails, when no CUDA device is visible, or when nothing passed;
# the last line printed is pytest's summary (e.g. "10 passed in 41.2s").
#
# On the offline GPU machine (device_env.sh installs the carried wheels and puts src/ on PYTHONPATH):
#   . scripts/device_env.sh && bash scripts/gpu_tests.sh
# On any CUDA machine with the project installed (pip install -e '.[dev]'):
#   bash scripts/gpu_tests.sh
# Extra arguments go to pytest, e.g. one file or a -k filter:
#   bash scripts/gpu_tests.sh tests/model/test_attention.py -k flex
# GPU_TESTS_LOG=path also keeps the whole output there (e.g. GPU_TESTS_LOG=$OUT/gpu_tests.txt on the device).
# PYTHON picks the interpreter (default python3, the one device_env.sh set up).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}

# Without CUDA every gpu test skips itself and pytest exits 0: a green run that tested nothing. Refuse instead.
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_tests.sh: no CUDA device visible to $py (torch.cuda.is_available() is False); run it on a GPU machine" >&2
  exit 2
fi
"$py" -c "import torch; print('gpu_tests.sh:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"

log=${GPU_TESTS_LOG:-$(mktemp)}
# pyproject's addopts carry -m 'not gpu' (so a plain `pytest` runs the CPU suite); `-o addopts=` drops them
# rather than relying on a later -m winning, and -ra is restored so skips and failures are listed with reasons.
# -p no:cacheprovider: the device machine's checkout is a copy; leave no .pytest_cache in it.
"$py" -m pytest -o addopts= -m gpu -q -ra -p no:cacheprovider "${@:-tests}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
summary=$(tail -n 1 "$log")
[ -n "${GPU_TESTS_LOG:-}" ] || rm -f "$log"
if [ "$rc" -eq 0 ] && ! grep -q " passed" <<<"$summary"; then
  # e.g. every test skipped (a missing package) or was filtered out: nothing was checked on the GPU
  echo "gpu_tests.sh: no gpu test passed ($summary)" >&2
  rc=1
fi
exit "$rc"
