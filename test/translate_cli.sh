#!/usr/bin/env bash
# translate_cli: ./translate end to end with a model trained here for a few seconds on the built-in corpus.
#   order and empty lines kept; greedy == beam 1; n-best lists (Moses: ids from 0); attention SVGs laid out
#   inside their canvas with no text over another (test/svg_check.py), for a short and a 40-piece sentence
#   and one head drawn large; interactive use at a terminal and through pipes (test/interactive.py);
#   --score prints what the library computes (the golden line of bleu_golden); bad input: one clear line
#   and a non-zero exit; the input is a stream (the first translations written while it is still open,
#   memory the same for 1,000 lines and 1,000,000); a byte-order mark changes nothing; -o that names the
#   model, its vocabulary or the input is refused, the file intact.
# Usage: translate_cli.sh ROOT
set -u
root="$(cd "$1" && pwd)"
translate="$root/translate"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
NAME=translate_cli
source "$root/test/cli_check.sh"
"$root/train" --data numbers --quiet --max-steps 300 --val-every 1000000 --val-sentences 10 --test-sentences 1 --out run > train.log 2>&1 ||
  { echo "translate_cli: training the test model failed"; cat train.log; exit 1; }
m=(-m run/model.bin)

printf 'three hundred and twenty-four\n\nseventy-one\n\n\nnine\n' > in.txt
"$translate" "${m[@]}" < in.txt > beam.txt
check "one output line per input line" test "$(wc -l < beam.txt)" -eq 6
check "empty lines stay empty, in place" test "$(sed -n '2p;4p;5p' beam.txt | tr -d '\n')" = ""
check "non-empty lines are translated" test -n "$(sed -n 1p beam.txt)" -a -n "$(sed -n 6p beam.txt)"
"$translate" "${m[@]}" --greedy -i in.txt -o greedy.txt
"$translate" "${m[@]}" --beam 1 -i in.txt -o beam1.txt
check "beam 1 equals greedy" cmp -s greedy.txt beam1.txt
"$translate" "${m[@]}" --n-best 3 < in.txt > nbest.txt
check "n-best: 3 hypotheses per non-empty line, one per empty line" test "$(wc -l < nbest.txt)" -eq 12
check "n-best lines are 'ID ||| text ||| score ||| logprob'" grep -q '^0 ||| .* ||| -[0-9.e-]* ||| -[0-9.e-]*$' nbest.txt
check "n-best ids count input lines from 0 (Moses)" test "$(cut -d' ' -f1 nbest.txt | uniq | tr '\n' ' ')" = "0 1 2 3 4 5 "

# attention maps: 3 kinds x 2 layers x 4 heads; a sentence of 40+ pieces (with characters XML escapes);
# one head, large (its 3 maps, cells larger than in the overview)
check "svg_check rejects what it must" python3 "$root/test/svg_check.py" self-test
"$translate" "${m[@]}" --attention att.svg < in.txt > /dev/null 2> att.log
check "attention SVG: 24 maps, laid out" python3 "$root/test/svg_check.py" attention att.svg 24
printf 'nine hundred & ninety-nine <thousand> %s\n' "$(printf 'seven %.0s' {1..40})" > long40.txt
"$translate" "${m[@]}" --attention long.svg < long40.txt > /dev/null 2> att.log
check "attention SVG of a 40+ piece sentence: 24 maps, laid out" python3 "$root/test/svg_check.py" attention long.svg 24
check "the long sentence's map has 40+ columns" \
  test "$(awk '/<g class="map"/ { on = 1; n = 0 } on && /<rect/ { n++ } /<\/g>/ && on { print n; exit }' long.svg)" -ge 1600
"$translate" "${m[@]}" --attention one.svg --attention-layer 2 --attention-head 3 < in.txt > /dev/null 2> att.log
check "--attention-layer 2 --attention-head 3: its 3 maps, laid out" python3 "$root/test/svg_check.py" attention one.svg 3
check "and they are that layer's and head's" test "$(grep -c 'data-title="[a-z -]*, layer 2, head 3"' one.svg)" -eq 3
cell() { sed -n 's/.*<rect x="[0-9.]*" y="[0-9.]*" width="\([0-9.]*\)".*/\1/p' "$1" | head -1; }
check "one head is drawn larger ($(cell one.svg) px cells) than all ($(cell att.svg) px)" \
  awk -v a="$(cell one.svg)" -v b="$(cell att.svg)" 'BEGIN { exit !(a > b) }'

# interactive: at a terminal (pseudo-terminal) and with --interactive through pipes
printf 'nine\nbad \xff line\nseven\n' | "$translate" "${m[@]}" --interactive > bad_interactive.txt 2> err.txt
rc=$?
check "--interactive: a line that is not UTF-8 is reported, its output line left empty, exit 1 (exit $rc)" \
  sh -c "[ $rc -eq 1 ] && grep -q 'stdin:2: invalid UTF-8 at byte 4' err.txt && [ \"\$(sed -n 2p bad_interactive.txt)\" = '' ] &&
         [ -n \"\$(sed -n 3p bad_interactive.txt)\" ] && [ \$(wc -l < bad_interactive.txt) -eq 3 ]"
check "interactive translation, line by line" python3 "$root/test/interactive.py" "$translate" run/model.bin \
  "three hundred and twenty-four" "seventy-one" "nine"
# --score equals the library call (bleu_golden checks the library prints this very line)
golden="$root/test/golden/bleu"
gzip -dc "$golden/test_2016_flickr.de.gz" > ref.de
"$translate" --score "$golden/hyp_small_test2016.de" --ref ref.de > score.txt
check "--score prints sacreBLEU's line" test "$(sed -n 1p score.txt)" = "BLEU = 33.93 63.0/39.7/27.6/19.2 (BP = 1.000 ratio = 1.059 hyp_len = 12816 ref_len = 12106)"
check "--score prints the signature" test "$(sed -n 2p score.txt)" = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
"$translate" "${m[@]}" -i in.txt --greedy --stats > /dev/null 2> stats.log
check "--stats: one line with the counts and speeds" \
  grep -Eq "^translate: 3 sentences, [0-9]+ target tokens in [0-9.]+ s on (cpu|cuda) \(greedy\): [0-9.]+ sentences/s, [0-9]+ tokens/s$" stats.log
"$translate" "${m[@]}" -i in.txt --ref in.txt > /dev/null 2> bleu.log
check "--ref prints BLEU on stderr" grep -q "^BLEU = " bleu.log

# decoding.txt beside the checkpoint gives the beam and alpha where the command line is silent (n-best
# scores show alpha); --tune chooses them on a validation set, as a table, and writes the best there
"$translate" "${m[@]}" --n-best 2 -i in.txt > plain.txt
"$translate" "${m[@]}" --beam 3 --alpha 1.5 --n-best 2 -i in.txt > b3.txt
printf '# a comment\n\nbeam 3\nalpha 1.5\n' > run/decoding.txt
"$translate" "${m[@]}" --n-best 2 -i in.txt > defaults.txt
check "decoding.txt's beam and alpha are the defaults" cmp -s b3.txt defaults.txt
check "and they change the output" sh -c "! cmp -s plain.txt b3.txt"
"$translate" "${m[@]}" --beam 4 --alpha 0.6 --n-best 2 -i in.txt > given.txt
check "--beam and --alpha win over decoding.txt" cmp -s plain.txt given.txt
expect_error "--n-best above decoding.txt's beam" "--n-best 4 is more than the beam of 3 (run/decoding.txt)" "$translate" "${m[@]}" --n-best 4 -i in.txt
printf 'beam 3\nbeam two\n' > run/decoding.txt
expect_error "a bad line of decoding.txt is named" "run/decoding.txt:2: expected 'beam K' or 'alpha A', got 'beam two'" "$translate" "${m[@]}" -i in.txt
printf 'beam 0\n' > run/decoding.txt
expect_error "a beam of 0 in decoding.txt" "run/decoding.txt:1: expected 'beam K' (K >= 1)" "$translate" "${m[@]}" -i in.txt
printf 'alpha 1 2\n' > run/decoding.txt
expect_error "trailing words in decoding.txt" "run/decoding.txt:1: expected" "$translate" "${m[@]}" -i in.txt
rm run/decoding.txt
expect_error "--precision on the CPU" "--precision is a GPU option: it needs --device cuda" "$translate" "${m[@]}" --device cpu --precision bf16 -i in.txt
expect_error "--precision fp8" "--precision fp8: expected fp32, tf32 or bf16" "$translate" "${m[@]}" --precision fp8 -i in.txt
# --tune on a model that reverses 5-word sentences of a tiny corpus (BLEU needs 4-grams): the table's
# cells are the BLEU ./translate --ref prints for that beam and alpha, and its best goes to decoding.txt
tiny_corpus tiny5 60 5
"$root/train" --data tiny5 --config tiny --merges 10 --max-steps 150 --batch-tokens 64 --quiet --out rev > rev.log 2>&1
printf '%s\n' "red blue green small big" "old young red blue green" "small big old young red" "big green red old small" \
  "young blue small red old" "green green big big red" > tune.en
printf '%s\n' "gross klein gruen blau rot" "gruen blau rot jung alt" "rot jung alt gross klein" "klein alt rot gruen gross" \
  "alt rot klein blau jung" "rot gross gross gruen gruen" > tune.de
"$translate" -m rev/model.bin --tune --beams 1,2,3 --alphas 0,0.6,2 -i tune.en --ref tune.de > tune.txt
cat tune.txt
best=$(awk 'NR == 2 { for (j = 2; j <= NF; j++) alpha[j] = $j } NR > 2 && NF == 4 {
         for (j = 2; j <= NF; j++) if (top == "" || $j + 0 > top + 0) { top = $j; b = $1; a = alpha[j] } }
       END { print "beam " b " alpha " a }' tune.txt)
check "--tune: a table of 3 beams x 3 alphas" test "$(awk 'NR > 2 && NF == 4' tune.txt | wc -l)" -eq 3
check "--tune writes the table's best to decoding.txt ($best; $(grep -v '^#' rev/decoding.txt | tr '\n' ' '))" \
  test "$best" = "$(grep -v '^#' rev/decoding.txt | tr '\n' ' ' | sed 's/ $//')"
"$translate" -m rev/model.bin --beam 3 --alpha 2 -i tune.en --ref tune.de > /dev/null 2> cell.log
check "a cell of the table is that decoding's BLEU ($(awk '$1 == 3 { print $4 }' tune.txt), $(sed -n 's/^BLEU = \([0-9.]*\) .*/\1/p' cell.log))" \
  test "$(awk '$1 == 3 { print $4 }' tune.txt)" = "$(sed -n 's/^BLEU = \([0-9.]*\) .*/\1/p' cell.log)"
check "the cells differ (the test can tell a wrong choice)" test "$(awk 'NR > 2 { for (j = 2; j <= NF; j++) print $j }' tune.txt | sort -u | wc -l)" -gt 2
expect_error "--tune needs a validation set" "--tune needs -i SOURCE and --ref REFERENCE" "$translate" "${m[@]}" --tune -i tune.en
expect_error "--tune with --beam" "--tune takes --beams and --alphas, not --greedy, --beam" "$translate" "${m[@]}" --tune --beam 2 -i tune.en --ref tune.de
expect_error "--beams with a 0" "--beams must be at least 1" "$translate" "${m[@]}" --tune --beams 1,0 -i tune.en --ref tune.de
expect_error "--beams without --tune" "--beams and --alphas are the grid of --tune" "$translate" "${m[@]}" --beams 2 -i tune.en
expect_error "--alphas not numbers" "--alphas needs a number >= 0, got 'x'" "$translate" "${m[@]}" --tune --alphas 1,x -i tune.en --ref tune.de

# bad input
printf 'nine\nbad \xff line\n' > bad.txt
expect_error "invalid UTF-8 names the line" "stdin:2: invalid UTF-8 at byte 4" "$translate" "${m[@]}" < bad.txt
check "the bad line's output line is empty, the others translated" sh -c "test \$(wc -l < out.txt) -eq 2 && test -n \"\$(sed -n 1p out.txt)\" && test -z \"\$(sed -n 2p out.txt)\""
expect_error "missing checkpoint" "cannot read checkpoint" "$translate" -m nope.bin
head -c 1000 run/model.bin > truncated.bin
expect_error "truncated checkpoint" "truncated" "$translate" -m truncated.bin --vocab run/vocab.bpe
echo "not a model" > foreign.bin
expect_error "foreign file" "not a checkpoint" "$translate" -m foreign.bin --vocab run/vocab.bpe
expect_error "a directory as the model" "run: a directory, not a checkpoint (give a file such as run/model.bin)" "$translate" -m run
cat run/model.bin > appended.bin; printf 'more' >> appended.bin
expect_error "bytes after the checkpoint" "appended.bin: [0-9]* bytes of checkpoint, as its header declares, then 4 more" \
  "$translate" -m appended.bin --vocab run/vocab.bpe
expect_error "/dev/zero as the model: refused after its first bytes" "/dev/zero: not a checkpoint" timeout 20 "$translate" -m /dev/zero --greedy -i in.txt
expect_error "/dev/zero as the input: a line over the limit" "/dev/zero:1: a line of more than 1048576 bytes" timeout 20 "$translate" "${m[@]}" -i /dev/zero
echo nine | "$translate" -m <(cat run/model.bin) --vocab run/vocab.bpe --greedy > piped.txt
check "a checkpoint through a pipe loads" test -s piped.txt
cp run/model.bin model.saved; cp run/vocab.bpe vocab.saved
expect_error "-o names the model" "-o run/model.bin is the model (run/model.bin): writing it would destroy it" "$translate" "${m[@]}" -i in.txt -o run/model.bin
expect_error "-o names the checkpoint model.bin links to" "is the model (run/model.bin)" "$translate" "${m[@]}" -i in.txt -o "run/$(readlink run/model.bin)"
expect_error "-o names the vocabulary" "-o run/vocab.bpe is the vocabulary" "$translate" "${m[@]}" -i in.txt -o run/vocab.bpe
expect_error "-o names the input" "-o in.txt is the input" "$translate" "${m[@]}" -i in.txt -o in.txt
check "the model, vocabulary and input are intact" sh -c "cmp -s run/model.bin model.saved && cmp -s run/vocab.bpe vocab.saved && test \$(wc -l < in.txt) -eq 6"
expect_error "--attention into a missing folder, before translating" "--attention no/such/att.svg: cannot write to no/such" \
  "$translate" "${m[@]}" -i in.txt --attention no/such/att.svg
check "and nothing was translated" test ! -s out.txt
expect_error "--greedy with --beam" "--greedy decodes without a beam" "$translate" "${m[@]}" --greedy --beam 4 -i in.txt
expect_error "--beam beyond its range states it" "--beam needs an integer in \[0, 1000000\], got '2147483648'" "$translate" "${m[@]}" --beam 2147483648
expect_error "--lowercase without --ref" "--lowercase is BLEU's: it needs --ref" "$translate" "${m[@]}" --lowercase -i in.txt
# a byte-order mark at the start of the input, the references or --score's file changes nothing
printf '\xef\xbb\xbf' | cat - in.txt > bom.txt
"$translate" "${m[@]}" --greedy -i bom.txt -o bom_out.txt
check "a byte-order mark before the first sentence does not change its translation" cmp -s greedy.txt bom_out.txt
printf '\xef\xbb\xbf' | cat - ref.de > bom_ref.de
"$translate" --score "$golden/hyp_small_test2016.de" --ref bom_ref.de > bom_score.txt
check "nor BLEU against references that start with one" cmp -s score.txt bom_score.txt
# A stream: with more than a window (8 batches of 32 lines) written and the input still open, the first
# translations are out; memory is the window's, not the input's (peak RSS, 1,000 lines against 1,000,000:
# most empty, every 1000th a sentence; read whole, the million lines took 115 MB more).
mkfifo feed
"$translate" "${m[@]}" --greedy < feed > streamed.txt 2> stream.err &
tpid=$!
exec 3> feed
( for _ in $(seq 1 300); do echo "nine hundred and one"; done >&3 ) 2> /dev/null  # (a subshell: a reader gone ends it alone)
for _ in $(seq 1 300); do [ -s streamed.txt ] && break; sleep 0.1; done
check "the first translations are written while the input is still open ($(wc -l < streamed.txt) lines)" test -s streamed.txt
( echo "seven" >&3 ) 2> /dev/null
exec 3>&-
wait $tpid
check "then the rest: 301 lines" test "$(wc -l < streamed.txt)" -eq 301
peak_kb() {  # peak resident memory of ./translate -i $1, in KB
  python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$translate" "${m[@]}" --greedy -i "$1"
}
if ldd "$translate" | grep -q libasan; then  # AddressSanitizer's quarantine keeps freed memory resident (256 MB)
  echo "translate_cli: a sanitizer build: the stream's peak memory is checked by the plain build only"
else
  awk 'BEGIN { for (i = 0; i < 1000; i++) print (i % 1000 == 0 ? "nine hundred and one" : "") }' > lines_1k.txt
  awk 'BEGIN { for (i = 0; i < 1000000; i++) print (i % 1000 == 0 ? "nine hundred and one" : "") }' > lines_1m.txt
  small_kb=$(peak_kb lines_1k.txt) large_kb=$(peak_kb lines_1m.txt)
  check "peak memory for 1,000,000 lines ($large_kb KB) within 1.2x of 1,000 lines' ($small_kb KB)" \
    awk -v a="$large_kb" -v b="$small_kb" 'BEGIN { exit !(a > 0 && b > 0 && a <= 1.2 * b) }'
fi
"$root/train" --data numbers --quiet --merges 20 --max-steps 1 --val-sentences 1 --test-sentences 1 --out other > /dev/null 2>&1
expect_error "vocabulary of another model" "not the vocabulary" "$translate" "${m[@]}" --vocab other/vocab.bpe
expect_error "--score without --ref" "--score needs --ref" "$translate" --score in.txt
printf 'a\n' > one.txt
expect_error "--score with different line counts" "has 6 lines but one.txt has 1" "$translate" --score in.txt --ref one.txt
if on_cuda_or_error "--device cuda without a GPU" "$translate" "${m[@]}" --device cuda --precision fp32 -i in.txt --greedy; then
  "$translate" "${m[@]}" --device cpu -i in.txt --greedy > cpu.txt
  check "--device cuda --precision fp32 translates as the CPU does" cmp -s out.txt cpu.txt
  "$translate" "${m[@]}" --device cuda -i in.txt --greedy > default.txt
  check "--device cuda in its default precision translates every line" sh -c '[ "$(wc -l < default.txt)" -eq 6 ]'
fi
expect_error "--attention-layer beyond the model" "--attention-layer 3: the model has 2 layers" \
  "$translate" "${m[@]}" --attention x.svg --attention-layer 3 -i in.txt
expect_error "--attention-head 0" "count from 1" "$translate" "${m[@]}" --attention x.svg --attention-head 0
expect_error "--attention-head without --attention" "need --attention FILE" "$translate" "${m[@]}" --attention-head 1
expect_error "--n-best above --beam" "--n-best 5 is more than the beam of 4: give a --beam" "$translate" "${m[@]}" --n-best 5
V=$(sed -n 's/.* V=\([0-9]*\),.*/\1/p' train.log)
expect_error "--beam beyond the vocabulary" "a beam of 100000 is more than the $((V - 2)) tokens the model can predict" \
  "$translate" "${m[@]}" --beam 100000 -i in.txt
expect_error "--n-best beyond the vocabulary" "a beam of 1000000 is more than" "$translate" "${m[@]}" --beam 1000000 --n-best 1000000 -i in.txt
"$translate" "${m[@]}" --greedy --max-extra 1000 -i in.txt > extra.txt 2> extra.err
check "--max-extra beyond max_len: one warning, still translated" \
  sh -c "test \$(wc -l < extra.err) -eq 1 && grep -q 'max-extra 1000 cannot be met: outputs stop at the model.s max_len of 64' extra.err && test \$(wc -l < extra.txt) -eq 6"
for i in $(seq 1 8); do echo "three hundred and twenty-four thousand nine hundred and one"; done > eight.txt
if ldd "$translate" | grep -q libasan; then  # AddressSanitizer reserves terabytes of address space: no ulimit -v
  echo "translate_cli: a sanitizer build: the memory cap under ulimit -v is checked by the plain build only"
else
  # the cap is 200 MB above the shared libraries the program maps (cuBLAS alone is over 500 MB in the nvcc build);
  # a sentence's beam of all the vocabulary takes about 30 MB
  libs_kb=$(ldd "$translate" | awk '$3 ~ /^\// {print $3}' | xargs stat -Lc %s | awk '{s += $1} END {print int(s / 1024)}')
  ( ulimit -v $((libs_kb + 200000)); exec "$translate" "${m[@]}" --device cpu --beam $((V - 2)) --batch 8 -i eight.txt > capped.txt 2> capped.err )
  check "a batch that cannot fit is cut down with one warning ($(cat capped.err))" \
    sh -c "test \$(wc -l < capped.err) -eq 1 && grep -q 'decoding [0-9]* sentences at a time' capped.err && test \$(wc -l < capped.txt) -eq 8"
fi
long=$(printf 'nine %.0s' {1..100})
echo "$long" | "$translate" "${m[@]}" > long.txt 2> long.err
check "an over-long line is truncated with a warning" grep -q "stdin:1: .* tokens, truncated to the model's maximum of 63" long.err
check "and still translated" test "$(wc -l < long.txt)" -eq 1

cli_finish
