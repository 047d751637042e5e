#!/usr/bin/env bash
# notes_refs: every function NOTES.md cites, written `name()` or `ns::name()`, is defined or declared in
# the project's sources (outside test/, but for the emulated GPU, test/cuda_emulator.h). Fails when a name is missing, or when NOTES.md cites none.
set -u
root="${1:-$(dirname "$0")/..}"
notes="$root/NOTES.md"
[ -f "$notes" ] || { echo "notes_refs: $notes not found"; exit 1; }
mapfile -t names < <(grep -o '`[A-Za-z_][A-Za-z0-9_:]*()`' "$notes" | tr -d '`()' | sed 's/.*:://' | sort -u)
[ "${#names[@]}" -gt 0 ] || { echo "notes_refs: NOTES.md cites no function"; exit 1; }
sources="$(find "$root" -maxdepth 2 \( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.h' \) -not -path "$root/test/*" -not -path "$root/build/*") $root/test/cuda_emulator.h"
missing=0
for n in "${names[@]}"; do
  # a definition or declaration: the name followed by '(' somewhere other than a comment line
  if ! grep -hE "(^|[^A-Za-z0-9_])$n\(" $sources | grep -qvE '^\s*//'; then
    echo "FAIL notes_refs: NOTES.md cites $n(), which no source file defines"
    missing=$((missing + 1))
  fi
done
echo "notes_refs: ${#names[@]} function names cited, $missing missing"
[ "$missing" -eq 0 ]
