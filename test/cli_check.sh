# Sourced by the end-to-end tests (train_cli.sh, translate_cli.sh, data_parallel.sh): counts checks and failures.
# Set NAME before sourcing; finish with `cli_finish`.
fails=0 checks=0
# check DESCRIPTION COMMAND...: the command must succeed
check() {
  local what="$1"; shift
  checks=$((checks + 1))
  if ! "$@"; then echo "FAIL $NAME: $what"; fails=$((fails + 1)); fi
}
# expect_error DESCRIPTION PATTERN COMMAND...: a non-zero exit and exactly one stderr line matching PATTERN
# (stdout goes to out.txt, stderr to err.txt)
expect_error() {
  local what="$1" pattern="$2"; shift 2
  checks=$((checks + 1))
  "$@" > out.txt 2> err.txt
  local rc=$? lines
  lines=$(wc -l < err.txt)
  if [ $rc -eq 0 ] || ! grep -q -- "$pattern" err.txt || [ "$lines" -ne 1 ]; then
    echo "FAIL $NAME: $what (exit $rc, $lines stderr lines, want /$pattern/):"; cat err.txt
    fails=$((fails + 1))
  fi
}
# on_cuda_or_error DESCRIPTION COMMAND...: runs a --device cuda COMMAND (stdout to out.txt, stderr to
# err.txt). Where it succeeds (a CUDA build on a GPU) it returns 0 and the caller checks the output; where
# it fails, that is one check: exactly one stderr line naming --device cpu.
on_cuda_or_error() {
  local what="$1"; shift
  "$@" > out.txt 2> err.txt && return 0
  checks=$((checks + 1))
  if [ "$(wc -l < err.txt)" -ne 1 ] || ! grep -q -- "use --device cpu" err.txt; then
    echo "FAIL $NAME: $what:"; cat err.txt
    fails=$((fails + 1))
  fi
  return 1
}
# tiny_corpus DIR PAIRS [WORDS]: a Multi30k-shaped folder (train, val and test_2016_flickr, .en and .de) of
# WORDS-word sentences (default 3; at most 5), PAIRS training pairs and 2 of each other split: epochs of a
# few tiny batches. The German side is the English words translated, in reverse order.
tiny_corpus() {
  mkdir -p "$1"
  local split n
  for split in train val test_2016_flickr; do
    n=$([ $split = train ] && echo "$2" || echo 2)
    awk -v n="$n" -v k="${3:-3}" 'BEGIN { split("red blue green small big old young", w, " "); split("1 3 5 2 4", f, " ")
      for (i = 0; i < n; i++) { line = ""; for (j = 1; j <= k; j++) line = line (j > 1 ? " " : "") w[(i * f[j]) % 7 + 1]; print line } }' > "$1/$split.en"
    awk -v n="$n" -v k="${3:-3}" 'BEGIN { split("rot blau gruen klein gross alt jung", w, " "); split("1 3 5 2 4", f, " ")
      for (i = 0; i < n; i++) { line = ""; for (j = k; j >= 1; j--) line = line (j < k ? " " : "") w[(i * f[j]) % 7 + 1]; print line } }' > "$1/$split.de"
  done
}
cli_finish() {
  echo "$NAME: $checks checks, $fails failed"
  [ $fails -eq 0 ]
}
