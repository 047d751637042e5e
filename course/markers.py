"""Solution regions: the comment lines `// BEGIN SOLUTION task=ID points=N` and `// END SOLUTION` around a
function's body (README, "Course assignments"). Shared by the grader's driver (course/grade.py, which
reads each task's points from them) and the handout generator (course/handout.py, solution tree only).
Python's standard library only."""
import os
import re

# The files that may hold solution regions, relative to the tree's root.
SOURCES = ["transformer.h", "transformer.cu", "decoding.cuh", "gpu/attention.cuh", "gpu/layernorm.cuh", "tokenizer.cpp", "bleu.h"]

BEGIN = re.compile(r"^(\s*)// BEGIN SOLUTION task=([a-z0-9_]+) points=([0-9]+)\s*$")
ANY_MARKER = re.compile(r"(BEGIN|END) SOLUTION")


class MarkerError(Exception):
    """A malformed, unpaired or inconsistent marker: str() is the one line to print."""


class Region:
    def __init__(self, path, begin, end, task, points, indent):
        self.path, self.begin, self.end = path, begin, end  # 0-based line numbers of the two markers
        self.task, self.points, self.indent = task, points, indent


def read_regions(root, sources=SOURCES):
    """Every solution region of the tree at `root`, in file order; raises MarkerError on the first bad one."""
    regions = []
    for rel in sources:
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        open_region = None
        for n, line in enumerate(lines):
            if not ANY_MARKER.search(line):
                continue
            where = "%s:%d" % (rel, n + 1)
            m = BEGIN.match(line)
            if m:
                if open_region:
                    raise MarkerError("%s: BEGIN SOLUTION inside the region opened at line %d (unpaired marker)"
                                      % (where, open_region.begin + 1))
                open_region = Region(rel, n, None, m.group(2), int(m.group(3)), m.group(1))
            elif line.strip() == "// END SOLUTION":
                if not open_region:
                    raise MarkerError("%s: END SOLUTION without a BEGIN SOLUTION (unpaired marker)" % where)
                open_region.end = n
                regions.append(open_region)
                open_region = None
            else:
                raise MarkerError("%s: not a marker this generator knows: %r (expected '// BEGIN SOLUTION task=ID "
                                  "points=N' or '// END SOLUTION' alone on its line)" % (where, line.strip()))
        if open_region:
            raise MarkerError("%s:%d: BEGIN SOLUTION task=%s is never closed (unpaired marker)"
                              % (rel, open_region.begin + 1, open_region.task))
    points = {}
    for r in regions:
        if points.setdefault(r.task, r.points) != r.points:
            raise MarkerError("%s:%d: task %s has points=%d here and points=%d in another region"
                              % (r.path, r.begin + 1, r.task, r.points, points[r.task]))
    return regions


def task_points(regions):
    """{task: points}, in the order the tasks first appear."""
    out = {}
    for r in regions:
        out.setdefault(r.task, r.points)
    return out
