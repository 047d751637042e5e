#!/usr/bin/env bash
# `make data`: Multi30k (train, val, test_2016_flickr; en, de, fr) as plain text in data/multi30k, from
# $MULTI30K_DIR (the .gz files, or plain text) when set, otherwise from the dataset's public repository.
set -euo pipefail
out="${1:-data/multi30k}"
url="${MULTI30K_URL:-https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw}"
mkdir -p "$out"
for split in train val test_2016_flickr; do
  for lang in en de fr; do
    name="$split.$lang"
    [ -s "$out/$name" ] && continue
    tmp="$out/.$name.tmp"
    if [ -n "${MULTI30K_DIR:-}" ]; then
      if [ -f "$MULTI30K_DIR/$name.gz" ]; then gzip -dc "$MULTI30K_DIR/$name.gz" > "$tmp"
      elif [ -f "$MULTI30K_DIR/$name" ]; then cp "$MULTI30K_DIR/$name" "$tmp"
      else echo "make data: $MULTI30K_DIR has neither $name.gz nor $name" >&2; exit 1; fi
    elif ! curl -fsL --retry 2 -o "$tmp.gz" "$url/$name.gz" 2>/dev/null || ! gzip -dc "$tmp.gz" > "$tmp" 2>/dev/null; then
      rm -f "$tmp" "$tmp.gz"
      echo "make data: cannot download $url/$name.gz; set MULTI30K_DIR to a folder holding the .gz files" >&2
      exit 1
    fi
    rm -f "$tmp.gz"
    mv "$tmp" "$out/$name"
  done
done
echo "make data: Multi30k in $out ($(wc -l < "$out/train.en") training pairs)"
