#!/usr/bin/env bash
# gpu_counts: `make bench` counts what a training step asks of the GPU with the emulator's dry run (launches
# and cuBLAS calls checked and counted, not run). The dry run must count exactly what the full run does:
# here both run one step of the small and base models (fp32, and the small one in bf16) on a small batch
# and every count must agree; the bf16 step's products are cublasGemmEx, the fp32 step has none. The count
# line's launches, read as make bench's row 6 reads it (test/field.sh), must be its kernels' lines summed.
set -euo pipefail
root="$1"
bench="$root/build/grade/test/bench"
. "$root/test/field.sh"
fail=0
# make bench's row 6 reads the count line with field: a name must be read whole (launches=82 was read as
# host_launches' 1 from b39bfc5 until 2026-11-27)
for want in "launches 82" "host_launches 1" "cublas 3"; do
  read -r name value <<< "$want"
  got=$(echo "COUNT config=small launches=82 cublas=3 graphs=3 host_launches=1" | field "$name")
  if [ "$got" != "$value" ]; then
    echo "FAIL gpu_counts: field $name reads $got from a count line, not $value"
    fail=1
  fi
done
for run in "small fp32" "base fp32" "small bf16"; do
  read -r config precision <<< "$run"
  full=$("$bench" --count --config "$config" --precision "$precision" --batch 3 --len 7)
  dry=$(CUDA_EMULATOR_DRY_RUN=1 "$bench" --count --config "$config" --precision "$precision" --batch 3 --len 7)
  launches=$(echo "$full" | head -n 1 | field launches)
  kernels=$(echo "$full" | awk -F'[ =]' '$1 == "KERNEL" && $2 !~ /^cublas/ { n += $NF } END { print n + 0 }')
  echo "gpu_counts: $run: $(echo "$full" | head -n 1)"
  if [ -z "$launches" ] || [ "$launches" -eq 0 ]; then
    echo "FAIL gpu_counts: $run: the full run counted no launches"
    fail=1
  elif [ "$launches" -ne "$kernels" ]; then
    echo "FAIL gpu_counts: $run: the count line's launches=$launches, its kernels' lines $kernels"
    fail=1
  elif [ "$full" != "$dry" ]; then
    echo "FAIL gpu_counts: $run: the dry run counts otherwise than the full run:"
    diff <(echo "$full") <(echo "$dry") || true
    fail=1
  elif [ "$precision" = bf16 ] && ! echo "$full" | grep -q '^KERNEL cublasGemmEx=[1-9]'; then
    echo "FAIL gpu_counts: $run: no cublasGemmEx in a bf16 step"
    fail=1
  elif [ "$precision" = fp32 ] && echo "$full" | grep -q '^KERNEL \(cublasGemmEx\|cublasGemmStridedBatchedEx\|to_bf16_kernel\)='; then
    echo "FAIL gpu_counts: $run: bf16 work in an fp32 step"
    fail=1
  else
    echo "gpu_counts: $run: the dry run's $(echo "$dry" | wc -l) count lines equal the full run's"
  fi
done
exit $fail
