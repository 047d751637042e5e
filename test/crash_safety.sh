#!/usr/bin/env bash
# crash_safety: ./train killed with SIGKILL at random moments, checkpoint writes included, never leaves a
# run it cannot resume, and a full disk during a checkpoint costs nothing written before.
#   1. TRIALS times (default 60): resume the run with a checkpoint every 0.06 s, wait until it has written
#      one, then SIGKILL it after a random 0-150 ms (a checkpoint write takes a good share of that time).
#      After every kill: model.bin names a whole checkpoint that ./translate loads, never an earlier step
#      than before. Each trial resumes from the last one's model.bin (it must run until killed and write a
#      later checkpoint; the killed run's lock on the folder is released by the kernel), and a final resume
#      runs to the end. Kills that landed inside a write are counted
#      by the temporary files they left.
#   2. A file-size limit (ulimit -f) smaller than a checkpoint: the resumed run stops at its first
#      checkpoint with one line, and model.bin still names the same, intact checkpoint.
# Usage: crash_safety.sh ROOT [TRIALS]
set -u
root="$(cd "$1" && pwd)"
trials="${2:-60}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
NAME=crash_safety
source "$root/test/cli_check.sh"
export OMP_NUM_THREADS=1  # a tiny model: one thread is as fast, and no thread spins at a barrier while a core is busy
run=(--data numbers --quiet --layers 1 --d-model 32 --d-ff 64 --heads 2 --merges 20 --batch-tokens 256 --val-every 1000000
     --val-sentences 5 --keep 3 --out run)
"$root/train" "${run[@]}" --max-steps 2 > first.log 2>&1 || { echo "crash_safety: the first run failed"; cat first.log; exit 1; }
step_of() { readlink run/model.bin | sed 's/ckpt-0*\([0-9]*\)\.bin/\1/'; }
loads() { echo "nine" | "$root/translate" -m run/model.bin --greedy > /dev/null 2> load.err; }

inside=0
for trial in $(seq 1 "$trials"); do
  before=$(step_of)
  "$root/train" "${run[@]}" --resume --max-steps 100000000 --checkpoint-every 0.001 > trial.log 2> trial.err &
  pid=$!
  for _ in $(seq 1 2000); do  # until this run has written a checkpoint (or has stopped)
    [ "$(step_of)" != "$before" ] && break
    kill -0 $pid 2> /dev/null || break
    sleep 0.01
  done
  sleep "0.$(printf '%03d' $((RANDOM % 150)))"
  kill -9 $pid 2> /dev/null
  wait $pid 2> /dev/null
  rc=$?
  if [ $rc -ne 137 ]; then check "trial $trial: train ran until killed (exit $rc: $(cat trial.err))" false; break; fi
  ls run/*.tmp > /dev/null 2>&1 && inside=$((inside + 1))
  if ! loads; then check "trial $trial: model.bin (step $(step_of)) loads after the kill: $(cat load.err)" false; break; fi
  if [ "$(step_of)" -lt "$before" ]; then check "trial $trial: model.bin went back from step $before to $(step_of)" false; break; fi
done
echo "crash_safety: $trials SIGKILLs, $inside inside a checkpoint write (a temporary file left), model.bin loaded after every one; resumed from step 2 to step $(step_of)"
final=$(( $(step_of) + 3 ))
"$root/train" "${run[@]}" --resume --max-steps $final > final.log 2>&1
check "a last resume continues to step $final" grep -q "stopped: --max-steps reached at step $final" final.log
check "no temporary file is left after a clean end" test -z "$(ls run/*.tmp 2> /dev/null)"

# 2. a full disk: the checkpoint (about 370 KB) cannot be written under a 100 KB file-size limit
target=$(readlink run/model.bin)
cp "run/$target" saved.bin
expect_error "a full disk stops training with one line" "cannot write .*ckpt-.*File too large; training stopped, the last good checkpoint (run/$target) is kept" \
  bash -c "ulimit -f 100; exec '$root/train' ${run[*]} --resume --max-steps $((final + 5))"
check "model.bin still names the checkpoint before" test "$(readlink run/model.bin)" = "$target"
check "and it is intact" cmp -s "run/$target" saved.bin
check "and it loads" loads
check "no temporary file is left" test -z "$(ls run/*.tmp 2> /dev/null)"
cli_finish
