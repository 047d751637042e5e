#!/usr/bin/env bash
# train_cli: ./train end to end on the built-in corpus, on the CPU.
#   1. a short run's loss falls below a threshold derived from the vocabulary (below); --test-sentences
#      chooses how many test sentences the end decodes (0: the test loss alone);
#   2. resume determinism: 40 steps straight == 20 steps, --resume, 20 more (losses identical, bit for bit);
#   3. Ctrl-C writes a checkpoint and exits 0; --average writes a model ./translate can use;
#   4. bad input: one clear line and a non-zero exit;
#   5. a NaN loss stops training and keeps the last good checkpoint;
#   6. what ./train prints comes in order in a log captured with `> log 2>&1`; curves.svg draws what
#      log.csv measured and nothing else, laid out inside its canvas (test/svg_check.py), and is replaced
#      atomically (a new file renamed over the old: its inode changes, no temporary file is left);
#   7. --checkpoint-every epoch writes one checkpoint an epoch; --patience stops on a validation loss
#      that no longer falls, and counts on across a resume;
#   8. --config multi30k's recipe; 9. --batches-out;
#  10. the run folder is the user's data: a new run into one that holds a run (or another vocabulary), --resume with another
#      vocabulary, --merges or --batch-tokens are refused and leave it byte for byte; --overwrite starts over;
#      a second ./train on it meets the first's lock; --average and --keep take only this run's checkpoints;
#      SIGTERM, and a quick second signal, still write the checkpoint; a byte-order mark is not text.
# Usage: train_cli.sh ROOT
set -u
root="$(cd "$1" && pwd)"
train="$root/train"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
NAME=train_cli
source "$root/test/cli_check.sh"
# the test split's 500 sentences decoded after every run took 13 s of a sanitized build's run of 1 step
common=(--data numbers --quiet --val-every 1000000 --val-sentences 50 --test-sentences 20)

# 1. The loss must end well below chance. With V tokens and label smoothing eps the loss cannot go
#    below the entropy of the smoothed target, H = -(1-eps) ln(1-eps) - eps ln(eps/(V-1)), and a model
#    that has learnt nothing scores about ln V. Threshold: halfway between them, after 150 steps.
"$train" "${common[@]}" --max-steps 150 --out short > short.log 2>&1
check "short run exits 0" grep -q "stopped: --max-steps reached at step 150" short.log
check "--test-sentences 20: the test line's exact match is on 20 sentences" \
  grep -Eq "^test: loss [0-9.]+, exact match [0-9.]+% on 20 sentences \(greedy\)$" short.log
V=$(sed -n 's/.* V=\([0-9]*\),.*/\1/p' short.log)
final=$(awk -F, '$1 == 150 { print $3; exit }' short/log.csv)
read -r threshold floor <<< "$(awk -v V="$V" 'BEGIN { e = 0.1; h = -(1-e)*log(1-e) - e*log(e/(V-1)); print h + 0.5*(log(V) - h), h }')"
echo "short run: V=$V, loss at step 150 = $final, threshold $threshold (floor $floor, chance $(awk -v V="$V" 'BEGIN{print log(V)}'))"
check "loss $final below threshold $threshold" awk -v a="$final" -v b="$threshold" 'BEGIN { exit !(a != "" && a < b) }'
# The runs below that do not look at BPE take this run's vocabulary instead of learning it again (2 s a
# run on the 2-core CI machine); `learning` runs learn it.
learning=("${common[@]}")
common+=(--vocab "$work/short/vocab.bpe")

# 2. Resume determinism
"$train" "${common[@]}" --seed 3 --max-steps 40 --out straight > /dev/null 2>&1
"$train" "${common[@]}" --seed 3 --max-steps 20 --out resumed > /dev/null 2>&1
"$train" "${common[@]}" --seed 3 --max-steps 40 --out resumed --resume > resumed.log 2>&1
check "resume announces step 20" grep -q "resumed from .* at step 20" resumed.log
losses() { awk -F, 'NR > 1 && !seen[$1]++ && $3 != "" { print $1, $3 }' "$1/log.csv"; }
check "40 logged losses" test "$(losses straight | wc -l)" -eq 40
if losses straight | cmp -s - <(losses resumed); then
  echo "resume determinism: 40 losses identical (last: $(losses straight | tail -1))"
else
  check "losses after resuming equal those of the uninterrupted run" false
  diff <(losses straight) <(losses resumed) | head -5
fi

# 3. Ctrl-C, averaging
"$train" "${common[@]}" --time-limit 60 --checkpoint-every 0.01 --average 3 --out interrupted > int.log 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -e interrupted/model.bin ] && break; sleep 0.1; done  # training has begun (under load, later than 4 s)
kill -INT $pid
wait $pid
rc=$?
check "Ctrl-C exits 0 (got $rc)" test $rc -eq 0
check "Ctrl-C is reported" grep -q "interrupted (Ctrl-C)" int.log
stopped_at=$(sed -n 's/^stopped: interrupted (Ctrl-C) at step \([0-9]*\) .*/\1/p' int.log)
check "Ctrl-C leaves a checkpoint of the step it stopped at ($stopped_at)" test "$(readlink interrupted/model.bin)" = "$(printf 'ckpt-%010d.bin' "${stopped_at:-0}")"
"$train" "${common[@]}" --max-steps 30 --checkpoint-every 0.002 --average 3 --out averaged > avg.log 2>&1
check "averaging is reported" grep -q "averaged the last 3 checkpoints" avg.log
check "the averaged model translates" sh -c "echo 'twenty-one' | '$root/translate' -m averaged/averaged.bin --vocab averaged/vocab.bpe > /dev/null"
check "log.csv and curves.svg written" test -s averaged/log.csv -a -s averaged/curves.svg

# 4. Bad input
mkdir -p bad
printf 'a b\nc d\ne f\n' > bad/train.en; printf 'x y\nz w\n' > bad/train.de
for s in val test_2016_flickr; do printf 'a\n' > bad/$s.en; printf 'b\n' > bad/$s.de; done
expect_error "source and target of different lengths" "has 3 lines but .*train.de has 2" "$train" --data bad --out badrun
expect_error "missing data folder" "no such folder" "$train" --data no/such/dir --out badrun
expect_error "missing file" "cannot read .*train.fr" "$train" --data bad --tgt fr --out badrun
printf 'a b\nc \xff d\ne f\n' > bad/train.de
expect_error "invalid UTF-8 names file and line" "train.de:2: invalid UTF-8 at byte 2" "$train" --data bad --out badrun
{ printf 'a b\n\n'; printf 'word%.0s ' {1..80}; printf '\n'; } > bad/train.de
"$train" --data bad --out badrun --max-steps 1 --quiet --config tiny --max-len 16 > skip.log 2>&1
check "empty and over-long pairs are skipped and counted" grep -q "skipped 1 with an empty side, 1 longer than 15 tokens" skip.log
expect_error "unwritable --out" "cannot write to --out" "$train" "${common[@]}" --max-steps 1 --out /proc/no/such
expect_error "resume with another configuration" "another configuration (N 2 vs 3)" "$train" "${common[@]}" --max-steps 41 --out resumed --resume --layers 3
expect_error "resume with another --batch-tokens" "--resume: the run trains on batches of --batch-tokens 1024: leave the option out" \
  "$train" "${common[@]}" --seed 3 --max-steps 41 --out resumed --resume --batch-tokens 100000
cp short/vocab.bpe resumed/vocab.bpe.other
"$train" "${learning[@]}" --merges 10 --max-steps 1 --out othervocab > /dev/null 2>&1
cp othervocab/vocab.bpe resumed/vocab.bpe
expect_error "resume with another vocabulary" "another vocabulary" "$train" "${learning[@]}" --max-steps 41 --out resumed --resume
expect_error "a batch that cannot fit in memory" "a batch of --batch-tokens 10000000 needs .* MB .* lower --batch-tokens" \
  "$train" "${common[@]}" --config big --batch-tokens 10000000 --max-steps 1 --out hugebatch
check "the model line reports the peak memory of a step" grep -Eq "^model: .*; peak memory [0-9]+ MB \(a step on the largest batch\)$" short.log
expect_error "unknown option" "unknown option '--bogus'" "$train" --bogus
expect_error "--precision on the CPU" "--precision is a GPU option" "$train" "${common[@]}" --max-steps 1 --out p1 --device cpu --precision tf32
expect_error "--precision fp16" "--precision fp16: expected fp32, tf32 or bf16" "$train" "${common[@]}" --max-steps 1 --out p2 --precision fp16
expect_error "bad number" "--max-steps needs an integer" "$train" --max-steps -5
expect_error "negative --test-sentences" "--test-sentences needs an integer" "$train" --test-sentences -1
if on_cuda_or_error "--device cuda without a GPU" "$train" "${common[@]}" --max-steps 1 --out gpurun --device cuda; then
  check "--device cuda trains a step and checkpoints it" test -s gpurun/model.bin
fi
check "--bpe-only shows how a line splits" sh -c "echo 'three hundred' | '$train' --data numbers --vocab short/vocab.bpe --bpe-only | grep -q '^▁th.* ▁hundred$'"
# 5. A learning rate far too large makes the loss NaN within a few steps: training stops with one line
#    naming the last good checkpoint (written every 0.06 s here), which is left intact and usable.
expect_error "a NaN loss stops training" "the loss is NaN at step .*last good checkpoint (nan/ckpt-.*) is kept" \
  "$train" "${common[@]}" --lr-scale 1e9 --warmup 1 --max-steps 100 --checkpoint-every 0.001 --out nan
check "the last good checkpoint still translates" sh -c "echo 'twenty-one' | '$root/translate' -m nan/model.bin > /dev/null"
check "--help lists the options with defaults" sh -c "'$train' --help | grep -q -- '--batch-tokens N .*default 4096'"

# 6. One captured log, in order; the curves
"$train" --data numbers --max-steps 60 --val-every 20 --val-sentences 20 --test-sentences 20 --out ordered > ordered.log 2>&1
first() { grep -n -m1 -- "$1" ordered.log | cut -d: -f1; }
order=""
for p in "^BPE: " "^data: " "^batches: " "^model: " "^step 1 | " "^validation at step 20:" "^validation at step 40:" \
         "^validation at step 60:" "^stopped: " "^checkpoint " "^test: "; do order="$order $(first "$p")"; done
check "the captured log holds every line in the order printed (first lines at:$order)" \
  sh -c "echo '$order' | awk '{ for (i = 1; i <= NF; i++) if (\$i == \"\" || (i > 1 && \$i <= \$(i - 1))) exit 1; exit NF != 11 }'"
check "no BLEU on the number corpus: its log.csv column is empty" \
  test "$(awk -F, 'NR > 1 && $7 != ""' ordered/log.csv | wc -l)" -eq 0
check "curves.svg: the measured series, no other, laid out" python3 "$root/test/svg_check.py" curves ordered/curves.svg ordered/log.csv
before=$(stat -c %i ordered/curves.svg)
"$train" --data numbers --max-steps 80 --val-every 20 --val-sentences 20 --test-sentences 1 --out ordered --resume > /dev/null 2>&1
check "curves.svg replaced by a new file (inode $before, then $(stat -c %i ordered/curves.svg))" \
  test "$(stat -c %i ordered/curves.svg)" != "$before"
check "no temporary file left in the run folder" test -z "$(ls ordered | grep '\.tmp$')"
check "the resumed curves: laid out, the validation at step 80 drawn" \
  sh -c "python3 '$root/test/svg_check.py' curves ordered/curves.svg ordered/log.csv && grep -q 'data-series=\"validation loss\" data-step=\"80\"' ordered/curves.svg"
"$train" "${common[@]}" --max-steps 5 --test-sentences 0 --out novalidation > novalidation.log 2>&1
check "--test-sentences 0: the test loss alone" grep -q "^test: loss [0-9.]*, no sentences decoded (--test-sentences 0)$" novalidation.log
check "curves.svg of a run whose only validation is the final one" \
  python3 "$root/test/svg_check.py" curves novalidation/curves.svg novalidation/log.csv

# 7. --checkpoint-every epoch and --patience, on a tiny corpus of 9 batches an epoch. A learning rate too
#    small to change the validation loss (about 1e-21: a zero bias moves to 1e-20, which no activation
#    feels; at 1e-14 the loss moved by 3e-8 at step 36) leaves it where it is: 2 validations without a lower
#    one stop the run at the end of epoch 3; a resume with --patience 3 counts the log's validations (as
#    computed, to the last bit) and stops one epoch later.
tiny_corpus tiny 42
tiny=(--data tiny --merges 10 --batch-tokens 64 --epochs 20 --checkpoint-every epoch --lr-scale 1e-9 --warmup 100000000 --keep 10 --quiet)
"$train" "${tiny[@]}" --patience 2 --out patient > patient.log 2>&1
check "--patience 2 stops after 2 validations without a lower loss ($(grep '^stopped' patient.log))" \
  grep -q "^stopped: --patience 2 reached (the best validation loss, .* at step 9, not bettered in 2 validations) at step 27 (epoch 3.00)" patient.log
check "--checkpoint-every epoch: one checkpoint at each epoch's end ($(ls patient | grep ckpt | tr '\n' ' '))" \
  test "$(ls patient | grep ckpt | tr '\n' ' ')" = "ckpt-0000000009.bin ckpt-0000000018.bin ckpt-0000000027.bin "
"$train" "${tiny[@]}" --patience 3 --out patient --resume > patient2.log 2>&1
check "a resume keeps counting validations ($(grep '^stopped' patient2.log))" \
  grep -q "^stopped: --patience 3 reached (.* at step 9, not bettered in 3 validations) at step 36" patient2.log
expect_error "--patience 0" "--patience needs an integer" "$train" --patience 0
expect_error "--checkpoint-every neither minutes nor epoch" "--checkpoint-every needs a number" "$train" --checkpoint-every often

# 8. --config multi30k is a whole recipe: its model, 4 batches of 2048 tokens a step, a checkpoint each epoch,
#    --patience 10, the last 10 checkpoints kept and averaged, and its decoding defaults for ./translate;
#    the command line still wins over each (the tiny corpus is one batch an epoch: a step an epoch).
"$train" --config multi30k --data tiny --merges 10 --lr-scale 1e-9 --quiet --out recipe > recipe.log 2>&1
check "the recipe's model and steps" sh -c "grep -q 'model: N=4 D=128 F=256 H=4 .* dropout 0.30' recipe.log &&
  grep -q 'about 2048 source and 2048 target tokens' recipe.log && grep -q '^steps: 4 batches each' recipe.log"
check "the recipe stops on --patience 10 ($(grep '^stopped' recipe.log))" \
  grep -q "^stopped: --patience 10 reached (.* at step 1, not bettered in 10 validations) at step 11 (epoch 11.00)" recipe.log
check "and keeps and averages the last 10 epoch checkpoints" sh -c \
  "test \$(ls recipe | grep -c ckpt) -eq 10 && grep -q 'averaged the last 10 checkpoints' recipe.log"
check "it writes ./translate's decoding defaults" sh -c "grep -qx 'beam 5' recipe/decoding.txt && grep -qx 'alpha 1.5' recipe/decoding.txt"
"$train" --config multi30k --data tiny --merges 10 --quiet --keep 3 --max-steps 30 --batch-tokens 64 --accumulate 1 --out recipe2 > recipe2.log 2>&1
check "options given win over the recipe's ($(grep -E '^(stopped|averaged)' recipe2.log | tr '\n' ' '))" sh -c \
  "grep -q '^stopped: --max-steps reached at step 30' recipe2.log && grep -q 'averaged the last 3 checkpoints' recipe2.log &&
   ! grep -q '^steps:' recipe2.log && grep -q 'about 64 source' recipe2.log"

# 9. --batches-out writes the model line and every batch trained on, ids row by row: B x S source ids, then
#    B x T decoder inputs and B x T targets (make bench's PyTorch peer trains on them); two batches a step
#    with --accumulate 2. A file it cannot write is one line and exit 1.
"$train" "${common[@]}" --max-steps 3 --accumulate 2 --out dumped --batches-out batches.txt > /dev/null 2>&1
check "--batches-out: a model line, then 6 batches of steps 1-3, each with its ids ($(grep -c '^batch' batches.txt) batches)" \
  awk 'NR == 1 { ok = /^model N=[0-9]+ D=[0-9]+ .* pad=0$/; next }
       /^batch/ { n++; split($0, h, " "); steps[h[2]]++; want[1] = h[3] * h[4]; want[2] = want[3] = h[3] * h[5]; k = 0; next }
       { k++; if (NF != want[k]) ok = 0 }
       END { exit !(ok && n == 6 && steps[1] == 2 && steps[2] == 2 && steps[3] == 2) }' batches.txt
expect_error "--batches-out into a missing folder" "cannot write no/such/dir/b.txt" "$train" "${common[@]}" --max-steps 1 --out nodump --batches-out no/such/dir/b.txt

# 10. The run folder. `straight` (section 2: seed 3, 40 steps) is a run; each refusal leaves it byte for byte.
fingerprint() { (cd "$1" && for f in *; do if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; else echo "$f $(md5sum < "$f")"; fi; done); }
before=$(fingerprint straight)
expect_error "a new run into a folder that holds one (--resume forgotten)" \
  "--out straight holds a run (model.bin, 1 checkpoint, log.csv, vocab.bpe): --resume continues it, --overwrite starts a new one" \
  "$train" "${learning[@]}" --seed 5 --merges 40 --max-steps 5 --out straight
expect_error "--resume with another vocabulary" "--resume: --vocab .*othervocab/vocab.bpe is not the run's vocabulary (straight/vocab.bpe)" \
  "$train" "${learning[@]}" --seed 3 --vocab "$work/othervocab/vocab.bpe" --max-steps 41 --out straight --resume
expect_error "--resume with --merges" "--resume: the run keeps its vocabulary (straight/vocab.bpe, given with --vocab): leave --merges out" \
  "$train" "${learning[@]}" --seed 3 --merges 40 --max-steps 41 --out straight --resume
expect_error "--resume and --overwrite" "--resume continues the run in --out, --overwrite starts a new one there: give one" \
  "$train" "${common[@]}" --seed 3 --max-steps 41 --out straight --resume --overwrite
check "and the folder is byte for byte as it was" test "$(fingerprint straight)" = "$before"
mkdir -p emptyrun
expect_error "--resume in an empty folder" "--resume: --out emptyrun holds no checkpoint to resume from: leave out --resume" \
  "$train" "${common[@]}" --max-steps 1 --out emptyrun --resume
expect_error "--merges and --vocab" "--merges learns a vocabulary, --vocab gives one" "$train" "${common[@]}" --merges 10 --out mv
expect_error "--src with the built-in corpus" "--src and --tgt choose a corpus folder's languages; the built-in corpus is English -> German" \
  "$train" --data numbers --src fr --out srcfr
expect_error "--lr-scale 0 states the range" "--lr-scale needs a number in \[1e-09, 1e+09\], got '0'" "$train" --lr-scale 0
mkdir -p vocabonly vocabother && cp short/vocab.bpe vocabonly/ && cp othervocab/vocab.bpe vocabother/
"$train" "${common[@]}" --max-steps 1 --out vocabonly > /dev/null 2>&1
check "a folder holding only the run's vocabulary (put there for --vocab) takes the run" test -L vocabonly/model.bin
expect_error "a folder holding another vocabulary" "--out vocabother holds another vocabulary than this run's (vocabother/vocab.bpe): --overwrite" \
  "$train" "${common[@]}" --max-steps 1 --out vocabother
check "and keeps it" cmp -s vocabother/vocab.bpe othervocab/vocab.bpe
cp -r straight over
"$train" "${common[@]}" --seed 5 --max-steps 3 --out over --overwrite > over.log 2>&1
check "--overwrite starts over: the run before deleted, the new one's checkpoint alone ($(ls over | grep ckpt | tr '\n' ' '))" \
  sh -c "grep -q '^--overwrite: deleted the run in over (model.bin, 1 checkpoint, log.csv, vocab.bpe)' over.log &&
         test \"\$(ls over | grep ckpt)\" = ckpt-0000000003.bin && test \$(wc -l < over/log.csv) -le 5"
# another run's checkpoint in the folder, under a later name: neither averaged nor pruned
"$train" "${common[@]}" --max-steps 10 --out mine > /dev/null 2>&1
cp -L straight/model.bin mine/ckpt-0000000099.bin
"$train" "${common[@]}" --max-steps 40 --checkpoint-every 0.001 --keep 3 --average 3 --out mine --resume > mine.log 2>&1
check "--average takes this run's checkpoints only ($(grep averaged mine.log))" \
  grep -Eq "^averaged the last [23] checkpoints of this run into mine/averaged.bin \[§6\] \(1 of another run left out\)$" mine.log
check "--keep 3 prunes this run's checkpoints only ($(ls mine | grep ckpt | tr '\n' ' '))" \
  sh -c "test -e mine/ckpt-0000000099.bin && test \$(ls mine | grep -c ckpt) -le 4"
# One process a folder: the second meets the first's lock, named by its process id. Then SIGTERM (a batch
# scheduler's, docker stop's) stops the first as Ctrl-C does: a checkpoint of its step, exit 0.
"$train" "${common[@]}" --time-limit 60 --checkpoint-every 0.01 --out locked > locked.log 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -e locked/model.bin ] && break; sleep 0.1; done
expect_error "a second ./train on the folder" "--out locked is in use by another ./train (process $pid): one run per folder" \
  "$train" "${common[@]}" --max-steps 5 --out locked --resume
kill -TERM $pid
wait $pid
rc=$?
stopped_at=$(sed -n 's/^stopped: interrupted (SIGTERM) at step \([0-9]*\) .*/\1/p' locked.log)
check "SIGTERM writes the checkpoint of the step it stopped at (${stopped_at:-none}) and exits 0 (exit $rc)" \
  sh -c "test $rc -eq 0 && test \"\$(readlink locked/model.bin)\" = \"$(printf 'ckpt-%010d.bin' "${stopped_at:-0}")\""
"$train" "${common[@]}" --time-limit 60 --checkpoint-every 0.01 --out twice > twice.log 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -e twice/model.bin ] && break; sleep 0.1; done
kill -INT $pid; sleep 0.01; kill -INT $pid; kill -TERM $pid
wait $pid
rc=$?
stopped_at=$(sed -n 's/^stopped: interrupted (Ctrl-C) at step \([0-9]*\) .*/\1/p' twice.log)
check "a quick second Ctrl-C and a SIGTERM wait for the checkpoint (step ${stopped_at:-none}, exit $rc)" \
  sh -c "test $rc -eq 0 && test \"\$(readlink twice/model.bin)\" = \"$(printf 'ckpt-%010d.bin' "${stopped_at:-0}")\""
# a byte-order mark (Windows editors write one) at the start of the training text is not a character of it
tiny_corpus bom 42
printf '\xef\xbb\xbf' | cat - bom/train.en > bom/x && mv bom/x bom/train.en
"$train" --data bom --merges 10 --max-steps 1 --quiet --val-sentences 1 --test-sentences 1 --out bomrun > /dev/null 2>&1
bom=$(printf '\xef\xbb\xbf')
check "a byte-order mark in the training data: not in the vocabulary" sh -c "test -s bomrun/vocab.bpe && ! grep -q '$bom' bomrun/vocab.bpe"

cli_finish
