#!/usr/bin/env python3
"""The grade of a tree (`make grade [HIDDEN=dir]`) and a student's submission (`make submission`).

grade: runs build/grade/course/grade once per task (its own process, with a time limit), so that a stub that
throws, aborts, crashes or hangs costs that task's points only. The tasks are those with solution regions in
the sources (course/markers.py); each task's points are shared equally by its checks, visible and hidden.
Prints the table (task | checks passed | worst error | tolerance | points) and writes results.json in
Gradescope's format. Exits 0 whatever the score; 2 when the grader itself cannot run.

With --reference DIR (a solution tree: the instructor's, on Gradescope), a task whose checks call another
task that loses points here is graded again in isolation: in a copy of the reference with only that task's
regions taken from this tree (build/isolated/), so that each task is graded on its own code alone.

submission: submission.tar.gz of the files that hold the assigned tasks (course/EDITABLE), with a warning for
every other file that differs from the handout (course/MANIFEST, sha256 sums). Standard library only."""
import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import markers  # noqa: E402

GRADER = os.path.join("build", "grade", "course", "grade")


def fail(msg):
    print("grade: " + msg, file=sys.stderr)
    sys.exit(2)


def run_grader(args, timeout, cwd="."):
    # gradient checks are small: threads only add overhead. The emulated GPU reshuffles its threads at every
    # barrier (cuda_emulator.h), so a kernel that races fails here rather than passing by luck.
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", CUDA_EMULATOR_ORDER="shuffle",
               CUDA_EMULATOR_SEED="7")
    return subprocess.run([os.path.abspath(os.path.join(cwd, GRADER))] + args, capture_output=True, text=True, timeout=timeout, env=env,
                          errors="replace", cwd=cwd)


def list_checks(hidden):
    r = run_grader(["--list"] + (["--hidden", hidden] if hidden else []), 60)
    if r.returncode != 0:
        fail("the grader cannot list its checks: " + (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1])
    tasks, checks = {}, {}
    for line in r.stdout.splitlines():
        f = line.split("\t")
        if f[0] == "task":
            tasks[f[1]] = [d for d in f[2].split(",") if d]
            checks[f[1]] = []
        elif f[0] == "check":
            checks[f[1]].append({"name": f[3], "hidden": f[4] == "1"})
    return tasks, checks


def run_task(task, checks, hidden, timeout, cwd="."):
    """Runs one task's checks; returns (results by index, a note when the process did not finish cleanly)."""
    results, note = {}, ""
    try:
        r = run_grader(["--task", task] + (["--hidden", hidden] if hidden else []), timeout, cwd)
        out, err, code = r.stdout, r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, code = "", None
        note = "timed out after %d s" % timeout
    for line in out.splitlines():
        f = line.split("\t")
        if f[0] == "result" and len(f) >= 6:
            results[int(f[1])] = {"passed": f[2] == "1", "worst": float(f[3]), "tol": float(f[4]), "message": f[5]}
    if code is not None and code != 0:
        last = (err.strip().splitlines() or [""])[-1]
        if code < 0:
            note = "crashed (%s)%s" % (signal.Signals(-code).name, ": " + last if last else "")
        else:
            note = "exit status %d%s" % (code, ": " + last if last else "")
    for n in range(len(checks)):
        if n not in results:
            results[n] = {"passed": False, "worst": float("inf"), "tol": 0.0, "message": note or "no result"}
    return results, note


def copy_tree(src, dst):
    """A copy of the tree at src (sources and build/grade/, with their modification times, so that the copy's
    build reuses every object its changes do not touch), without runs and other build outputs."""
    for d, dirs, names in os.walk(src):
        rel = os.path.relpath(d, src)
        dirs[:] = [x for x in dirs if x not in (".git", "runs") and not (rel == "." and x == "build")]
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for n in names:
            shutil.copy2(os.path.join(d, n), os.path.join(dst, rel, n))
    if os.path.isdir(os.path.join(src, "build", "grade")):
        shutil.copytree(os.path.join(src, "build", "grade"), os.path.join(dst, "build", "grade"), symlinks=True)  # its stamp too


def transplant(tree, tasks):
    """Replaces, in the reference copy at `tree`, the bodies of the regions of `tasks` by this tree's.
    Returns None, or why it cannot (this tree's regions of a task do not pair with the reference's)."""
    mine, theirs = markers.read_regions("."), markers.read_regions(tree)
    for rel in sorted({r.path for r in theirs if r.task in tasks}):
        lines = open(os.path.join(tree, rel), encoding="utf-8").read().split("\n")
        src = open(rel, encoding="utf-8").read().split("\n")
        new, last = [], 0
        for r in [r for r in theirs if r.path == rel]:
            new += lines[last:r.begin + 1]
            if r.task in tasks:
                k = [x for x in theirs if x.task == r.task].index(r)
                own = [x for x in mine if x.task == r.task]
                if len(own) != len([x for x in theirs if x.task == r.task]) or own[k].path != rel:
                    return "its regions of %s do not pair with the reference's" % r.task
                new += src[own[k].begin + 1:own[k].end]
            else:
                new += lines[r.begin + 1:r.end]
            last = r.end
        new += lines[last:]
        with open(os.path.join(tree, rel), "w", encoding="utf-8") as f:
            f.write("\n".join(new))
    return None


def isolate(args, known, checks, order, graded):
    """Grades again, each in a copy of the reference with only its own regions from this tree, the tasks that
    lost points while some task their checks call lost points too: their grade is then their own code's."""
    def lost(t):
        return any(not r["passed"] for r in graded[t][0].values())
    def calls(t, seen=()):
        out = set()
        for d in known.get(t, []):
            if d not in seen:
                out |= {d} | calls(d, seen + (t,))
        return out
    needing = [t for t in order if lost(t) and any(d in graded and lost(d) for d in calls(t))]
    # tasks that call none of each other share a copy: rounds by the longest chain of calls among them
    depth = {}
    for t in sorted(needing, key=lambda t: len(calls(t))):
        depth[t] = 1 + max([depth[d] for d in calls(t) if d in depth], default=-1)
    ref = os.path.abspath(args.reference)
    for level in sorted(set(depth.values())):
        group = [t for t in needing if depth[t] == level]
        tree = os.path.join("build", "isolated", str(level))
        shutil.rmtree(tree, ignore_errors=True)
        copy_tree(ref, tree)
        why = transplant(tree, set(group))
        log = os.path.join(tree, "build.log")
        if not why:
            with open(log, "w") as f:
                built = subprocess.run(["make", "-C", tree, "CPU=1", GRADER], stdout=f, stderr=subprocess.STDOUT)
            if built.returncode != 0:
                why = "it does not build in the reference (%s)" % log
        for t in group:
            deps = ", ".join(d for d in sorted(calls(t)) if d in graded and lost(d))
            if why:
                graded[t] = (graded[t][0], "not graded in isolation: " + why)
                continue
            results, note = run_task(t, checks[t], args.hidden, args.timeout, cwd=tree)
            graded[t] = (results, "graded with the reference's %s%s" % (deps, "; " + note if note else ""))


def grade(args):
    if not os.path.exists(GRADER):
        fail(GRADER + " is missing (make grade builds it)")
    try:
        points = markers.task_points(markers.read_regions("."))
    except markers.MarkerError as e:
        fail(str(e))
    if not points:
        fail("no solution regions in " + ", ".join(markers.SOURCES))
    known, checks = list_checks(args.hidden)
    unknown = [t for t in points if t not in known]
    if unknown:
        fail("the sources mark tasks the grader does not know: " + ", ".join(unknown))
    order = [t for t in known if t in points]
    graded = {t: run_task(t, checks[t], args.hidden, args.timeout) for t in order}
    if args.reference:
        isolate(args, known, checks, order, graded)
    rows, tests = [], []
    total = earned_total = 0.0
    for task in order:
        cs = checks[task]
        results, note = graded[task]
        each = points[task] / len(cs) if cs else 0.0
        passed = sum(1 for n in range(len(cs)) if results[n]["passed"])
        earned = each * passed
        worst = max((results[n] for n in range(len(cs))),
                    key=lambda r: r["worst"] / r["tol"] if r["tol"] > 0 else float("inf"), default=None)
        rows.append((task, passed, len(cs), worst, earned, points[task], note))
        total += points[task]
        earned_total += earned
        for n, c in enumerate(cs):
            r = results[n]
            tests.append({
                "name": "%s: %s" % (task, c["name"]),
                "score": each if r["passed"] else 0.0,
                "max_score": each,
                "visibility": "hidden" if c["hidden"] else "visible",
                "output": "passed" if r["passed"] else "failed: " + r["message"],
            })
    # the table
    print("%-30s %8s %12s %10s %12s" % ("task", "checks", "worst error", "tolerance", "points"))
    for task, passed, n, worst, earned, pts, note in rows:
        we = "-" if worst is None or (worst["tol"] == 0 and worst["worst"] == 0) else ("%.3g" % worst["worst"])
        tol = "-" if worst is None or worst["tol"] == 0 else ("%.3g" % worst["tol"])
        print("%-30s %8s %12s %10s %12s%s" % (task, "%d/%d" % (passed, n), we, tol, "%.2f / %g" % (earned, pts),
                                              "   " + note if note else ""))
    print("%-30s %8s %12s %10s %12s" % ("total", "", "", "", "%.2f / %g" % (earned_total, total)))
    failed = [t for t in tests if not t["output"].startswith("passed")]
    for t in failed[:args.show]:
        print("  FAILED %s%s: %s" % ("(hidden) " if t["visibility"] == "hidden" else "", t["name"], t["output"][8:]))
    if len(failed) > args.show:
        print("  ... %d more failed checks in %s" % (len(failed) - args.show, args.results))
    with open(args.results, "w") as f:
        json.dump({"score": earned_total, "output": "%.2f / %g points" % (earned_total, total),
                   "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}, f, indent=1)
    print("wrote " + args.results)
    if args.expect_full and earned_total < total - 1e-9:
        print("grade: %.2f of %g points, and --expect-full was given" % (earned_total, total), file=sys.stderr)
        sys.exit(1)


def build_failed(args):
    """results.json for a submission that does not build: no points, the compiler's last lines as output."""
    try:
        points = markers.task_points(markers.read_regions("."))
    except markers.MarkerError as e:
        fail(str(e))
    log = open(args.build_failed, errors="replace").read().splitlines()
    out = "the submission does not build (make CPU=1 build/grade/course/grade):\n" + "\n".join(log[-40:])
    total = sum(points.values())
    with open(args.results, "w") as f:
        json.dump({"score": 0.0, "output": out, "visibility": "visible", "stdout_visibility": "hidden",
                   "tests": [{"name": "%s: builds" % t, "score": 0.0, "max_score": float(p), "visibility": "visible",
                              "output": "does not build"} for t, p in points.items()]}, f, indent=1)
    print(out)
    print("0 / %g points; wrote %s" % (total, args.results))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def submission(args):
    if not (os.path.exists("course/EDITABLE") and os.path.exists("course/MANIFEST")):
        fail("make submission runs in a handout (course/EDITABLE and course/MANIFEST are written by make handout)")
    editable = [l.strip() for l in open("course/EDITABLE") if l.strip()]
    changed = []
    for line in open("course/MANIFEST"):
        digest, path = line.rstrip("\n").split("  ", 1)
        if not os.path.exists(path):
            changed.append(path + " (missing)")
        elif sha256(path) != digest:
            changed.append(path)
    for path in changed:
        print("warning: %s was changed, but only %s are submitted: the grader uses the handout's copy"
              % (path, ", ".join(editable)), file=sys.stderr)
    with tarfile.open(args.out, "w:gz") as tar:
        for path in editable:
            tar.add(path)
    print("wrote %s (%s)%s" % (args.out, ", ".join(editable),
                               "; %d other files differ from the handout" % len(changed) if changed else ""))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", help="a folder of hidden cases (cases.txt) and their snapshots (snapshots/)")
    p.add_argument("--results", default="results.json", help="where to write Gradescope's results.json")
    p.add_argument("--reference", metavar="DIR",
                   help="a solution tree: grade each task that calls a failing task on its own code alone")
    p.add_argument("--timeout", type=int, default=300, help="seconds one task's checks may take")
    p.add_argument("--show", type=int, default=20, help="how many failed checks to print")
    p.add_argument("--expect-full", action="store_true", help="exit 1 unless every check passes (the solution's test)")
    p.add_argument("--submission", action="store_true", help="write submission.tar.gz instead of grading")
    p.add_argument("--build-failed", metavar="LOG", help="write a results.json of 0 points with the build log (Gradescope)")
    p.add_argument("--out", default="submission.tar.gz")
    args = p.parse_args()
    if args.hidden and not os.path.isdir(args.hidden):
        fail("HIDDEN=%s is not a folder" % args.hidden)
    if args.hidden:
        args.hidden = os.path.abspath(args.hidden)
    if args.reference and not os.path.isfile(os.path.join(args.reference, "course", "checks.h")):
        fail("REFERENCE=%s is not a solution tree (no course/checks.h)" % args.reference)
    if args.submission:
        submission(args)
    elif args.build_failed:
        build_failed(args)
    else:
        grade(args)


if __name__ == "__main__":
    main()
