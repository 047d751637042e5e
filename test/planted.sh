#!/usr/bin/env bash
# planted: one error planted in each area of the CPU model, each in a copy of the tree, and the quick suite
# (`make test`) must fail on every one. Shows that the few minutes of `make test` still catch a wrong line;
# the GPU path's planted bugs are make mutants' (parity_gpu, which the quick suite runs as parity_gpu_quick).
# Run by `make planted` (CI runs it): prints each plant with the tests that failed on it, and exits
# non-zero if one passes, cannot be planted (its original text must occur exactly once in its file) or does
# not build. The copy keeps the tree's objects and their times (after `make tests`), so a plant rebuilds only
# what depends on its file.
# Usage: planted.sh [JOBS]
set -u
cd "$(dirname "$0")/.."
jobs="${1:-$(getconf _NPROCESSORS_ONLN)}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# name @ file @ original text @ planted text   (python string literals; \n is a newline)
plants=(
  "a wrong sign in a backward (the residual's dy)@transformer.cu@    dy[i] += dout[i] * (kept ? scale : T(0));@    dy[i] -= dout[i] * (kept ? scale : T(0));"
  "attention's scores without their 1 / sqrt(Dk) [Eq. 1]@transformer.cu@          pr[j] = s * scale;@          pr[j] = s;"
  "an off-by-one in the causal mask (position i sees i + 1)@transformer.cu@(!causal || j <= i); };@(!causal || j <= i + 1); };"
  "BPE's merges applied highest rank first@tokenizer.cpp@r->second.first < best_rank)) {@r->second.first > best_rank)) {"
  "beam search without the length penalty on finished hypotheses [§6]@decoding.cuh@h.score = h.logprob / length_penalty((int)h.tokens.size() + 1, opt.alpha);@h.score = h.logprob;"
)

# plant DIR FILE ORIGINAL PLANTED: the text replaced in DIR/FILE, where it must occur exactly once
plant() {
  python3 - "$@" <<'PY'
import sys
d, f, orig, new = sys.argv[1], sys.argv[2], *(a.encode().decode("unicode_escape") for a in sys.argv[3:5])
path = d + "/" + f
src = open(path).read()
if src.count(orig) != 1:
    print(f"the original text occurs {src.count(orig)} times in {f}, not once: {orig!r}")
    sys.exit(1)
open(path, "w").write(src.replace(orig, new))
PY
}

make -s -j"$jobs" CPU=1 tests > "$work/base.log" 2>&1 || { tail -20 "$work/base.log"; echo "planted: the tree does not build"; exit 2; }
# the quick suite in two parts: the unit tests (seconds), every failure listed; then, if they all pass, the
# programs end to end, stopping at the first failure
long='_cli|crash_safety|parity_gpu|course'
status=0
i=0
for p in "${plants[@]}"; do
  i=$((i + 1))
  IFS='@' read -r name file orig new <<< "$p"
  dir="$work/tree$i"
  mkdir -p "$dir"
  # the sources git tracks, and the quick suite's objects (build/emu is make check's), with their times
  git ls-files -z | xargs -0 cp -a --parents -t "$dir"
  tar -cf - --exclude=build/emu build | tar -xf - -C "$dir"
  if ! why="$(plant "$dir" "$file" "$orig" "$new")"; then
    result="NOT PLANTED: $why"
    status=1
  elif ! make -s -C "$dir" -j"$jobs" CPU=1 tests > "$dir/build.log" 2>&1; then
    result="NOT BUILT: $(tail -3 "$dir/build.log" | tr '\n' ' ')"
    status=1
  elif (cd "$dir" && OMP_WAIT_POLICY=passive ctest --test-dir test -L quick -E "$long" -j"$jobs" > "$dir/test.log" 2>&1 &&
        OMP_WAIT_POLICY=passive ctest --test-dir test -L quick -R "$long" -j"$jobs" --stop-on-failure >> "$dir/test.log" 2>&1); then
    result="SURVIVED: make test passes"
    status=1
  else
    result="caught by $(grep -oE 'Test +#[0-9]+: [A-Za-z0-9_]+ \.+\*+(Failed|Exception|Timeout)' "$dir/test.log" |
                        sed -E 's/Test +#[0-9]+: ([A-Za-z0-9_]+).*/\1/' | paste -sd, | sed 's/,/, /g')"
  fi
  printf '%-72s %s\n' "$name" "$result"
  rm -rf "$dir"
done
echo "planted: ${#plants[@]} errors, $([ $status -eq 0 ] && echo "all caught by make test" || echo "NOT all caught"), $SECONDS s"
exit $status
