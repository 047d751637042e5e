#!/usr/bin/env bash
# data_sha256: `make data` (data/get_multi30k.sh) refuses what does not match data/multi30k.sha256, with one
# line naming the file, and leaves nothing half-written in the output folder:
#   a .gz that stops short, a complete gzip file with other text, a missing file; then, where Multi30k
#   is at hand ($MULTI30K_DIR), the real files pass and a file edited afterwards is caught on the next run.
# Usage: data_sha256.sh ROOT
set -u
root="$(cd "$1" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
NAME=data_sha256
source "$root/test/cli_check.sh"
get() { MULTI30K_DIR="$1" bash "$root/data/get_multi30k.sh" out/multi30k; }
nothing_left() { test -z "$(ls -A out/multi30k 2>/dev/null)" -a -z "$(ls -d out/multi30k.partial.* 2>/dev/null)"; }

mkdir -p short other missing
head -c 10000 "$root/test/golden/bleu/test_2016_flickr.de.gz" > short/train.en.gz   # a download cut short
expect_error "a truncated .gz names the file" "short/train.en.gz: not a complete gzip file" get short
check "nothing written after a truncated file" nothing_left
cp "$root/test/golden/bleu/test_2016_flickr.de.gz" other/train.en.gz   # complete, but not train.en
expect_error "a wrong file names it and its SHA-256" "train.en: SHA-256 4be6b5b3.*, expected 460a15fb" get other
check "nothing written after a mismatch" nothing_left
expect_error "a missing file" "missing has neither train.en.gz nor train.en" get missing
if [ -n "${MULTI30K_DIR:-}" ] && [ -f "$MULTI30K_DIR/train.en.gz" ]; then
  get "$MULTI30K_DIR" > ok.log 2>&1
  check "the real Multi30k passes" grep -q "29000 training pairs), SHA-256 verified" ok.log
  check "nine files" test "$(ls out/multi30k | wc -l)" -eq 9
  echo "one more line" >> out/multi30k/val.de
  expect_error "a file edited after make data is caught" "out/multi30k/val.de: SHA-256 .*remove it" get "$MULTI30K_DIR"
else
  echo "data_sha256: \$MULTI30K_DIR not set: the real files are not checked here (the refusals above are)"
fi
cli_finish
