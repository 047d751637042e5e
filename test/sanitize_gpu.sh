#!/usr/bin/env bash
# sanitize_gpu: the GPU path under compute-sanitizer; any reported error in our code fails. memcheck,
# initcheck and synccheck run parity_gpu (every op, a whole step, graphs, decoding); racecheck, 50-100
# times slower, runs two small training steps (bench: 2 sentences of 40 tokens, two tiles of the attention
# kernels each way, and of 24, one). cuBLAS's Hopper kernels order their shared memory with mbarriers,
# which racecheck does not follow: on an H100 it reported hazards inside nvjet_sm90_..._splitK. So a
# hazard between two accesses of cuBLAS's kernels (nvjet_*, cublas*) is shown but excused; any other
# fails. (Leaving those kernels out with --kernel-name or --kernel-name-exclude made the sanitizer itself
# fail: "Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception".) The excuse is
# tested first on two made-up reports.
# Exits 77 (skipped) when parity_gpu skips (no CUDA path or no GPU) or compute-sanitizer is missing.
# Usage: sanitize_gpu.sh BIN_DIR
set -u
# our_races: racecheck's report on stdin; prints its hazards that are not between two cuBLAS accesses
our_races() {
  awk '/Race reported between/ { a = $0; getline b; if ((a b) !~ /at (nvjet_|cublas)[^ ]*\+0x[0-9a-f]+.*at (nvjet_|cublas)[^ ]*\+0x/) print a " / " b }'
}
cublas_race='========= Error: Race reported between Read access at nvjet_sm90_tss_64x16_64x16_4x2_h_bx_splitK_NNT+0xb30
=========     and Write access at nvjet_sm90_tss_64x16_64x16_4x2_h_bx_splitK_NNT+0x2fd0 [384 hazards]'
our_race='========= Error: Race reported between Write access at void gpu::attention_backward_kernel<2>(float *)+0x1a0
=========     and Read access at nvjet_sm90_tss_64x16_64x16_4x2_h_bx_splitK_NNT+0x2fd0 [12 hazards]'
if [ -n "$(echo "$cublas_race" | our_races)" ] || [ -z "$(echo "$our_race" | our_races)" ]; then
  echo "FAIL sanitize_gpu: the cuBLAS excuse passes a hazard of ours, or fails one of cuBLAS's"; exit 1
fi
bin="$1/parity_gpu"
"$bin" > /dev/null 2>&1
rc=$?
[ $rc -eq 77 ] && { echo "sanitize_gpu: parity_gpu skips here: skipped"; exit 77; }
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
[ -x "$sanitizer" ] || { echo "sanitize_gpu: compute-sanitizer not found: skipped"; exit 77; }
status=0
for tool in memcheck initcheck synccheck; do
  out="$("$sanitizer" --tool $tool --error-exitcode 99 "$bin" 2>&1)"
  code=$?
  echo "$tool on parity_gpu: $(echo "$out" | grep "ERROR SUMMARY" | tail -n 1)"
  if [ $code -ne 0 ]; then echo "FAIL sanitize_gpu: $tool (exit $code)"; echo "$out" | tail -20; status=1; fi
done
for len in 40 24; do  # 40: two tiles each way; 24: one, the attention backward's one block a head
  out="$("$sanitizer" --tool racecheck "$1/bench" --config small --batch 2 --len $len --device cuda --precision bf16 --steps 1 --warmup 1 2>&1)"
  code=$?
  echo "racecheck on a small step of $len tokens a side: $(echo "$out" | grep "RACECHECK SUMMARY" | tail -n 1)"
  ours="$(echo "$out" | our_races)"
  if [ $code -ne 0 ] || [ -n "$ours" ] || echo "$out" | grep -q "Internal Sanitizer Error"; then
    echo "FAIL sanitize_gpu: racecheck at $len tokens (exit $code)"; echo "${ours:-$(echo "$out" | tail -20)}"; status=1
  fi
done
[ $status -eq 0 ] && echo "sanitize_gpu: memcheck, initcheck and synccheck report no errors, racecheck none in our kernels"
exit $status
