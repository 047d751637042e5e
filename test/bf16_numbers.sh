#!/usr/bin/env bash
# bf16_numbers: a short training run on the number corpus in bf16 reaches the exact match of fp32. The tiny
# model, one epoch (522 steps of 1,024 tokens a side), the same seed and batches: fp32 on the CPU (the
# reference), then the GPU's bf16 mixed precision. Passes when bf16's exact match on the test split is at
# least fp32's less 2 points (10 of its 500 sentences), and fp32's at least 80% (a run too short to learn
# the task proves nothing).
# It has not run on a GPU yet. CTest runs it twice: bf16_numbers with ROOT/train on a GPU (exits 77, skipped,
# without one), and bf16_numbers_emulated with TRAIN, build/grade/train, whose GPU is the emulated one
# (cuda_emulator.h; CI's plain stage runs it).
# Usage: bf16_numbers.sh ROOT [TRAIN]   (BF16_NUMBERS_STEPS=N stops both runs after N steps instead of one epoch)
set -u
root=$1
train=${2:-$root/train}
if [ $# -ge 2 ] && nm "$train" 2>/dev/null | grep -q __asan_init; then  # a SANITIZE=1 build
  echo "bf16_numbers: $train is built with AddressSanitizer (SANITIZE=1), which runs it several times slower: skipped (the plain build runs it)"
  exit 77
fi
if [ $# -lt 2 ]; then
  "$root/build/test/parity_gpu" > /dev/null 2>&1
  [ $? -eq 77 ] && { echo "bf16_numbers: no GPU here (parity_gpu skips): skipped"; exit 77; }
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
length=(--epochs 1)
[ -n "${BF16_NUMBERS_STEPS:-}" ] && length=(--max-steps "$BF16_NUMBERS_STEPS")
# exact_match NAME ARGS...: trains with ./train's ARGS, prints the test split's exact match (a percentage)
exact_match() {
  local out=$work/$1 start=$SECONDS name=$1
  shift
  "$train" --data numbers --seed 1 "${length[@]}" --val-sentences 1 --quiet "$@" --out "$out" > "$out.log" 2>&1 ||
    { echo "FAIL bf16_numbers: ./train $* failed:" >&2; tail -3 "$out.log" >&2; return 1; }
  echo "$name: $(grep '^test:' "$out.log") ($((SECONDS - start)) s)" >&2
  # ./train's default --test-sentences: the whole test split
  grep -q '^test: .* on 500 sentences (greedy)$' "$out.log" || { echo "FAIL bf16_numbers: $name did not decode all 500 test sentences" >&2; return 1; }
  sed -n 's/^test: .*exact match \([0-9.]*\)%.*/\1/p' "$out.log"
}
fp32=$(exact_match fp32 --device cpu) && bf16=$(exact_match bf16 --device cuda --precision bf16) || exit 1
[ -n "$fp32" ] && [ -n "$bf16" ] || { echo "FAIL bf16_numbers: no exact match in ./train's output"; exit 1; }
if awk -v a="$bf16" -v b="$fp32" 'BEGIN { exit !(b >= 80 && a >= b - 2) }'; then
  echo "bf16_numbers: bf16 exact match $bf16% against fp32's $fp32% (bound: fp32's less 2 points, fp32 at least 80%)"
else
  echo "FAIL bf16_numbers: bf16 exact match $bf16% against fp32's $fp32% (bound: fp32's less 2 points, fp32 at least 80%)"
  exit 1
fi
