#!/usr/bin/env bash
# loss_reads: ./train on the emulated GPU (build/emu/train, make emu) leaves each step's loss on the device
# until a log row, the progress line, a validation, a checkpoint or the stop needs it, then reads every
# unread step's in one copy (DeviceModel::step_loss_sums, a ring of kLossRing = 64 steps):
#   1. the loss log.csv keeps is the same bits whether it was read every step or late;
#   2. the reads are counted (the emulator's CUDA_EMULATOR_REPORT): 70 steps with a log row every 66th step
#      take 67 reads fewer than with a row each step: the losses are read at step 64 (the ring is full), 66
#      (the row) and 70 (the stop). Without the read at 64, step 66's would throw (65 steps unread);
#   3. a NaN loss is still named by its step when read late, the step the every-step run names.
# A model of 1 layer, d_model 16, on a corpus of 174 batches an epoch: no validation or checkpoint before
# the stop reads the losses.
set -uo pipefail
root=$(cd "$1" && pwd)
emu=$root/build/emu/train
NAME=loss_reads
source "$root/test/cli_check.sh"
[ -x "$emu" ] || { echo "FAIL $NAME: $emu is missing (make emu)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive CUDA_EMULATOR_REPORT=1
tiny_corpus tiny 800
common=(--data tiny --merges 10 --config tiny --layers 1 --d-model 16 --d-ff 32 --heads 2 --batch-tokens 64 --warmup 1000
        --val-sentences 1 --quiet --device cuda)

# reads RUN: the host reads the emulator counted in RUN.err
reads() { sed -n 's/^cuda_emulator: at exit: .*, \([0-9]*\) reads to the host$/\1/p' "$1.err"; }
# loss_at RUN STEP: log.csv's loss at STEP (17 digits: the double's bits)
loss_at() { awk -F, -v s="$2" '$1 == s { print $3 }' "$1/log.csv"; }

"$emu" "${common[@]}" --max-steps 70 --log-every 1 --out every > every.out 2> every.err
check "70 steps, a log row each ($(tail -1 every.out))" grep -q "at step 70" every.out
"$emu" "${common[@]}" --max-steps 70 --log-every 66 --out late > late.out 2> late.err
check "70 steps, a log row every 66th ($(tail -1 late.out))" grep -q "at step 70" late.out
check "no epoch ends in 70 steps" grep -q "^batches: 174 per epoch" late.out
check "step 66's loss read late is the same bits: $(loss_at late 66) vs $(loss_at every 66)" \
  test -n "$(loss_at every 66)" -a "$(loss_at late 66)" = "$(loss_at every 66)"
r1=$(reads every) r66=$(reads late)
echo "$NAME: host reads, a row each step: ${r1:-none}; a row every 66th: ${r66:-none}"
check "67 reads fewer when the loss is read at steps 64, 66 and 70 only (${r1:-?} - ${r66:-?})" \
  test -n "$r1" -a -n "$r66" -a "$((r1 - r66))" -eq 67

# 3. the learning rate far too large: the loss goes NaN within a few steps
nan=(--lr-scale 1e9 --warmup 1 --max-steps 40)
"$emu" "${common[@]}" "${nan[@]}" --log-every 1 --out nan1 > nan1.out 2> nan1.err
"$emu" "${common[@]}" "${nan[@]}" --log-every 1000 --out nan2 > nan2.out 2> nan2.err
at1=$(sed -n 's/.*the loss is NaN at step \([0-9]*\):.*/\1/p' nan1.err) at2=$(sed -n 's/.*the loss is NaN at step \([0-9]*\):.*/\1/p' nan2.err)
check "a NaN read late names its step: ${at2:-none}, read each step: ${at1:-none}" test -n "$at1" -a "$at1" = "$at2"
cli_finish
