#!/usr/bin/env bash
# `make bench`: prints one row per figure. Training-step rows come from build/test/bench.
# On a machine without a GPU only the CPU rows run, on smaller batches than the GPU rows (said so below).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "bench: GPU rows need the CUDA path of ./train and ./translate, which this build does not have yet" >&2
fi
echo "bench: no GPU in use: CPU rows only, batches reduced from 256 x 32 to fit a CPU ($(nproc) cores)"
printf '%-58s %s\n' "figure" "result"
row() { printf '%-58s %s\n' "$1" "$2"; }
step() { ./build/test/bench "$@" | sed -n 's/^STEP .*step_ms=\([0-9.]*\) tgt_tok_per_s=\([0-9]*\).*/\1 ms\/step, \2 target tok\/s/p'; }
row "1. base model step, fp32, CPU, 16 x 32 tokens" "$(step --config base --batch 16 --len 32 --steps 3 --warmup 1)"
row "2. small model step, fp32, CPU, 64 x 32 tokens" "$(step --config small --batch 64 --len 32 --steps 3 --warmup 1)"
