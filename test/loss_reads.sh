#!/usr/bin/env bash
# loss_reads: ./train on the emulated GPU (build/emu/train, make emu) leaves each step's loss on the device
# until a validation, the progress line, a checkpoint or the stop needs it, or 64 steps (kLossRing) are
# unread; then it reads every unread step's in one copy (DeviceModel::step_loss_sums) and writes each into
# its log row. Quiet, a log row each step, 70 steps:
#   1. take 3 reads: at step 1 (the run's first step is read at once), at step 65 (the ring is full) and at
#      the stop. Without the read at 65, the stop's would ask for 69 steps and be refused; 10 steps take 2;
#   2. log the same bits for every step's loss as a run that reads every 5th step (it validates then;
#      validation changes nothing in training);
#   3. a NaN loss is still named by its step when read late: the step a run that reads each step names;
#   4. a row's tokens/s is that of the steps read with it (the host's clock stops when it has queued a step,
#      not when the GPU has run it): the 70 rows carry one rate per read, finite and positive: step 1's, steps 2-65's,
#      steps 66-70's.
# A model of 1 layer, d_model 16, on a corpus of 174 batches an epoch: no validation or checkpoint before
# the stop unless asked for.
set -uo pipefail
root=$(cd "$1" && pwd)
emu=$root/build/emu/train
NAME=loss_reads
source "$root/test/cli_check.sh"
[ -x "$emu" ] || { echo "FAIL $NAME: $emu is missing (make emu)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
tiny_corpus tiny 800
common=(--data tiny --merges 10 --config tiny --layers 1 --d-model 16 --d-ff 32 --heads 2 --batch-tokens 64 --warmup 1000
        --val-sentences 1 --quiet --device cuda)
# reads RUN: "READS STEPS", from the line ./train prints at the stop
reads() { sed -n 's/^losses: read from the GPU \([0-9]*\) times\? in \([0-9]*\) steps .*/\1 \2/p' "$1.out"; }

"$emu" "${common[@]}" --max-steps 70 --out late > late.out 2> late.err
check "70 steps, quiet ($(tail -1 late.out); $(head -1 late.err))" grep -q "at step 70" late.out
check "no epoch ends in 70 steps" grep -q "^batches: 174 per epoch" late.out
check "70 steps' losses read in 3 reads (got: $(reads late))" test "$(reads late)" = "3 70"
"$emu" "${common[@]}" --max-steps 10 --out short > short.out 2> short.err
check "10 steps' losses read in 2 reads (got: $(reads short))" test "$(reads short)" = "2 10"
"$emu" "${common[@]}" --max-steps 70 --val-every 5 --out often > often.out 2> often.err
check "with a validation every 5th step, 15 reads (got: $(reads often))" test "$(reads often)" = "15 70"
# log.csv: step,epoch,loss,... (17 digits: the double's bits); the rows of the 70 steps, without the final
# validation row
losses() { awk -F, 'NR > 1 && !seen[$1]++ { print $1, $3 }' "$1/log.csv"; }
check "70 logged losses, none empty" test "$(losses late | awk 'NF == 2' | wc -l)" -eq 70
check "every step's logged loss is the same bits read late as read every 5th step ($(diff <(losses late) <(losses often) | head -2 | tr '\n' ' '))" \
  diff -q <(losses late) <(losses often)
# 4. tokens_per_s ($5) of the 70 rows, by read: "1 RATE", "2 RATE" (steps 2-65), "3 RATE" (66-70); each
# group one finite positive rate. (Not that the three differ: they are clock readings, and on the emulated
# GPU, whose steps all take about as long, two of them came out equal in the log's digits: 262, 264, 262.)
rates() { awk -F, 'NR > 1 && !seen[$1]++ { print ($1 == 1 ? 1 : $1 <= 65 ? 2 : 3), $5 }' "$1/log.csv" | sort -u; }
check "the 70 rows carry one tokens/s per read (got: $(rates late | tr '\n' ' '))" \
  test "$(rates late | wc -l)" = 3 -a "$(rates late | cut -d' ' -f1 | tr -d '\n')" = 123 \
       -a "$(rates late | awk '$2 + 0 > 0 && $2 + 0 < 1e300' | wc -l)" = 3

# 3. the learning rate far too large: the loss goes NaN within a few steps
nan=(--lr-scale 1e9 --warmup 1 --max-steps 40)
"$emu" "${common[@]}" "${nan[@]}" --out nan1 > nan1.out 2> nan1.err
"$emu" "${common[@]}" "${nan[@]}" --val-every 1 --out nan2 > nan2.out 2> nan2.err
at1=$(sed -n 's/.*the loss is NaN at step \([0-9]*\):.*/\1/p' nan1.err) at2=$(sed -n 's/.*the loss is NaN at step \([0-9]*\):.*/\1/p' nan2.err)
check "a NaN read late names its step: ${at1:-none}, read each step: ${at2:-none}" test -n "$at1" -a "$at1" = "$at2"
cli_finish
