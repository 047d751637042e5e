#!/usr/bin/env python3
"""Makes a course handout (`make handout TASKS=a,b,c OUT=dir`, or TASKS=all): a copy of this tree in which
the solution region of each chosen task is replaced by a stub that compiles and throws naming the task,
everything else intact. Solution-only material (this generator, the snapshot writer, the CI checks and
their planted wrong answers, the hidden-test example) is left out. The handout gets ASSIGNMENT.md (the
chosen tasks' sheets, course/tasks/ID.md), course/EDITABLE (the files a student edits) and course/MANIFEST
(sha256 of every other file, for `make submission`).

Refuses, with one line and exit status 1: an unknown task, an unpaired or malformed marker, a task without a
sheet or a sheet without a task, a sheet whose points differ from its markers, an OUT that is not empty.
--check validates markers and sheets only. Standard library only."""
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import markers  # noqa: E402

# Left out of every handout: what only an instructor (or this project's CI) needs.
SOLUTION_ONLY = ["course/handout.py", "course/snapshots.cpp", "course/ci.sh", "course/mutants.txt",
                 "course/hidden-example/", ".ci/"]
GENERATED = ["ASSIGNMENT.md", "course/EDITABLE", "course/MANIFEST"]
DEVICE_CODE = re.compile(r"\b(HOST_DEVICE|__device__|__global__)\b")


class Refusal(Exception):
    pass


def sheets(root):
    """{task: (sheet text, points)} from course/tasks/ID.md; each sheet has a 'Points: N' line."""
    out = {}
    folder = os.path.join(root, "course", "tasks")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".md"):
            continue
        text = open(os.path.join(folder, name), encoding="utf-8").read()
        m = re.search(r"^Points: ([0-9]+)$", text, re.M)
        if not m:
            raise Refusal("course/tasks/%s: no 'Points: N' line" % name)
        out[name[:-3]] = (text, int(m.group(1)))
    return out


def validate(root):
    regions = markers.read_regions(root)
    points = markers.task_points(regions)
    sh = sheets(root)
    for task, pts in points.items():
        if task not in sh:
            raise Refusal("task %s is marked in the sources but has no sheet course/tasks/%s.md (unknown task)" % (task, task))
        if sh[task][1] != pts:
            raise Refusal("course/tasks/%s.md says Points: %d, its markers say points=%d" % (task, sh[task][1], pts))
    for task in sh:
        if task not in points:
            raise Refusal("course/tasks/%s.md has no solution region in %s" % (task, ", ".join(markers.SOURCES)))
    return regions, points, sh


def tree_files(root):
    """The files of the tree: git's tracked files when it is a checkout, else everything but build outputs."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in (".git", "build", "runs")]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(f for f in files if os.path.isfile(os.path.join(root, f))
                  and not any(f == s or (s.endswith("/") and f.startswith(s)) for s in SOLUTION_ONLY)
                  and f not in GENERATED)


def stub(region, lines):
    """The lines that replace a region's body: a throw that names the task (a trap in GPU device code)."""
    ind = region.indent
    msg = 'TODO(task=%s): implement this (ASSIGNMENT.md, task %s)' % (region.task, region.task)
    # the signature: the lines above the region back to the previous declaration's end
    n, head = region.begin - 1, []
    while n >= 0 and lines[n].strip() and not lines[n].rstrip().endswith((";", "}")) and not lines[n].lstrip().startswith("//"):
        head.append(lines[n])
        n -= 1
    throw = ind + 'throw std::logic_error("%s");' % msg
    if any(DEVICE_CODE.search(h) for h in head):
        return ["#ifdef __CUDA_ARCH__", ind + 'printf("%s\\n");' % msg, ind + "__trap();", "#else", throw, "#endif"]
    return [throw]


def read_mutants(root):
    """{(task, kind): [(old, [new lines])]} from course/mutants.txt (see its header)."""
    out, key = {}, None
    for n, line in enumerate(open(os.path.join(root, "course", "mutants.txt"), encoding="utf-8"), 1):
        line = line.rstrip("\n")
        if line.startswith("== "):
            key = tuple(line[3:].split())
            out[key] = []
        elif line.startswith("- "):
            out[key].append((line[2:].strip(), []))
        elif line.startswith("+ "):
            out[key][-1][1].append(line[2:])
        elif line.strip() and not line.startswith("#"):
            raise Refusal("course/mutants.txt line %d: not '== TASK KIND', '- OLD' or '+ NEW'" % n)
    return out


def plant(body, edits, used):
    """A region's body with a planted wrong answer: each edit replaces the line holding its `old` text;
    used[k] counts where edit k was found (once in all of the task's regions, or the plant is refused)."""
    body = list(body)
    for k, (old, new) in enumerate(edits):
        hits = [i for i, l in enumerate(body) if old in l]
        used[k] += len(hits)
        if len(hits) == 1:
            i = hits[0]
            ind = body[i][:len(body[i]) - len(body[i].lstrip())]
            body[i:i + 1] = [ind + x for x in new]
    return body


def make_handout(root, chosen, out, keep_markers, mutants=()):
    """mutants: (task, kind) pairs of course/mutants.txt, at most one per task, each planted in its task."""
    regions, points, sh = validate(root)
    planted, edits, used = dict(mutants), {}, {}
    known = read_mutants(root) if mutants else {}
    for task, kind in mutants:
        if (task, kind) not in known or task not in points:
            raise Refusal("no planted answer '%s %s' in course/mutants.txt" % (task, kind))
        edits[task], used[task] = known[(task, kind)], [0] * len(known[(task, kind)])
    if len(planted) < len(mutants):
        raise Refusal("two planted answers in one task")
    if os.path.exists(out) and os.listdir(out):
        raise Refusal("OUT=%s exists and is not empty" % out)
    by_file = {}
    for r in regions:
        by_file.setdefault(r.path, []).append(r)
    editable = sorted({r.path for r in regions if r.task in chosen})
    manifest = []
    for rel in tree_files(root):
        src, dst = os.path.join(root, rel), os.path.join(out, rel)
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        mutated = any(r.task in planted for r in by_file.get(rel, []))
        if rel in by_file and (rel in editable or not keep_markers or mutated):
            lines = open(src, encoding="utf-8").read().split("\n")
            new, last = [], 0
            for r in by_file[rel]:
                new += lines[last:r.begin]
                if r.task in chosen:
                    new += [lines[r.begin]] + stub(r, lines) + [lines[r.end]]
                elif r.task in planted:
                    body = plant(lines[r.begin + 1:r.end], edits[r.task], used[r.task])
                    new += [lines[r.begin]] + ([] if planted[r.task] == "zeros" else body) + [lines[r.end]]
                elif keep_markers:
                    new += lines[r.begin:r.end + 1]
                else:
                    new += lines[r.begin + 1:r.end]
                last = r.end + 1
            new += lines[last:]
            with open(dst, "w", encoding="utf-8") as f:
                f.write("\n".join(new))
            shutil.copymode(src, dst)
        else:
            shutil.copy2(src, dst)  # the modification time too: a build of the solution's objects stays valid
        if rel not in editable:
            manifest.append("%s  %s" % (hashlib.sha256(open(dst, "rb").read()).hexdigest(), rel))
    for task, kind in mutants:
        if any(u != 1 for u in used[task]):
            raise Refusal("planted answer '%s %s': its lines are not each found once in the task's regions" % (task, kind))
    os.makedirs(os.path.join(out, "course"), exist_ok=True)
    with open(os.path.join(out, "course", "EDITABLE"), "w") as f:
        f.write("".join(p + "\n" for p in editable))
    with open(os.path.join(out, "course", "MANIFEST"), "w") as f:
        f.write("".join(m + "\n" for m in manifest))
    order = [t for t in points if t in chosen]
    total = sum(points[t] for t in order)
    with open(os.path.join(out, "ASSIGNMENT.md"), "w", encoding="utf-8") as f:
        f.write("# Assignment: %d task%s, %d points\n\n" % (len(order), "" if len(order) == 1 else "s", total))
        f.write("Write each task's code between its `// BEGIN SOLUTION task=ID` and `// END SOLUTION` lines, in place "
                "of the `throw` (files: %s). Then:\n\n" % ", ".join(editable or ["none"]))
        f.write("```\nmake CPU=1 -j2          # build (g++; `make` uses nvcc where it is installed)\n"
                "make CPU=1 grade         # the grade table, and results.json\n"
                "make submission          # submission.tar.gz of the files you edit\n```\n\n")
        f.write("| task | points |\n| --- | --- |\n")
        for t in order:
            f.write("| %s | %d |\n" % (t, points[t]))
        for t in order:
            f.write("\n" + sh[t][0].rstrip("\n") + "\n")
    return order, editable


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="", help="comma-separated task ids, 'all' or 'none'")
    p.add_argument("--out", help="the handout's folder (created; must not hold anything)")
    p.add_argument("--root", default=".", help="the solution tree")
    p.add_argument("--keep-markers", action="store_true",
                   help="keep the markers of the tasks not chosen (CI grades every task of such a handout)")
    p.add_argument("--check", action="store_true", help="validate the markers and sheets, write nothing")
    p.add_argument("--mutant", nargs=2, metavar=("TASK", "KIND"), action="append", default=[],
                   help="plant a wrong answer of course/mutants.txt (CI; repeated: one per task): markers kept; "
                        "the tasks of --tasks blanked")
    p.add_argument("--list", action="store_true", help="print the task ids and points")
    a = p.parse_args()
    try:
        regions, points, _ = validate(a.root)
        if a.check or a.list:
            if a.list:
                for t, n in points.items():
                    print(t, n)
            return 0
        if not a.out:
            raise Refusal("OUT= names the handout's folder")
        names = [t for t in a.tasks.split(",") if t]
        planted = ", ".join("'%s %s'" % tuple(m) for m in a.mutant)
        if a.mutant and names in ([], ["none"]):
            make_handout(a.root, set(), a.out, True, a.mutant)
            print("solution with planted answer%s %s in %s" % ("s" if len(a.mutant) > 1 else "", planted, a.out))
            return 0
        if names == ["all"]:
            chosen = set(points)
        elif names == ["none"]:
            chosen = set()
        else:
            if not names:
                raise Refusal("TASKS= names the tasks (comma-separated), 'all' or 'none'; the tasks: " + ",".join(points))
            unknown = [t for t in names if t not in points]
            if unknown:
                raise Refusal("unknown task %s (the tasks: %s)" % (", ".join(unknown), ",".join(points)))
            chosen = set(names)
        both = [m[0] for m in a.mutant if m[0] in chosen]
        if both:
            raise Refusal("the planted answer's task %s is also blanked" % both[0])
        order, editable = make_handout(a.root, chosen, a.out, a.keep_markers or bool(a.mutant), a.mutant)
        if a.mutant:
            print("planted answer%s %s in %s, with %s blanked" % ("s" if len(a.mutant) > 1 else "", planted, a.out, ",".join(order)))
            return 0
        print("handout in %s: %d tasks (%s), %s to edit" % (a.out, len(order), ",".join(order) or "none",
                                                          ", ".join(editable) or "no file"))
        return 0
    except (markers.MarkerError, Refusal) as e:
        print("handout: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
