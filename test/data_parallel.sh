#!/usr/bin/env bash
# data_parallel: `mpirun -np 2 ./train` (parallel.h) on this machine's cores, against one process.
#   - 2 ranks give the loss curve and parameters of 1 rank with --accumulate 2, within 1e-6 relative after 10
#     steps (and test/accumulate checks that --accumulate 2 is one batch of the two merged);
#   - a stop and --resume on 2 ranks continue the same run, and so does a resume on 1 rank with --accumulate 2;
#   - ranks that start with different parameters are refused, naming the step; a rank that dies or hangs
#     makes the other stop with one line, not hang;
#   - on the emulated GPU (build/emu/train), 2 ranks against 1 rank with --accumulate 2: the GPU path's
#     gradients summed by MPI in its "device" buffers, where NCCL would sum them on GPUs.
# A build without MPI refuses to run under a launcher of several processes (one line), then this test skips.
set -uo pipefail
root=$(cd "$1" && pwd)
train=$root/train
NAME=data_parallel
source "$root/test/cli_check.sh"
work=$(mktemp -d)
trap 'pkill -KILL -f -- "--out $work/" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"

if ! ldd "$train" | grep libmpi > /dev/null; then
  expect_error "a build without MPI under a launcher of 2 processes" "this build has no MPI" \
    env OMPI_COMM_WORLD_SIZE=2 "$train" --data numbers --max-steps 1 --out "$work/nompi"
  cli_finish || exit 1
  echo "data_parallel: skipped: ./train was built without MPI (install libopenmpi-dev and openmpi-bin, then make)"
  exit 77
fi
if ! command -v mpirun > /dev/null; then
  echo "data_parallel: skipped: ./train has MPI but mpirun is not on the PATH (openmpi-bin)"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# OpenMPI's own allocations outlive MPI_Finalize: LeakSanitizer would report them (train_cli checks ours)
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
mpi=(mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x ASAN_OPTIONS)
# warm-up 1000: Adam's first steps turn gradients at rounding level into full-size updates, so at a larger
# learning rate two summation orders drift apart faster than 1e-6 in 10 steps (NOTES.md)
common=(--data numbers --max-steps 10 --warmup 1000 --val-sentences 1 --test-sentences 1 --quiet)
compare="$root/build/test/accumulate --compare"

# the same loss, step by step, in two log.csv files: relative difference at most 1e-6
same_losses() {
  awk -F, 'NR == FNR { if (FNR > 1) loss[$1] = $3; next }
           FNR > 1 { n++; d = $3 - loss[$1]; if (d < 0) d = -d; r = d / loss[$1]; if (r > worst) worst = r }
           END { printf "loss curves %s vs %s: %d steps, worst relative difference %.3g (tol 1e-6)\n", ARGV[1], ARGV[2], n, worst;
                 exit !(n >= 10 && worst <= 1e-6) }' "$1/log.csv" "$2/log.csv"
}

# 1. 2 ranks against 1 rank with --accumulate 2
"${mpi[@]}" "$train" "${common[@]}" --out "$work/r2" > r2.log 2>&1
check "2 ranks train 10 steps ($(tail -1 r2.log))" test -s r2/model.bin
check "2 ranks: rank 0 alone prints (one model line)" test "$(grep -c '^model: ' r2.log)" -eq 1
check "2 ranks: the steps line names them" grep -q "^steps: 2 batches each (2 ranks x --accumulate 1).*summed with MPI" r2.log
"$train" "${common[@]}" --accumulate 2 --out "$work/a2" > a2.log 2>&1
check "1 rank, --accumulate 2, trains 10 steps ($(tail -1 a2.log))" test -s a2/model.bin
check "2 ranks and --accumulate 2: the same loss curve" same_losses r2 a2
check "2 ranks and --accumulate 2: the same parameters" $compare r2/model.bin a2/model.bin
"$train" "${common[@]}" --out "$work/a1" > a1.log 2>&1
check "the comparison can fail: 1 rank without accumulation differs" sh -c "test -s a1/model.bin && ! $compare r2/model.bin a1/model.bin > /dev/null 2>&1"

# 2. a stop after 5 steps, then --resume to 10: on 2 ranks, and on 1 rank with --accumulate 2
"${mpi[@]}" "$train" "${common[@]}" --max-steps 5 --out "$work/s2" > s2.log 2>&1
cp -r s2 s1
"${mpi[@]}" "$train" "${common[@]}" --resume --out "$work/s2" > s2b.log 2>&1
check "2 ranks resumed at step 5 ($(grep '^resumed' s2b.log))" grep -q "^resumed from .* at step 5" s2b.log
check "2 ranks, stopped and resumed: the parameters of the run without a stop, to the bit" \
  sh -c "$compare s2/model.bin r2/model.bin | grep 'differ by 0 relative'"
"$train" "${common[@]}" --accumulate 2 --resume --out "$work/s1" > s1.log 2>&1
check "1 rank with --accumulate 2 resumes a 2-rank checkpoint: the same parameters" $compare s1/model.bin r2/model.bin

# 3. ranks with different parameters (mpirun's two programs, two seeds): refused, naming the step
mpirun --oversubscribe -x OMP_NUM_THREADS -x ASAN_OPTIONS -np 1 "$train" "${common[@]}" --out "$work/seeds" --seed 1 : \
  -np 1 "$train" "${common[@]}" --out "$work/seeds" --seed 2 > seeds.log 2>&1
rc=$?
check "ranks with different parameters: an error naming the step, one line from rank 0 (exit $rc)" \
  sh -c "test $rc -ne 0 && test \$(grep -c '^train: the ranks hold different parameters at step 0: training stopped\$' seeds.log) -eq 1"

# 4. a rank that dies (SIGKILL) or hangs (SIGSTOP) while the ranks train: the other stops, with one line
rank_pid() {  # out-folder rank: the pid of that rank's ./train, once the ranks have taken a step together
  for _ in $(seq 1 600); do
    for pid in $(pgrep -f -- "--out $work/$1\$"); do
      if tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -x "OMPI_COMM_WORLD_RANK=$2" > /dev/null && test -s "$work/$1/model.bin"; then
        echo "$pid"; return 0
      fi
    done
    sleep 0.1
  done
  return 1
}
stops_within() {  # seconds pid-of-mpirun: waits for it to end
  for _ in $(seq 1 $(($1 * 10))); do kill -0 "$2" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}
for how in KILL STOP; do
  out=$(echo "$how" | tr A-Z a-z)
  # (a checkpoint every step: model.bin says the ranks are past start-up, where they may be far apart)
  "${mpi[@]}" "$train" "${common[@]}" --max-steps 1000000 --checkpoint-every 0.001 --collective-timeout 20 \
    --out "$work/$out" > "$out.log" 2>&1 &
  launcher=$!
  victim=$(rank_pid "$out" 1)
  kill -"$how" "$victim"
  stops_within 60 "$launcher"
  ended=$?
  [ $ended -eq 0 ] || kill -KILL "$launcher"
  wait "$launcher" 2>/dev/null
  rc=$?
  kill -KILL "$victim" 2>/dev/null
  line=$([ "$how" = KILL ] && echo "^train: rank 0: ended by the launcher (SIGTERM: Ctrl-C, or another rank ended)" \
                            || echo "^train: rank 0: another rank did not join the all-reduce of .* within --collective-timeout 20 s")
  # (a stopped rank, ended by the launcher, may print its own line: the other's is counted)
  check "a rank that gets SIG$how: the other stops within 60 s, exit $rc, one line ($(grep '^train: rank 0' "$out.log" | tr '\n' ' '))" \
    sh -c "test $ended -eq 0 && test $rc -ne 0 && test \$(grep -c '^train: rank 0' $out.log) -eq 1 && grep -q '$line' $out.log"
done

# 5. the emulated GPU: the GPU path's gradients summed over MPI (a small corpus and the tiny model: every kernel
#    runs on the CPU, each thread a fiber).
#    9 batches an epoch: the 5th step has one batch, so rank 1 has none and adds zeros; the 6th is in epoch 2
emu=$root/build/emu/train
if [ -x "$emu" ] && ldd "$emu" | grep libmpi > /dev/null; then
  tiny_corpus tiny 42
  small=(--data tiny --merges 10 --config tiny --batch-tokens 64 --max-steps 6 --warmup 1000 --val-sentences 1 --quiet --device cuda)
  "${mpi[@]}" "$emu" "${small[@]}" --out "$work/g2" > g2.log 2>&1
  check "emulated GPU, 2 ranks train 6 steps over 9 batches an epoch ($(tail -1 g2.log))" \
    sh -c "grep -q 'device cuda (emulated GPU' g2.log && grep -q '^batches: 9 per epoch' g2.log && grep -q 'at step 6 (epoch 1.22)' g2.log"
  "$emu" "${small[@]}" --accumulate 2 --out "$work/ga" > ga.log 2>&1
  check "emulated GPU, 2 ranks and --accumulate 2: the same parameters" $compare g2/model.bin ga/model.bin
else
  echo "data_parallel: the emulated GPU's ./train (build/emu/train, make emu) is missing or has no MPI: part 5 not run"
  checks=$((checks + 1)) fails=$((fails + 1))
fi
cli_finish
