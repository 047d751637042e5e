#!/usr/bin/env bash
# `make bench`: one row per figure (a benchmark, not a test: it prints measurements and checks nothing).
# Training-step rows come from build/test/bench; the Multi30k rows run ./train and ./translate.
# This build has no GPU path yet, so every row runs on the CPU, with batches reduced to fit it.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "bench: CPU rows only ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'));" \
     "the GPU rows and the PyTorch ratios need the CUDA training path"
printf '%-66s %s\n' "figure" "result"
row() { printf '%-66s %s\n' "$1" "$2"; }
step() { ./build/test/bench "$@" | sed -n 's/^STEP .*step_ms=\([0-9.]*\) tgt_tok_per_s=\([0-9]*\).*/\1 ms\/step, \2 target tok\/s/p'; }
row "1. base model step (fp32, dropout on), 16 x 32 tokens a side" "$(step --config base --batch 16 --len 32 --steps 3 --warmup 1)"
row "2. small model step (fp32, dropout on), 64 x 32 tokens a side" "$(step --config small --batch 64 --len 32 --steps 3 --warmup 1)"
if [ ! -s data/multi30k/train.en ]; then
  row "3-4. Multi30k rows" "skipped: run \`make data\` first"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
./train --data data/multi30k --config small --max-steps 6 --val-sentences 0 --quiet --out "$work/run" > "$work/train.log" 2>&1
# tokens/s over steps 2..6 (the first step carves the activation arena)
tps=$(awk -F, 'NR > 2 && $5 != "" { s += $5; n++ } END { if (n) printf "%.0f", s / n }' "$work/run/log.csv")
row "3. Multi30k en-de, small config, real 4096-token batches (6 steps)" "$tps target tok/s"
head -n 100 data/multi30k/test_2016_flickr.en > "$work/in.txt"
for mode in "--greedy" "--beam 4"; do
  t0=$(date +%s.%N)
  ./translate -m "$work/run/model.bin" $mode -i "$work/in.txt" -o "$work/out.txt"
  t1=$(date +%s.%N)
  toks=$(wc -w < "$work/out.txt")
  row "4. translate 100 test_2016_flickr sentences, ${mode#--}, 6-step model" \
      "$(awk -v a="$t0" -v b="$t1" -v w="$toks" 'BEGIN { printf "%.2f s, %.1f sentences/s, %.0f words/s", b - a, 100 / (b - a), w / (b - a) }')"
done
echo "(row 4: a model trained 6 steps emits long outputs, up to source length + 50 tokens: a worst case for decoding time)"
