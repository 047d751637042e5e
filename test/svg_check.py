#!/usr/bin/env python3
"""svg_check: the geometry of the pictures ./train and ./translate draw, read back from the SVG.

Every <text> gets a box from an upper bound of its extent (the bounds of svg.h: 1.0 em per character,
1.1 em in bold, 1.0 em above the baseline and 0.25 em below it), placed by x, y, text-anchor, font-size
and font-weight (inherited as in SVG) and a transform: translate(X,Y) and rotate(A[ X Y]); a turned box
is replaced by the upright box around it, still an upper bound. Checked: every box lies inside the canvas, no two boxes overlap, no box
overlaps a heat map (the cells of a <g class="map">), and every cell, circle, line and polyline lies inside
the canvas. Overlap means more than touching.

  svg_check.py layout FILE...               the checks above
  svg_check.py attention FILE MAPS          and: MAPS heat maps, each a full grid of cells, fonts >= 9 px
  svg_check.py curves FILE LOG_CSV          and: the series of log.csv, drawn as curves.svg promises
  svg_check.py self-test                    drawings the checker must reject are rejected
Exit status 1 when a check fails, with the failures (and the tightest gap found) printed.
"""
import csv
import math
import re
import sys
import xml.etree.ElementTree as ET

EM, EM_BOLD, ASCENT, DESCENT = 1.0, 1.1, 1.0, 0.25
NS = "{http://www.w3.org/2000/svg}"


def tag(e):
    return e.tag[len(NS):] if e.tag.startswith(NS) else e.tag


class Drawing:
    def __init__(self, text):
        root = ET.fromstring(text)
        if tag(root) != "svg":
            raise ValueError("not an SVG document")
        self.width, self.height = float(root.get("width")), float(root.get("height"))
        self.texts, self.maps, self.cells, self.circles, self.lines, self.polylines = [], [], [], [], [], []
        self._walk(root, None, {"font-size": "16", "font-weight": "normal", "text-anchor": "start"})

    def _walk(self, e, group, style):
        style = dict(style, **{k: e.get(k) for k in style if e.get(k) is not None})
        t = tag(e)
        if t == "text":
            self.texts.append(self._text_box(e, style))
        elif t == "g" and e.get("class") == "map":
            group = {"title": e.get("data-title"), "cells": []}
            self.maps.append(group)
        elif t == "rect" and e.get("width") != "100%":
            x, y, w, h = (float(e.get(k, 0)) for k in ("x", "y", "width", "height"))
            box = (x, y, x + w, y + h)
            self.cells.append(box)
            if group is not None:
                group["cells"].append(box)
        elif t == "circle":
            cx, cy, r = (float(e.get(k)) for k in ("cx", "cy", "r"))
            self.circles.append({"box": (cx - r, cy - r, cx + r, cy + r), "cx": cx, "cy": cy,
                                 "series": e.get("data-series"), "step": e.get("data-step")})
        elif t == "line":
            x1, y1, x2, y2 = (float(e.get(k)) for k in ("x1", "y1", "x2", "y2"))
            self.lines.append((min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)))
        elif t == "polyline":
            pts = [tuple(map(float, p.split(","))) for p in e.get("points").split()]
            self.polylines.append({"series": e.get("data-series"), "points": pts})
        for child in e:
            if tag(child) != "title":  # tooltips are not drawn
                self._walk(child, group, style)

    @staticmethod
    def _text_box(e, style):
        s = "".join(e.itertext())
        size, bold, anchor = float(style["font-size"]), style["font-weight"] == "bold", style["text-anchor"]
        x, y = float(e.get("x", 0)), float(e.get("y", 0))
        w = len(s) * size * (EM_BOLD if bold else EM)
        a0 = {"start": 0.0, "middle": -w / 2, "end": -w}[anchor]
        corners = [(x + a0, y - ASCENT * size), (x + a0 + w, y - ASCENT * size), (x + a0, y + DESCENT * size),
                   (x + a0 + w, y + DESCENT * size)]
        transform = e.get("transform", "")
        # applied right to left: the last operation of the list is applied to the points first
        for op, args in reversed(re.findall(r"(\w+)\(([^)]*)\)", transform)):
            v = [float(a) for a in re.split(r"[\s,]+", args.strip())]
            if op == "translate":
                dx, dy = v[0], v[1] if len(v) > 1 else 0.0
                corners = [(px + dx, py + dy) for px, py in corners]
            elif op == "rotate":
                a = math.radians(v[0])
                cx, cy = (v[1], v[2]) if len(v) == 3 else (0.0, 0.0)
                corners = [(cx + (px - cx) * math.cos(a) - (py - cy) * math.sin(a),
                            cy + (px - cx) * math.sin(a) + (py - cy) * math.cos(a)) for px, py in corners]
            else:
                raise ValueError("unsupported transform %r" % transform)
        box = (min(p[0] for p in corners), min(p[1] for p in corners), max(p[0] for p in corners), max(p[1] for p in corners))
        return {"text": s, "size": size, "box": box, "anchor": anchor, "bold": bold, "vertical": bool(transform)}


def gap(a, b):
    """Distance between two boxes; negative when they overlap (by the smaller of the two overlaps)."""
    dx = max(a[0] - b[2], b[0] - a[2])
    dy = max(a[1] - b[3], b[1] - a[3])
    return max(dx, dy)


def layout_failures(d):
    fails, eps = [], 1e-6
    inside = lambda b: b[0] >= -eps and b[1] >= -eps and b[2] <= d.width + eps and b[3] <= d.height + eps
    for t in d.texts:
        if not inside(t["box"]):
            fails.append("text %r at %s leaves the %gx%g canvas" % (t["text"], fmt(t["box"]), d.width, d.height))
    for what, boxes in (("cell", d.cells), ("circle", [c["box"] for c in d.circles]), ("line", d.lines)):
        for b in boxes:
            if not inside(b):
                fails.append("%s at %s leaves the %gx%g canvas" % (what, fmt(b), d.width, d.height))
    for p in d.polylines:
        for x, y in p["points"]:
            if not inside((x, y, x, y)):
                fails.append("polyline %r point (%g, %g) leaves the canvas" % (p["series"], x, y))
    closest = math.inf
    boxes = sorted(d.texts, key=lambda t: t["box"][0])
    for i, a in enumerate(boxes):  # sweep in x: only boxes that start before `a` ends can overlap it
        for b in boxes[i + 1:]:
            if b["box"][0] >= a["box"][2] + 50:
                break
            g = gap(a["box"], b["box"])
            closest = min(closest, g)
            if g < -eps:
                fails.append("texts %r and %r overlap (by %.2f px)" % (a["text"], b["text"], -g))
    for m in d.maps:
        if not m["cells"]:
            fails.append("map %r has no cells" % m["title"])
            continue
        area = (min(c[0] for c in m["cells"]), min(c[1] for c in m["cells"]),
                max(c[2] for c in m["cells"]), max(c[3] for c in m["cells"]))
        for t in d.texts:
            g = gap(area, t["box"])
            closest = min(closest, g)
            if g < -eps:
                fails.append("text %r overlaps map %r (by %.2f px)" % (t["text"], m["title"], -g))
    return fails, closest


def fmt(b):
    return "(%.1f, %.1f)-(%.1f, %.1f)" % b


def attention_failures(d, maps):
    fails = []
    if len(d.maps) != maps:
        fails.append("%d heat maps, want %d" % (len(d.maps), maps))
    for m in d.maps:
        xs = sorted({c[0] for c in m["cells"]})
        ys = sorted({c[1] for c in m["cells"]})
        if len(m["cells"]) != len(xs) * len(ys):
            fails.append("map %r: %d cells do not form a %dx%d grid" % (m["title"], len(m["cells"]), len(ys), len(xs)))
        sizes = {round(c[2] - c[0], 6) for c in m["cells"]}
        if min(sizes, default=0) < 12:
            fails.append("map %r: cells of %g px, want >= 12" % (m["title"], min(sizes)))
    small = [t for t in d.texts if t["size"] < 9]
    if small:
        fails.append("%d texts below 9 px, e.g. %r at %g px" % (len(small), small[0]["text"], small[0]["size"]))
    return fails


def curves_failures(d, log_csv):
    fails = []
    rows = list(csv.DictReader(open(log_csv)))
    columns = {"training loss": "loss", "validation loss": "val_loss", "BLEU": "val_bleu", "exact match": "val_exact_match"}
    legend = {t["text"] for t in d.texts}
    drawn = {p["series"]: p for p in d.polylines}
    for name, col in columns.items():
        measured = [(int(r["step"]), float(r[col])) for r in rows if r[col] != ""]
        dots = [c for c in d.circles if c["series"] == name]
        if not measured:  # never measured: neither drawn nor in the legend
            if name in drawn or dots or name in legend:
                fails.append("%r was never measured (log.csv column %s is empty) but is drawn or in the legend" % (name, col))
            continue
        if name not in drawn or name not in legend:
            fails.append("%r is measured %d times but %s" % (name, len(measured), "not drawn" if name not in drawn else "not in the legend"))
            continue
        pts = drawn[name]["points"]
        if len(pts) != len(measured):
            fails.append("%r: the line has %d points, log.csv %d measurements" % (name, len(pts), len(measured)))
        if any(b[0] < a[0] for a, b in zip(pts, pts[1:])):
            fails.append("%r: the line goes back in x" % name)
        if name != "training loss":  # validation: a point per measurement, at its step
            if [int(c["step"]) for c in dots] != [s for s, _ in measured]:
                fails.append("%r: points at steps %s, log.csv measured at %s" %
                             (name, [c["step"] for c in dots], [s for s, _ in measured]))
            elif [(c["cx"], c["cy"]) for c in dots] != pts:
                fails.append("%r: the line does not join exactly the measured points" % name)
            # values: y is a decreasing linear function of the value (one panel, one scale)
            vals = [v for _, v in measured]
            ys = [c["cy"] for c in dots]
            for (v1, y1), (v2, y2) in zip(zip(vals, ys), zip(vals[1:], ys[1:])):
                if (v1 < v2 and not y1 > y2) or (v1 > v2 and not y1 < y2) or (v1 == v2 and abs(y1 - y2) > 1e-6):
                    fails.append("%r: values %g, %g drawn at y %g, %g" % (name, v1, v2, y1, y2))
                    break
    # axes: "step" under each panel, numbered ticks on both axes
    steps = [t for t in d.texts if t["text"] == "step"]
    numbers = [t for t in d.texts if re.fullmatch(r"-?[\d.]+(e[-+]?\d+)?", t["text"]) and not t["vertical"]]
    xlabels = [t for t in numbers if t["anchor"] == "middle"]
    ylabels = [t for t in numbers if t["anchor"] == "end"]
    panels = len([t for t in d.texts if t["bold"]])
    if not steps or len(steps) != panels:
        fails.append("%d x axes labelled 'step' for %d panels" % (len(steps), panels))
    last = max(int(r["step"]) for r in rows)
    xs = sorted(float(t["text"]) for t in xlabels)
    if len(xlabels) < 3 * panels or xs[0] != 0 or xs[-1] < last:
        fails.append("x tick labels %s do not number 0 to step %d (3 or more per panel)" % (xs, last))
    if len(ylabels) < 3 * panels:
        fails.append("%d y tick labels for %d panels, want 3 or more each" % (len(ylabels), panels))
    return fails


def report(name, fails, closest, what):
    for f in fails[:20]:
        print("FAIL svg_check %s: %s" % (name, f))
    if len(fails) > 20:
        print("FAIL svg_check %s: ... %d failures in all" % (name, len(fails)))
    print("svg_check %s: %s; %d failures; tightest gap between texts (or a text and a map) %.2f px, must be >= 0" %
          (name, what, len(fails), closest))
    return not fails


def check_file(path, extra=None):
    d = Drawing(open(path, encoding="utf-8").read())
    fails, closest = layout_failures(d)
    if extra:
        fails += extra(d)
    what = "%gx%g canvas, %d texts, %d maps, %d cells" % (d.width, d.height, len(d.texts), len(d.maps), len(d.cells))
    return report(path, fails, closest, what)


SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="200" height="100">%s</svg>'
GOOD = ('<text x="10" y="20" font-size="10" text-anchor="start">abc</text>'
        '<text x="190" y="20" font-size="10" text-anchor="end">abc</text>'
        '<text x="50" y="90" font-size="10" text-anchor="start" transform="rotate(-90 50 90)">vertical</text>'
        '<g class="map"><rect x="100" y="40" width="12" height="12"/><rect x="112" y="40" width="12" height="12"/></g>')
BAD = {  # each must be rejected; the name says why
    "text past the right edge": '<text x="180" y="20" font-size="10" text-anchor="start">abc</text>',
    "text past the left edge (anchor end)": '<text x="20" y="20" font-size="10" text-anchor="end">abcd</text>',
    "text above the top": '<text x="10" y="5" font-size="10" text-anchor="start">a</text>',
    "bold text longer than plain": '<text x="100" y="20" font-size="10" text-anchor="start" font-weight="bold">abcdefghij</text>',
    "two overlapping texts": '<text x="10" y="20" font-size="10">abcd</text><text x="45" y="25" font-size="10">x</text>',
    "middle-anchored overlap": '<text x="50" y="20" font-size="10" text-anchor="middle">abcdef</text>'
                               '<text x="75" y="20" font-size="10" text-anchor="start">x</text>',
    "vertical text over a label": '<text x="50" y="60" font-size="10" transform="rotate(-90 50 60)">abcd</text>'
                                  '<text x="30" y="30" font-size="10">abc</text>',
    "vertical text past the top": '<text x="50" y="60" font-size="10" transform="rotate(-90 50 60)">abcdefghijklmnop</text>',
    "text over a heat map": '<g class="map"><rect x="100" y="40" width="20" height="20"/></g>'
                            '<text x="95" y="50" font-size="10">ab</text>',
    "cell outside the canvas": '<g class="map"><rect x="190" y="40" width="20" height="20"/></g>',
    "polyline outside the canvas": '<polyline points="10,10 250,10"/>',
    "circle outside the canvas": '<circle cx="199" cy="50" r="3"/>',
    "titles running into each other (the layout of issue 18)":
        '<text x="10" y="12" font-size="10" font-weight="bold">encoder-decoder attention, layer 1, head 1</text>'
        '<text x="150" y="12" font-size="10" font-weight="bold">encoder-decoder attention, layer 1, head 2</text>',
}


def self_test():
    ok = True
    d = Drawing(SVG % GOOD)
    fails, _ = layout_failures(d)
    plain = Drawing(SVG % BAD["bold text longer than plain"].replace(' font-weight="bold"', ""))
    fails += layout_failures(plain)[0]
    if fails or len(d.texts) != 3 or len(d.maps) != 1:
        print("FAIL svg_check self-test: a good drawing is rejected: %s" % fails)
        ok = False
    for why, body in BAD.items():
        fails, _ = layout_failures(Drawing(SVG % body))
        if not fails:
            print("FAIL svg_check self-test: not rejected: %s" % why)
            ok = False
    # attention: a map that is not a full grid, and small print
    holes = ('<g class="map" data-title="m"><rect x="10" y="40" width="12" height="12"/>'
             '<rect x="22" y="52" width="12" height="12"/></g>')
    if not attention_failures(Drawing(SVG % holes), 1):
        print("FAIL svg_check self-test: not rejected: a map with holes")
        ok = False
    if not attention_failures(Drawing(SVG % '<text x="10" y="20" font-size="6">tiny</text>'), 0):
        print("FAIL svg_check self-test: not rejected: 6 px text")
        ok = False
    print("svg_check self-test: 1 good drawing accepted, %d bad ones rejected: %s" % (len(BAD) + 2, "ok" if ok else "FAILED"))
    return ok


def main(argv):
    if len(argv) >= 2 and argv[1] == "self-test":
        return self_test()
    if len(argv) >= 3 and argv[1] == "layout":
        return all([check_file(f) for f in argv[2:]])
    if len(argv) == 4 and argv[1] == "attention":
        return check_file(argv[2], lambda d: attention_failures(d, int(argv[3])))
    if len(argv) == 4 and argv[1] == "curves":
        return check_file(argv[2], lambda d: curves_failures(d, argv[3]))
    print(__doc__)
    return False


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv) else 1)
