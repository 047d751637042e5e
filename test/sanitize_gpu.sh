#!/usr/bin/env bash
# sanitize_gpu: parity_gpu under compute-sanitizer, memcheck and racecheck; any reported error fails.
# Exits 77 (skipped) when parity_gpu skips (no CUDA path or no GPU) or compute-sanitizer is missing.
# Usage: sanitize_gpu.sh BIN_DIR
set -u
bin="$1/parity_gpu"
"$bin" > /dev/null 2>&1
rc=$?
[ $rc -eq 77 ] && { echo "sanitize_gpu: parity_gpu skips here: skipped"; exit 77; }
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
[ -x "$sanitizer" ] || { echo "sanitize_gpu: compute-sanitizer not found: skipped"; exit 77; }
status=0
for tool in memcheck racecheck; do
  out="$("$sanitizer" --tool "$tool" --error-exitcode 99 "$bin" 2>&1)"
  code=$?
  echo "$out" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" || true
  if [ $code -ne 0 ]; then echo "FAIL sanitize_gpu: $tool (exit $code)"; echo "$out" | tail -20; status=1; fi
done
[ $status -eq 0 ] && echo "sanitize_gpu: memcheck and racecheck report no errors"
exit $status
