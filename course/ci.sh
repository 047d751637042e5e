#!/usr/bin/env bash
# CI of the course generator and grader (solution tree only; .ci/run calls it). A grader that passes a
# wrong answer is the worst bug this feature can have, so this checks, on real handout trees:
#   1. the generator refuses unpaired or unknown markers, unknown tasks, sheets that disagree, with one line;
#   2. the solution scores 100%, with and without the hidden example, and a tampered hidden snapshot loses
#      points (the hidden checks can fail);
#   3. every task blanked scores 0 and leaves full points to every task not blanked (graded with --reference,
#      the solution: a task whose checks call a blanked one is graded again on its own code alone);
#   4. the handout with every task blanked builds completely (`make all tests`) and scores 0;
#   5. every planted wrong answer of course/mutants.txt loses points on its task, and every task without
#      one keeps full points; a task that hangs or crashes loses its own points only; a planted answer in
#      a task whose checks call other tasks loses points again with those tasks blanked (the isolated
#      grading cannot pass it).
#   In 3 and 5 a tree holds the blanks or planted answers of several tasks, no two of them related (see
#   course 3-5 below): each is graded as it would be alone in the solution, for one build instead of one
#   a task;
#   6. `make submission` packs the edited files and warns about any other changed file;
#   7. Gradescope's run_autograder (course/gradescope/) on the every-task handout with the hidden example:
#      the solution's files submitted score 100% with hidden tests, a submission that does not build 0.
# Trees are built with CXXFLAGS=-Og from one baseline build: a job rebuilds only what its change touches (the
# solution's tree builds in 23 s at -Og where -O1 took 34, and its grading takes 2 s instead of 1).
#   bash course/ci.sh            everything (jobs in parallel, one per core)
#   bash course/ci.sh --job J    one tree: "blank TASK,...", "blank all" or
#                                "mutant TASK=KIND,... [BLANKED,...]" (used internally)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cores=$(getconf _NPROCESSORS_ONLN)  # not nproc: it obeys OMP_NUM_THREADS, set to 1 below for the grader
export CXXFLAGS="-Og -g0" OMP_NUM_THREADS=1
work=${COURSE_CI_WORK:-}

# The verdict on one graded tree: reads its results.json and the grader's task list (for the order).
verdict() {  # dir, job words...
  local dir=$1; shift
  (cd "$dir" && build/grade/course/grade --list) > "$dir/list.txt"
  python3 - "$dir" "$@" <<'EOF'
import json, sys
d, job = sys.argv[1], sys.argv[2:]
order = [l.split("\t")[1] for l in open(d + "/list.txt") if l.startswith("task\t")]
tests = json.load(open(d + "/results.json"))["tests"]
score, full, failed = {}, {}, {}
for t in tests:
    task = t["name"].split(": ", 1)[0]
    score[task] = score.get(task, 0) + t["score"]
    full[task] = full.get(task, 0) + t["max_score"]
    if t["score"] < t["max_score"]:
        failed.setdefault(task, []).append(t["output"])
row = " ".join("%s=%.2f/%g" % (t, score[t], full[t]) for t in order if t in score)
problems = []
if job[0] == "solution" or job[0] == "hidden":
    problems = ["%s %.2f/%g: %s" % (t, score[t], full[t], failed[t][0]) for t in score if score[t] < full[t] - 1e-9]
    if job[0] == "hidden" and not any(t["visibility"] == "hidden" for t in tests):
        problems.append("no hidden test in results.json")
elif job[0] == "tampered":
    bad = job[1]
    if not score[bad] < full[bad] - 1e-9: problems.append("a tampered hidden snapshot of %s still scores full" % bad)
    problems += ["%s lost points" % t for t in score if t != bad and score[t] < full[t] - 1e-9]
elif job[0] == "blank" and job[1] == "all":
    problems = ["%s scores %.2f" % (t, score[t]) for t in score if score[t] > 0]
elif job[0] == "blank":
    blanked = job[1].split(",")
    problems = ["%s scores %.2f with its stub" % (x, score.get(x, -1)) for x in blanked if score.get(x, 1) != 0]
    problems += ["%s lost points: %s" % (t, failed[t][0]) for t in score if t not in blanked and score[t] < full[t] - 1e-9]
elif job[0] == "isolated":
    t = job[1]
    if score[t] != 0: problems.append("%s scores %.2f although it %s" % (t, score[t], "hangs" if job[2] == "hang" else "crashes"))
    problems += ["%s lost points: %s" % (u, failed[u][0]) for u in score if u != t and score[u] < full[u] - 1e-9]
    row = "%s %.2f/%g (%s), every other task full" % (t, score[t], full[t], failed.get(t, ["?"])[0][8:60])
elif job[0] == "mutant":  # one line for each planted answer, then one for any other task that lost points
    planted = [m.split("=") for m in job[1].split(",")]
    blanked = job[2].split(",") if len(job) > 2 else []
    bad = False
    for t, kind in planted:
        problems = []
        if not score[t] < full[t] - 1e-9: problems.append("the planted answer is not caught: %s scores %.2f/%g" % (t, score[t], full[t]))
        if blanked and any("TODO(task=" in o for o in failed.get(t, [])):
            problems.append("%s was not graded in isolation from %s: %s" % (t, job[2], [o for o in failed[t] if "TODO(task=" in o][0]))
        row = "%s %.2f/%g%s" % (t, score[t], full[t], " (%s blanked)" % job[2] if blanked else "")
        print("%-4s %-45s %s" % ("FAIL" if problems else "ok", "mutant %s %s" % (t, kind), row))
        for p in problems: print("     " + p)
        bad = bad or bool(problems)
    others = ["%s lost points: %s" % (t, failed[t][0]) for t in score
              if t not in dict(planted) and t not in blanked and score[t] < full[t] - 1e-9]
    if others:
        print("FAIL %-45s %s" % ("mutant " + job[1], "; ".join(others)))
    sys.exit(1 if bad or others else 0)
print("%-4s %-45s %s" % ("FAIL" if problems else "ok", " ".join(job), row))
for p in problems: print("     " + p)
sys.exit(1 if problems else 0)
EOF
}

# One job in its own tree: generate, reuse the baseline's objects, build, grade, judge.
run_job() {
  local job=$1 dir m
  dir=$work/job-$(echo "$job" | md5sum | cut -c1-12)
  [ "$job" = "blank all" ] && dir=$work/blank-all
  set -- $job
  if [ "$1" = mutant ]; then
    local plant=()
    for m in ${2//,/ }; do plant+=(--mutant "${m%%=*}" "${m#*=}"); done
    python3 course/handout.py "${plant[@]}" --tasks "${3:-none}" --out "$dir" >/dev/null
  else
    python3 course/handout.py --tasks "$2" --keep-markers --out "$dir" >/dev/null
  fi
  cp -a "$work/base/build" "$dir/"  # unchanged sources keep their times (copy2): their objects stay valid
  local target=build/grade/course/grade
  [ "$job" = "blank all" ] && target="all tests $target"  # every program and test compiles with every stub
  if ! make -C "$dir" CPU=1 $target >"$dir/build.log" 2>&1; then
    echo "FAIL $job: does not build"; tail -5 "$dir/build.log"; return 1
  fi
  local limit=300 words=$job
  case "$job" in *"=hang" | *"=crash") limit=10 words="isolated ${2%%=*} ${2#*=}" ;; esac
  (cd "$dir" && python3 course/grade.py --timeout $limit --reference "$work/base" --results results.json >grade.txt 2>&1) || { echo "FAIL $job: the grader did not run"; tail -3 "$dir/grade.txt"; return 1; }
  [ "$job" = "blank all" ] && cp "$dir/grade.txt" "$work/blank-all-table.txt"
  verdict "$dir" $words
}

if [ "${1:-}" = --job ]; then
  run_job "$2"
  exit
fi

start=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export COURSE_CI_WORK=$work
fails=0

echo "== course 1: the generator refuses bad input with one line"
refuse() {  # description, command run in a fresh copy of the sources and sheets
  local d=$work/refuse out rc=0
  rm -rf "$d" && mkdir -p "$d/course"
  cp --parents $(python3 -c 'import sys; sys.path.insert(0, "course"); import markers; print(*markers.SOURCES)') "$d/"
  cp -r course/tasks course/markers.py course/handout.py course/mutants.txt "$d/course/"
  (cd "$d" && eval "$2") >/dev/null 2>&1 || true
  out=$(cd "$d" && python3 course/handout.py --tasks "${3:-all}" --out "$d/out" 2>&1 >/dev/null) || rc=$?
  if [ "$rc" = 1 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ]; then echo "ok   refuses $1: $out"
  else echo "FAIL does not refuse $1 with one line (exit $rc): $out"; fails=$((fails + 1)); fi
}
refuse "a BEGIN without END" "sed -i '0,/^  \/\/ END SOLUTION\$/{//d}' transformer.cu"
refuse "an END without BEGIN" "echo '  // END SOLUTION' >> bleu.h"
refuse "a marker without points" "sed -i 's|task=layernorm_backward points=8|task=layernorm_backward|' transformer.cu"
refuse "a misspelt marker" "sed -i 's|// END SOLUTION|// END SOLUTIONS|' tokenizer.cpp"
refuse "a task without a sheet" "sed -i 's|task=adam_update|task=adam_updates|' transformer.cu"
refuse "points that disagree with the sheet" "sed -i 's|^Points: 8|Points: 9|' course/tasks/layernorm_backward.md"
refuse "two regions of a task with different points" "sed -i '0,/task=sublayer_connection_backward points=6/s//task=sublayer_connection_backward points=5/' transformer.cu"
refuse "an unknown task in TASKS" "true" "layernorm_backward,no_such_task"
refuse "an OUT that is not empty" "mkdir -p out && touch out/x"
out=$(python3 course/handout.py --mutant linear_backward no-such-kind --out "$work/m0" 2>&1 >/dev/null) && rc=0 || rc=$?
if [ "$rc" = 1 ]; then echo "ok   refuses an unknown planted answer: $out"; else echo "FAIL accepts an unknown planted answer"; fails=$((fails + 1)); fi

echo "== course 2: the solution (baseline build, CXXFLAGS=$CXXFLAGS)"
python3 course/handout.py --tasks none --keep-markers --out "$work/base" >/dev/null
make -C "$work/base" -j"$cores" CPU=1 build/grade/course/grade >"$work/base/build.log" 2>&1 || { tail -20 "$work/base/build.log"; exit 1; }
(cd "$work/base" && python3 course/grade.py --results results.json > grade.txt) && cat "$work/base/grade.txt"
verdict "$work/base" solution || fails=$((fails + 1))
cp -r course/hidden-example "$work/hidden"
(cd "$work/base" && python3 course/grade.py --hidden "$work/hidden" --results results.json > grade-hidden.txt)
verdict "$work/base" hidden || fails=$((fails + 1))
# a tampered expected value: the hidden learning-rate snapshot's first rate, doubled
python3 - "$work/hidden/snapshots/learning_rate.txt" <<'EOF'
import sys
p = sys.argv[1]; case, out, words = open(p).read().split("\n")[0].split("\t")
w = words.split(); w[0] = repr(2 * float(w[0]))
open(p, "w").write("\t".join([case, out, " ".join(w)]) + "\n")
EOF
(cd "$work/base" && python3 course/grade.py --hidden "$work/hidden" --results results.json > grade-tampered.txt)
verdict "$work/base" tampered learning_rate || fails=$((fails + 1))
# the verdict on planted answers can fail: judged as if adam_update's were planted in this tampered tree, it
# must say that one is not caught and that learning_rate, which has none, lost points
out=$(verdict "$work/base" mutant adam_update=no-bias-correction) && rc=0 || rc=$?
if [ "$rc" = 1 ] && grep -q "not caught: adam_update" <<<"$out" && grep -q "learning_rate lost points" <<<"$out"; then
  echo "ok   the verdict fails a planted answer not caught and a task without one that lost points"
else echo "FAIL the verdict on planted answers (exit $rc): $out"; fails=$((fails + 1)); fi
(cd "$work/base" && python3 course/grade.py --results results.json > /dev/null)

echo "== course 3-5: blanked tasks, every task blanked, every planted answer ($cores trees at a time)"
# Trees hold several tasks' blanks or planted answers at once, as long as no two of those tasks are related
# (neither's checks call the other, directly or not): then each such task is graded exactly as in a tree of
# its own (a task that calls one of them loses points first and is graded again in isolation, as it would
# be there), and a tree costs one build of transformer.cu instead of one per task. A planted answer that
# hangs or crashes gets a tree of its own (its 10 s limit per task).
python3 - "$work/base/list.txt" course/mutants.txt > "$work/jobs.txt" <<'EOF2'
import sys
calls, order = {}, []
for l in open(sys.argv[1]):
    if l.startswith("task\t"):
        _, t, d = l.rstrip("\n").split("\t")
        order.append(t)
        calls[t] = [x for x in d.split(",") if x]
def reach(t, seen=()):
    return set().union(*[{d} | reach(d, seen + (t,)) for d in calls[t] if d not in seen])
closure = {t: reach(t) for t in order}
related = lambda a, b: a == b or a in closure[b] or b in closure[a]
def rounds(items):  # items: (task, text); greedily into groups of unrelated tasks, the most related first
    out = []
    for t, x in sorted(items, key=lambda i: -sum(related(i[0], u) for u in order)):
        for r in out:
            if not any(related(t, u) for u, _ in r):
                r.append((t, x))
                break
        else:
            out.append([(t, x)])
    return out
planted = [l[3:].split() for l in open(sys.argv[2]) if l.startswith("== ")]
alone = [(t, k) for t, k in planted if k in ("hang", "crash")]
blanks = rounds([(t, t) for t in order])
plain = rounds([(t, "%s=%s" % (t, k)) for t, k in planted if (t, k) not in alone])
isolated = rounds([(t, "%s=%s" % (t, k)) for t, k in planted if (t, k) not in alone and calls[t]])
# every task blanked once, every planted answer planted once, and once more where its task calls others
assert sorted(x for r in blanks for _, x in r) == sorted(order), "a task is not blanked exactly once"
assert sorted([x.split("=") for r in plain for _, x in r] + [list(a) for a in alone]) == sorted(planted), "a planted answer is lost"
assert sorted(x for r in isolated for _, x in r) == sorted("%s=%s" % (t, k) for t, k in planted if (t, k) not in alone and calls[t])
for r in blanks + plain + isolated:
    assert all(not related(t, u) for i, (t, _) in enumerate(r) for u, _ in r[i + 1:]), "two related tasks in one tree"
for r in blanks:
    print("blank " + ",".join(x for _, x in r))
print("blank all")
for r in plain:
    print("mutant " + ",".join(x for _, x in r))
for r in isolated:
    print("mutant %s %s" % (",".join(x for _, x in r), ",".join(sorted({d for t, _ in r for d in calls[t]}))))
for t, k in alone:
    print("mutant %s=%s" % (t, k))
EOF2
# the verdicts expected: one line for each blank tree, and one for each planted answer
expected=$(awk '$1 == "blank" {n++} $1 == "mutant" {n += split($2, a, ",")} END {print n}' "$work/jobs.txt")
if ! xargs -P "$cores" -I{} bash course/ci.sh --job "{}" < "$work/jobs.txt" > "$work/jobs.log" 2>&1; then fails=$((fails + 1)); fi
sort -k2 "$work/jobs.log" | grep -v '^ok' || true
echo "$(grep -c '^ok' "$work/jobs.log") of $expected verdicts ok, $(wc -l < "$work/jobs.txt") trees"
[ "$(grep -c '^ok' "$work/jobs.log")" = "$expected" ] && ! grep -q '^FAIL' "$work/jobs.log" || fails=$((fails + 1))
echo "-- planted wrong answers: the task's score"
grep -E ' (mutant|isolated) ' "$work/jobs.log" | sort -k2 || true
echo "-- the handout with every task blanked"
cat "$work/blank-all-table.txt" 2>/dev/null | sed -n '1,/^total/p'

echo "== course 6: make submission"
d=$work/blank-all
if (cd "$d" && make -s submission >sub.txt 2>&1) && tar tzf "$d/submission.tar.gz" | sort | diff - <(sort "$d/course/EDITABLE") >/dev/null \
   && ! grep -q warning "$d/sub.txt"; then echo "ok   submission.tar.gz holds exactly course/EDITABLE's files, no warning"
else echo "FAIL make submission"; cat "$d/sub.txt"; fails=$((fails + 1)); fi
echo "# changed" >> "$d/README.md"
out=$(cd "$d" && make -s submission 2>&1)
if grep -q "warning: README.md was changed" <<<"$out"; then echo "ok   make submission warns about a changed README.md"
else echo "FAIL make submission does not warn about a changed README.md"; fails=$((fails + 1)); fi

echo "== course 7: Gradescope's run_autograder"
ag=$work/ag
mkdir -p "$ag/submission"
cp -a "$d" "$ag/source"
cp -a "$work/base" "$ag/source/reference"  # the solution: isolated grading (grade.py --reference)
cp -r course/hidden-example "$ag/source/hidden"
tar czf "$ag/submission/submission.tar.gz" $(cat "$d/course/EDITABLE")  # the solution's files, as make submission packs them
AUTOGRADER=$ag bash "$ag/source/course/gradescope/run_autograder" > "$ag/run.txt" 2>&1 || true
python3 - "$ag/results/results.json" full <<'EOF2' || fails=$((fails + 1))
import json, sys
r = json.load(open(sys.argv[1])); total = sum(t["max_score"] for t in r["tests"])
hidden = sum(t["visibility"] == "hidden" for t in r["tests"])
ok = abs(r["score"] - total) < 1e-6 and hidden > 0
print("%s  the solution submitted: %.2f / %.2f, %d hidden tests" % ("ok  " if ok else "FAIL", r["score"], total, hidden))
sys.exit(0 if ok else 1)
EOF2
rm "$ag/submission/submission.tar.gz"
printf 'int broken(' > "$ag/submission/bleu.h"
AUTOGRADER=$ag bash "$ag/source/course/gradescope/run_autograder" > "$ag/run-broken.txt" 2>&1 || true
python3 - "$ag/results/results.json" <<'EOF2' || fails=$((fails + 1))
import json, sys
r = json.load(open(sys.argv[1]))
ok = r["score"] == 0 and "does not build" in r["output"]
print("%s  a submission that does not build: %.2f points, the build log in the output" % ("ok  " if ok else "FAIL", r["score"]))
sys.exit(0 if ok else 1)
EOF2

echo "course CI: $((fails)) failures, $(( $(date +%s) - start )) s"
[ "$fails" = 0 ]
