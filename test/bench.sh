#!/usr/bin/env bash
# `make bench`: one row per figure (a benchmark, not a test: it prints measurements and checks nothing).
#   1-2. one training step of the base and small models on a fixed batch (build/test/bench), dropout on
#   3.   Multi30k En->De training, small config, real batches (./train): target tokens/s
#   4.   translating test_2016_flickr, greedy and beam 4 (./translate --stats)
#   5.   data parallelism on the CPU: 2 ranks under mpirun against 1 rank (scaling efficiency)
#   6.   what one training step asks of the GPU, small and base models at 256 x 32 tokens a side: kernel
#        launches, cuBLAS calls, copies, device memory, counted by the emulated GPU (build/grade/test/bench
#        --count, a dry run: each launch and product checked and counted, not run), on any machine
#   7.   with BENCH_LATE_RUN=DIR: throughput late in a long run (below)
# With a GPU (a CUDA build on a machine that has one) the rows run there at full size: 256 x 32 tokens a
# side, ours in fp32, TF32 and bf16 (and bf16 without CUDA graphs), Multi30k for 3 epochs in bf16 and in
# fp32 with each one's test BLEU, all 1000 test sentences. Where python3 has torch with CUDA, the PyTorch
# reference (torch_ref.py: .ref/ on the GPU machine, else ../shared/bench/) runs the same shapes in the
# same call, in bf16 eager and bf16 + torch.compile (its best), and each figure is also given as ratios:
# PyTorch's time / ours (above 1: we are faster).
# Without a GPU every row runs on the CPU with smaller batches and fewer steps, and it says so; where a
# python3 has torch (python3, $TORCH_PYTHON, or ~/torch-venv/bin/python), the PyTorch CPU peer
# (torch_cpu_step.py: .ref/, else ../shared/bench/) runs the step rows alternately with ours, $BENCH_RUNS
# times each (default 3), and the ratio is given for the fastest and the median run; row 3's peer,
# test/torch_cpu_train.py, trains the same model on the very batches ./train trained on (--batches-out),
# alternately with ./train, as many times. Each of our CPU rows also gives its peak resident memory.
# With BENCH_LATE_RUN=DIR (the folder of a long `./train` run on Multi30k, started with the options in
# BENCH_LATE_ARGS, default "--config small") row 7 resumes it for a few steps: tokens/s late in training
# beside a fresh run of the same options. Before the rows: this machine's fp32 peak and the gemm on the
# model's shapes (gemm_bench). BENCH_ROWS="3 6" runs only the rows named (1 and 2 go together, as do 3 and
# 4); unset: every row.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=./build/test/bench
row() { printf '%-66s %-40s %s\n' "$1" "$2" "${3:-}" | sed 's/ *$//'; }
. test/field.sh  # field NAME: the last NAME=value of the input
wants() { [ -z "${BENCH_ROWS:-}" ] || [[ " $BENCH_ROWS " == *" $1 "* ]]; }  # is row $1 asked for?
ratio() { awk -v t="$1" -v o="$2" 'BEGIN { if (t > 0 && o > 0) printf "%.2fx", t / o; else print "-" }'; }

if "$bench" --device cuda --batch 2 --len 4 --steps 1 --warmup 0 > /dev/null 2>&1; then
  device=cuda
  echo "bench: GPU rows on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo 'a GPU'), $(date -u +%F)"
else
  device=cpu
  echo "bench: no GPU (no CUDA path in this build, or no GPU present): CPU rows only, smaller batches;" \
       "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
fi
ref="" refdata=""
for f in .ref/torch_ref.py ../shared/bench/torch_ref.py; do [ -f "$f" ] && { ref=$f; break; }; done
for d in .ref/multi30k "${MULTI30K_DIR:-}" ../shared/data/multi30k; do [ -n "$d" ] && [ -f "$d/train.en.gz" ] && { refdata=$d; break; }; done
torch=0
if [ $device = cuda ] && [ -n "$ref" ] && [ -n "$refdata" ] &&
   python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  torch=1
  echo "PyTorch reference: $ref on $refdata (torch $(python3 -c 'import torch; print(torch.__version__)'))"
else
  echo "PyTorch reference: not run (it needs a GPU, python3 with torch, torch_ref.py and Multi30k's .gz files)"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cpu_py="" cpu_torch=""  # the PyTorch CPU peers: a python with torch; with it, torch_cpu_step.py (rows 1-2)
if [ $device = cpu ]; then
  step_ref=""
  for f in .ref/torch_cpu_step.py ../shared/bench/torch_cpu_step.py; do [ -f "$f" ] && { step_ref=$f; break; }; done
  for py in python3 "${TORCH_PYTHON:-}" ~/torch-venv/bin/python; do
    if [ -n "$py" ] && "$py" -c 'import torch' 2> /dev/null; then cpu_py=$py; break; fi
  done
  if [ -n "$cpu_py" ] && [ -n "$step_ref" ]; then cpu_torch="$cpu_py $step_ref"; fi
  echo "PyTorch CPU peers: ${cpu_py:-none (no python3 with torch)}${cpu_py:+: steps ${step_ref:-not run (no torch_cpu_step.py)}, Multi30k training test/torch_cpu_train.py}"
  ./build/test/gemm_bench | sed 's/^/  /'
fi
runs=${BENCH_RUNS:-3}
rss() { /usr/bin/time -f 'RSS_KB=%M' "$@" 2>&1; }  # a command's output, then its peak resident memory
mb() { awk -v k="$1" 'BEGIN { printf "%.0f", k / 1024 }'; }
stats() { sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%s %s\n", v[1], v[int((NR + 1) / 2)] }'; }  # min median
row "figure" "ours" "$([ $torch = 1 ] && echo 'PyTorch / ours')$([ -n "$cpu_torch" ] && echo 'PyTorch / ours (fastest, median)')"

# 1-2. training steps
torch_ms() {  # PyTorch's GPU step time in bf16 for the model in ${shape[@]}, eager or with more flags (--compile)
  python3 "$ref" --data "$refdata" --out "$work" --microbench --precision bf16 --batch_tokens 8192 "${shape[@]}" "$@" 2>&1 |
    grep '^MICRO' | field step_ms || true
}
small_args=(--d 256 --ff 1024 --layers 3 --dropout 0.2)
step_configs=()
if wants 1 || wants 2; then step_configs=(base small); fi
for config in "${step_configs[@]}"; do
  if [ $device = cuda ]; then
    modes=(fp32 tf32 bf16 bf16-op-by-op) batch=256 steps=(--steps 20 --warmup 5)  # the last: CUDA graphs off
  else
    modes=(fp32) batch=$([ $config = base ] && echo 16 || echo 64) steps=(--steps 3 --warmup 1)
  fi
  shape=()  # the reference's flags for this model (its defaults are the base model's)
  if [ $config = small ]; then shape=("${small_args[@]}"); fi
  if [ $torch = 1 ]; then torch_eager=$(torch_ms) torch_compiled=$(torch_ms --compile); fi
  for mode in "${modes[@]}"; do
    vs="" mem=""
    if [ $device = cpu ]; then  # alternately ours and PyTorch's, $runs times; the ratios of the fastest and median
      : > "$work/ours.txt"; : > "$work/torch.txt"
      for ((r = 0; r < runs; r++)); do
        out=$(rss "$bench" --config $config --batch $batch --len 32 --device cpu "${steps[@]}")
        echo "$out" | field step_ms >> "$work/ours.txt"
        mem=$(mb "$(echo "$out" | field RSS_KB)")
        if [ -n "$cpu_torch" ]; then
          $cpu_torch "${shape[@]}" --batch $batch --len 32 "${steps[@]}" 2>&1 | grep '^STEP' | field step_ms >> "$work/torch.txt" || true
        fi
      done
      read -r ms ms_med < <(stats < "$work/ours.txt")
      tps=$(awk -v b=$batch -v m="$ms" 'BEGIN { printf "%.0f", b * 32 / (m / 1e3) }')
      if [ -s "$work/torch.txt" ]; then
        read -r tmin tmed < <(stats < "$work/torch.txt")
        vs="$(ratio "$tmin" "$ms"), $(ratio "$tmed" "$ms_med") (PyTorch $tmin-$tmed ms)"
      fi
      ms="$ms (fastest), $ms_med (median)" mem=", peak RSS ${mem} MB"
    else
      precision=${mode%-op-by-op}
      graphs=$([ "$mode" = "$precision" ] && echo on || echo off)
      out=$("$bench" --config $config --batch $batch --len 32 --device $device --precision $precision --graphs $graphs "${steps[@]}")
      ms=$(echo "$out" | field step_ms) tps=$(echo "$out" | field tgt_tok_per_s)
    fi
    if [ $torch = 1 ]; then
      vs="$(ratio "$torch_eager" "$ms") bf16 eager, $(ratio "$torch_compiled" "$ms") bf16 torch.compile (PyTorch $torch_eager, $torch_compiled ms)"
    fi
    n=$([ $config = base ] && echo 1 || echo 2)
    row "$n. $config model step, $mode, dropout on, $batch x 32 tokens a side" "$ms ms/step, $tps target tok/s$mem" "$vs"
  done
done

# 5. data parallelism on this machine's CPU cores (test/data_parallel.sh checks it is right): target tokens/s
#    of 2 ranks (mpirun, one thread each) against 1 rank on one thread (the scaling efficiency) and 1 rank on
#    two (OpenMP's threads): the small model on the number corpus, 2048-token batches
data_parallel_row() {
  if ! ldd ./train | grep libmpi > /dev/null || ! command -v mpirun > /dev/null; then
    row "5. data parallelism, 2 ranks" "skipped: ./train has no MPI, or mpirun is missing"
    return
  fi
  local args=(--data numbers --config small --batch-tokens 2048 --max-steps 12 --val-sentences 0 --quiet --device cpu) r1 r2 t2
  mean_tps() { awk -F, 'NR > 3 && $5 != "" { s += $5; n++ } END { if (n) printf "%.0f", s / n }' "$1/log.csv"; }
  OMP_NUM_THREADS=1 ./train "${args[@]}" --out "$work/dp1" > /dev/null 2>&1
  OMP_NUM_THREADS=2 ./train "${args[@]}" --out "$work/dpt" > /dev/null 2>&1
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS ./train "${args[@]}" --out "$work/dp2" > /dev/null 2>&1
  r1=$(mean_tps "$work/dp1") t2=$(mean_tps "$work/dpt") r2=$(mean_tps "$work/dp2")
  row "5. data parallelism, small model, numbers, 2048-token batches" \
      "2 ranks $r2, 1 rank $r1 (2 threads: $t2) target tok/s" \
      "scaling $(awk -v a="$r2" -v b="$r1" 'BEGIN { if (a > 0 && b > 0) printf "%.0f%%", 50 * a / b; else print "-" }')"
}

gpu_counts_rows() {
  local out
  for config in small base; do
    for precision in fp32 bf16; do
      out=$(CUDA_EMULATOR_DRY_RUN=1 ./build/grade/test/bench --count --config $config --precision $precision --batch 256 --len 32 |
            head -n 1)
      row "6. GPU work per training step, $config model, $precision, 256 x 32 tokens" \
          "$(echo "$out" | field launches) kernels and $(echo "$out" | field cublas) cuBLAS calls ($(echo "$out" | field weight_grad_stream) of them on the weight gradients' stream), in $(echo "$out" | field graphs) CUDA graph launches and $(echo "$out" | field host_launches) kernels launched alone; $(echo "$out" | field to_host) device-to-host copies, $(echo "$out" | field peak_MiB) MiB"
    done
  done
}

if [ ! -s data/multi30k/train.en ]; then
  if wants 3 || wants 4; then row "3-4. Multi30k rows" "skipped: run \`make data\` first"; fi
  if wants 5; then data_parallel_row; fi
  if wants 6; then gpu_counts_rows; fi
  exit 0
fi

# train_tps DIR [FIRST]: the mean of DIR/log.csv's per-step tokens/s after step FIRST + 1 (default 0: after
# the run's first step), the final validation's row left out (rows 3 and 7)
train_tps() {
  awk -F, -v s="${2:-0}" 'NR > 1 && $1 > s + 1 && $5 != "" && $6 == "" { t += $5; n++ } END { if (n) printf "%.0f\n", t / n }' \
      "$1/log.csv"
}
# 3. Multi30k training throughput on real batches (train_tps: the mean per-step tokens/s after the first step)
if wants 3 || wants 4; then
if [ $device = cuda ]; then train_len=(--epochs 3) what="3 epochs"; else train_len=(--max-steps 6) what="6 steps"; fi
# on a GPU: bf16 here, fp32 beside it below; on the CPU the batches for PyTorch's peer
if [ $device = cuda ]; then run_args=(--precision bf16); else run_args=(--batches-out "$work/batches.txt"); fi
rss ./train --data data/multi30k --config small --device $device "${train_len[@]}" "${run_args[@]}" --val-sentences 0 --quiet \
    --out "$work/run" > "$work/train.log" 2>&1
tps=$(train_tps "$work/run")
# test_bleu DIR: greedy BLEU of DIR's model on test_2016_flickr (sacreBLEU's, printed by ./translate --ref)
test_bleu() {
  ./translate -m "$1/model.bin" --device $device --greedy -i data/multi30k/test_2016_flickr.en \
      --ref data/multi30k/test_2016_flickr.de -o /dev/null 2>&1 | sed -n 's/^BLEU = \([0-9.]*\) .*/\1/p'
}
mem=", peak RSS $(mb "$(field RSS_KB < "$work/train.log")") MB" fresh=$tps
vs="" torch_decode=""
if [ $device = cpu ] && [ -n "$cpu_py" ]; then  # PyTorch on the same batches, alternately with ours, $runs times
  echo "$tps" > "$work/ours.txt"; : > "$work/torch.txt"
  for ((r = 0; r < runs; r++)); do
    if ((r > 0)); then
      ./train --data data/multi30k --config small --device cpu "${train_len[@]}" --val-sentences 0 --quiet \
          --vocab "$work/run/vocab.bpe" --out "$work/again" > /dev/null 2>&1 && train_tps "$work/again" >> "$work/ours.txt"
      rm -rf "$work/again"
    fi
    $cpu_py test/torch_cpu_train.py "$work/batches.txt" 2>&1 | grep '^TRAIN' | field tgt_tok_per_s >> "$work/torch.txt" || true
  done
  read -r tps_min tps_med < <(stats < "$work/ours.txt")
  read -r ttps_min ttps_med < <(stats < "$work/torch.txt") || true  # empty when the peer failed: the ratio is "-"
  tps_max=$(sort -g "$work/ours.txt" | tail -n 1) ttps_max=$(sort -g "$work/torch.txt" | tail -n 1)
  tps="$tps_max (fastest), $tps_med (median)"
  # throughputs: ours / PyTorch's is PyTorch's time / ours
  vs="$(ratio "$tps_max" "$ttps_max"), $(ratio "$tps_med" "$ttps_med") (PyTorch ${ttps_min}-${ttps_max} tok/s)"
fi
if [ $torch = 1 ]; then
  python3 "$ref" --data "$refdata" --out "$work" "${small_args[@]}" --lr_factor 2 --batch_tokens 4096 --epochs 3 \
          --precision bf16 > "$work/torch_train.log" 2>&1 || true
  ttps=$(awk '/^epoch/ { for (i = 1; i < NF; i++) if ($i == "tgt_tok_per_s" && $2 > 1) { s += $(i + 1); n++ } } END { if (n) printf "%.0f", s / n }' "$work/torch_train.log")
  torch_bleu=$(sed -n 's/^RESULT .*greedy sacreBLEU \([0-9.]*\) .*/\1/p' "$work/torch_train.log" | head -n 1)
  # a throughput: ours / PyTorch's is the same ratio as its time / ours
  vs="$(ratio "$tps" "${ttps:-0}") (PyTorch bf16 eager ${ttps:-?} tok/s, test BLEU ${torch_bleu:-?})"
  torch_decode=$(sed -n 's/^RESULT .*decode_s \([0-9.]*\).*/\1/p' "$work/torch_train.log" | head -n 1)
fi
if [ $device = cuda ]; then
  row "3. Multi30k en-de, small config, real 4096-token batches, $what, bf16" "$tps target tok/s$mem, test BLEU $(test_bleu "$work/run") (greedy)" "$vs"
  mkdir -p "$work/run32" && cp "$work/run/vocab.bpe" "$work/run32/"
  rss ./train --data data/multi30k --config small --device $device "${train_len[@]}" --precision fp32 --val-sentences 0 --quiet \
      --vocab "$work/run32/vocab.bpe" --out "$work/run32" > "$work/train32.log" 2>&1
  row "3. Multi30k en-de, small config, real 4096-token batches, $what, fp32" \
      "$(train_tps "$work/run32") target tok/s, peak RSS $(mb "$(field RSS_KB < "$work/train32.log")") MB, test BLEU $(test_bleu "$work/run32") (greedy)"
else
  row "3. Multi30k en-de, small config, real 4096-token batches, $what" "$tps target tok/s$mem" "$vs"
fi

# 4. translating test_2016_flickr with the model of row 3
if [ $device = cuda ]; then sentences=1000; else sentences=100; fi
head -n $sentences data/multi30k/test_2016_flickr.en > "$work/in.txt"
for mode in "--greedy" "--beam 4"; do
  rss ./translate -m "$work/run/model.bin" --device $device $mode --stats -i "$work/in.txt" -o "$work/out.txt" > "$work/stats.txt"
  mem=", peak RSS $(mb "$(field RSS_KB < "$work/stats.txt")") MB"
  s=$(sed -n 's/.* in \([0-9.]*\) s on .*/\1/p' "$work/stats.txt") tps=$(sed -n 's/.*, \([0-9]*\) tokens\/s$/\1/p' "$work/stats.txt")
  vs=""
  if [ $torch = 1 ]; then vs=$([ "$mode" = --greedy ] && ratio "${torch_decode:-0}" "$s" || echo "- (the reference has no beam search)"); fi
  row "4. translate $sentences test_2016_flickr sentences, ${mode#--}" "$s s, $tps target tok/s$mem" "$vs"
done
echo "(row 4 decodes with the model of row 3, $what of training; PyTorch's greedy decoding has no K/V cache)"
fi

# 7. late in training: a long run's checkpoint resumed for 6 steps, alternately with a fresh run of the same
# options for 6 steps, $runs times each (BENCH_LATE_RUN=DIR; BENCH_LATE_ARGS, default "--config small", the
# options the run was started with, which --resume needs; its vocabulary, so that no BPE is learned). The
# mean of each run's per-step tokens/s after its first step, as train_tps.
if [ -n "${BENCH_LATE_RUN:-}" ] && wants 7; then
  read -r -a late_args <<< "${BENCH_LATE_ARGS:---config small}"
  step=$(readlink "$BENCH_LATE_RUN/model.bin" | sed -n 's/^ckpt-0*\([0-9][0-9]*\)\.bin$/\1/p')
  : > "$work/early.txt"; : > "$work/late.txt"
  for ((r = 0; r < runs; r++)); do
    for run in early late; do
      rm -rf "${work:?}/$run" && mkdir -p "$work/$run" && cp "$BENCH_LATE_RUN/vocab.bpe" "$work/$run/"
      if [ $run = early ]; then from=(--max-steps 6) first=0
      else cp -L "$BENCH_LATE_RUN/model.bin" "$work/late/model.bin" && from=(--resume --max-steps $((step + 6))) first=$step; fi
      rss ./train --data data/multi30k "${late_args[@]}" --device $device "${from[@]}" --vocab "$work/$run/vocab.bpe" \
          --out "$work/$run" --val-sentences 0 --quiet > "$work/$run.log" 2>&1
      train_tps "$work/$run" "$first" >> "$work/$run.txt"
    done
  done
  read -r _ early_med < <(stats < "$work/early.txt") || true  # empty when a run trained no step: the ratio is "-"
  read -r _ late_med < <(stats < "$work/late.txt") || true
  early_max=$(sort -g "$work/early.txt" | tail -n 1) late_max=$(sort -g "$work/late.txt" | tail -n 1)
  row "7. Multi30k, ${late_args[*]}: resumed at step $step of $BENCH_LATE_RUN, 6 steps" \
      "$late_max (fastest), $late_med (median) target tok/s, peak RSS $(mb "$(field RSS_KB < "$work/late.log")") MB" \
      "late / fresh: $(ratio "$late_max" "$early_max"), $(ratio "$late_med" "$early_med") (fresh $(sort -g "$work/early.txt" | head -n 1)-$early_max tok/s)"
fi
if wants 5; then data_parallel_row; fi
if wants 6; then gpu_counts_rows; fi
