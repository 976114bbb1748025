#!/usr/bin/env bash
# Issue 3's GPU evidence: short pgolf_baseline runs over attention kernels x precisions, emulated profiles,
# then the gpu-marked parity tests (each backend against math in bf16). On the device machine:
#   . scripts/device_env.sh && bash scripts/bench_attention_matrix.sh [attn|precision|all] OUTDIR
set -uo pipefail
part=${1:-all}; out=${2:-outputs/bench}; mkdir -p "$out"
common="model=pgolf_baseline budget.train_seconds=${TRAIN_SECONDS:-20} eval.tokens=131072"
if [ "$part" = attn ] || [ "$part" = all ]; then
  python3 scripts/bench_matrix.py --out "$out/attn.md" --common "$common" \
    "attn=sdpa attn.kernel=cudnn precision=bf16" \
    "attn=sdpa attn.kernel=flash precision=bf16" \
    "attn=sdpa attn.kernel=efficient precision=bf16" \
    "attn=flex precision=bf16" \
    "attn=math precision=bf16 hardware.micro_batch=8" \
    "attn=fa3 precision=bf16"
fi
if [ "$part" = precision ] || [ "$part" = all ]; then
  python3 scripts/bench_matrix.py --out "$out/precision.md" --common "$common" \
    "attn=sdpa attn.kernel=flash precision=fp16" \
    "attn=sdpa attn.kernel=cudnn precision=fp8" \
    "attn=flex precision=fp8" \
    "hardware=t4" \
    "hardware=a100"
  python3 -m pytest -m gpu -q tests -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.txt" | tail -3
fi
