#!/usr/bin/env bash
# `make data`: Multi30k (train, val, test_2016_flickr; en, de, fr) as plain text in data/multi30k, from
# $MULTI30K_DIR (the .gz files, or plain text) when set, otherwise from the dataset's public repository.
# Every file is checked against its SHA-256 in data/multi30k.sha256: a mismatch, or a download or .gz that
# stops short, is an error naming the file. Files are assembled in a folder beside the output and renamed
# into it only once verified, so nothing half-written is ever left in data/multi30k.
set -euo pipefail
out="${1:-data/multi30k}"
sums="$(dirname "$0")/multi30k.sha256"
url="${MULTI30K_URL:-https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw}"
fail() { echo "make data: $*" >&2; exit 1; }
[ -f "$sums" ] || fail "$sums is missing"
mkdir -p "$out"
rm -rf "$out".partial.*  # what an earlier run killed on its way left behind
work="$(mktemp -d "$out.partial.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# recorded_sum NAME: the SHA-256 recorded for NAME
recorded_sum() { awk -v n="$1" '$2 == n { print $1 }' "$sums"; }
sum_of() { sha256sum < "$1" | cut -d' ' -f1; }
for split in train val test_2016_flickr; do
  for lang in en de fr; do
    name="$split.$lang"
    want="$(recorded_sum "$name")"
    [ -n "$want" ] || fail "$sums has no SHA-256 for $name"
    if [ -e "$out/$name" ]; then  # already there: verified again, never trusted
      got="$(sum_of "$out/$name")"
      [ "$got" = "$want" ] || fail "$out/$name: SHA-256 $got, expected $want (remove it and run make data again)"
      continue
    fi
    tmp="$work/$name"
    if [ -n "${MULTI30K_DIR:-}" ]; then
      if [ -f "$MULTI30K_DIR/$name.gz" ]; then
        gzip -dc "$MULTI30K_DIR/$name.gz" > "$tmp" 2>/dev/null || fail "$MULTI30K_DIR/$name.gz: not a complete gzip file"
      elif [ -f "$MULTI30K_DIR/$name" ]; then cp "$MULTI30K_DIR/$name" "$tmp"
      else fail "$MULTI30K_DIR has neither $name.gz nor $name"; fi
    else
      curl -fsL --retry 2 -o "$tmp.gz" "$url/$name.gz" 2>/dev/null ||
        fail "cannot download $url/$name.gz; set MULTI30K_DIR to a folder holding the .gz files"
      gzip -dc "$tmp.gz" > "$tmp" 2>/dev/null || fail "$url/$name.gz: the download is not a complete gzip file"
      rm -f "$tmp.gz"
    fi
    got="$(sum_of "$tmp")"
    [ "$got" = "$want" ] || fail "$name: SHA-256 $got, expected $want (a corrupt or partial file; nothing written)"
  done
done
# every file is verified: move them in (a rename within one file system each)
for f in "$work"/*; do [ -e "$f" ] && mv "$f" "$out/"; done
echo "make data: Multi30k in $out ($(wc -l < "$out/train.en") training pairs), SHA-256 verified"
