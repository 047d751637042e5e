#!/usr/bin/env bash
# Runs one libFuzzer target (`make fuzz`): BUILD TARGET SECONDS [RUNS], stopping after SECONDS seconds or
# RUNS inputs, whichever comes first. Seeds come from test/fuzz/corpus/NAME (read only; inputs that once
# failed are kept there, so every run replays them); what the fuzzer finds goes to BUILD/corpus/NAME.
# Limits: 10 s an input (a hang), 2 GB of memory in all and 256 MB in one allocation; leaks are
# reported; inputs of up to 4 KB (checkpoints 20 KB). Prints one line with the inputs run.
set -u
build="$1" target="$2" seconds="$3" runs="${4:--1}"
name="${target#fuzz_}"
mkdir -p "$build/corpus/$name"
max_len=4096  # bytes an input may have; the checkpoint seeds are larger (a whole model with Adam's state)
[ "$name" = checkpoint ] && max_len=20000
log="$build/$target.log"
"$build/$target" -max_total_time="$seconds" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 -detect_leaks=1 \
  -print_final_stats=1 -artifact_prefix="$build/crash-$name-" -max_len=$max_len \
  "$build/corpus/$name" "test/fuzz/corpus/$name" > "$log" 2>&1
rc=$?
ran=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
done_in=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
echo "fuzz $target: ${ran:-?} inputs in ${done_in:-$seconds} s, exit $rc (log $log)"
if [ $rc -ne 0 ]; then grep -m 20 -E "ERROR|SUMMARY|fuzz property|Test unit written|runtime error" "$log"; fi
exit $rc
