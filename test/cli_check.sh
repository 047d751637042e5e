# Sourced by the end-to-end tests (train_cli.sh, translate_cli.sh): counts checks and failures.
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
cli_finish() {
  echo "$NAME: $checks checks, $fails failed"
  [ $fails -eq 0 ]
}
