#!/usr/bin/env python3
"""The include graph of include/specdec, drawn and checked.

    python3 tools/include_graph.py --svg docs/include_graph.svg --markdown docs/layering.md
    python3 tools/include_graph.py --check

Nodes are the library's directories (core, detail, sampling, verify, ...; a nested detail/
or kernels/ directory is drawn with its parent); an arrow A -> B means some header of A includes a header of
B. Layers are drawn bottom-up: a directory sits one row above the highest directory it includes.

--check enforces the layering rules and exits 1 naming every violation:
  - no include cycles between directories, and none between headers;
  - core/ includes only core/ (and the standard library);
  - propose/ never includes verify/;
  - decode/autoregressive.hpp does not include decode/speculative_decoder.hpp;
  - no header outside backend/ includes backend/, and backend/cpu and backend/cuda never include
    each other;
  - no header above 600 lines unless its first comment says why (a line containing "one topic").
Standard library only.
"""

import argparse
import html
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](specdec/[^>"]+)[>"]', re.M)
MAX_LINES = 600


def headers():
    """Every header under include/specdec, as 'specdec/...' paths."""
    out = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "specdec")):
        for f in files:
            if f.endswith((".hpp", ".cuh", ".inl")):
                out.append(os.path.relpath(os.path.join(dirpath, f), ROOT).replace(os.sep, "/"))
    return sorted(out)


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def directory(path):
    """The node of a header: its directory below specdec/, a nested detail/ or kernels/ (kernel
    bodies, *.inl) folded into its parent (the umbrella header is 'specdec.hpp')."""
    parts = path.split("/")[1:-1]
    if parts and parts[-1] in ("detail", "kernels") and len(parts) > 1:
        parts = parts[:-1]
    return "/".join(parts) if parts else "specdec.hpp"


def graph():
    files = headers()
    edges = {f: sorted(set(INCLUDE.findall(read(f)))) for f in files}
    return files, edges


def cycles(nodes, succ):
    """Strongly connected components with more than one node (or a self loop)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in succ.get(v, ()):
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def check(files, edges):
    problems = []
    for f, incs in edges.items():
        for i in incs:
            if i not in edges:
                problems.append(f"{f} includes {i}, which does not exist")
    dsucc = defaultdict(set)
    for f, incs in edges.items():
        for i in incs:
            a, b = directory(f), directory(i)
            if a != b:
                dsucc[a].add(b)
    for comp in cycles(sorted({directory(f) for f in files}), dsucc):
        problems.append("directories include each other: " + " <-> ".join(comp))
    for comp in cycles(files, edges):
        problems.append("headers include each other: " + " <-> ".join(comp))
    for f, incs in edges.items():
        d = directory(f)
        for i in incs:
            di = directory(i)
            if d == "core" and di != "core":
                problems.append(f"{f} (core/) includes {i}")
            if d == "propose" and di == "verify":
                problems.append(f"{f} (propose/) includes {i} (verify/)")
            if f == "specdec/decode/autoregressive.hpp" and i == "specdec/decode/speculative_decoder.hpp":
                problems.append(f"{f} includes {i}")
            if di.startswith("backend") and not d.startswith("backend"):
                problems.append(f"{f} includes the backend header {i}")
            if d.startswith("backend/") and di.startswith("backend/") and d != di:
                problems.append(f"{f} ({d}) includes {i} ({di})")
    for f in files:
        text = read(f)
        n = text.count("\n")
        if n > MAX_LINES:
            head = text[: text.find("\n#include")] if "\n#include" in text else text[:2000]
            if "one topic" not in head.lower():
                problems.append(f"{f} has {n} lines (over {MAX_LINES}) and its first comment "
                                "does not say why one topic needs them")
    return problems


def layers(nodes, succ):
    """Row of each node: 0 for nodes that include no other node, else 1 + the highest row of the
    nodes they include (the graph is acyclic when --check passes; cycles are cut)."""
    row = {}

    def depth(v, seen):
        if v in row:
            return row[v]
        if v in seen:
            return 0
        seen.add(v)
        r = 0
        for w in succ.get(v, ()):
            r = max(r, depth(w, seen) + 1)
        seen.discard(v)
        row[v] = r
        return r

    for v in nodes:
        depth(v, set())
    return row


def draw_svg(files, edges):
    weight = defaultdict(int)
    nodes = sorted({directory(f) for f in files})
    size = defaultdict(int)
    for f in files:
        size[directory(f)] += 1
    for f, incs in edges.items():
        for i in incs:
            a, b = directory(f), directory(i)
            if a != b:
                weight[(a, b)] += 1
    succ = defaultdict(set)
    for a, b in weight:
        succ[a].add(b)
    row = layers(nodes, succ)
    top = max(row.values())
    by_row = defaultdict(list)
    for v in nodes:
        by_row[row[v]].append(v)
    bw, bh, gx, gy = 150, 44, 40, 90
    width = max(len(v) for v in by_row.values()) * (bw + gx) + gx
    height = (top + 1) * (bh + gy) + gy
    pos = {}
    for r, vs in by_row.items():
        vs.sort()
        total = len(vs) * bw + (len(vs) - 1) * gx
        x0 = (width - total) / 2
        y = gy / 2 + (top - r) * (bh + gy)
        for k, v in enumerate(vs):
            pos[v] = (x0 + k * (bw + gx), y)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="13">',
        '<defs><marker id="a" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#667"/></marker></defs>',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>',
    ]
    for (a, b), w in sorted(weight.items()):
        xa, ya = pos[a]
        xb, yb = pos[b]
        x1, y1 = xa + bw / 2, ya + bh
        x2, y2 = xb + bw / 2, yb
        if yb <= ya:  # same row or upward (only with a cycle): from the side
            y1, y2 = ya + bh / 2, yb + bh / 2
        out.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                   f'stroke="#667" stroke-opacity="0.55" stroke-width="{min(1 + w / 4, 4):.1f}" '
                   'marker-end="url(#a)"><title>'
                   f'{html.escape(a)} includes {html.escape(b)} ({w} include lines)</title></line>')
    for v in nodes:
        x, y = pos[v]
        fill = "#e8f0fe" if not v.startswith("backend") else "#fdebd3"
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw}" height="{bh}" rx="6" fill="{fill}" '
                   'stroke="#335"/>')
        out.append(f'<text x="{x + bw / 2:.1f}" y="{y + 19:.1f}" text-anchor="middle" '
                   f'font-weight="bold">{html.escape(v)}</text>')
        out.append(f'<text x="{x + bw / 2:.1f}" y="{y + 35:.1f}" text-anchor="middle" '
                   f'fill="#556" font-size="11">{size[v]} header{"s" if size[v] != 1 else ""}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n", weight, row


def markdown(weight, row, svg_name):
    lines = [
        "# Layering of include/specdec",
        "",
        "Generated by `python3 tools/include_graph.py --svg docs/include_graph.svg --markdown "
        "docs/layering.md`; `python3 tools/include_graph.py --check` (a test) enforces the rules "
        "below.",
        "",
        f"![include graph]({svg_name})",
        "",
        "Each box is a directory of `include/specdec` (a nested `detail/` or `kernels/` is drawn "
        "with its parent); an arrow means some header of one includes a header of the other. A directory "
        "sits one row above the highest directory it includes, so every arrow points down.",
        "",
        "Rules (checked): no include cycles between directories or headers; `core/` includes only "
        "`core/`; `propose/` never includes `verify/`; `decode/autoregressive.hpp` does not "
        "include the speculative decoder; only `backend/` includes `backend/`, and the CPU and "
        "CUDA backends never include each other; no header over 600 lines unless its first "
        "comment says why one topic needs them.",
        "",
        "| directory | row | includes (include lines) |",
        "|---|---|---|",
    ]
    succ = defaultdict(list)
    for (a, b), w in sorted(weight.items()):
        succ[a].append(f"{b} ({w})")
    for v in sorted(row, key=lambda v: (row[v], v)):
        lines.append(f"| {v} | {row[v]} | {', '.join(succ[v]) or '-'} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--svg", help="write the drawing here")
    ap.add_argument("--markdown", help="write the page (with the table of edges) here")
    ap.add_argument("--check", action="store_true", help="enforce the layering rules")
    args = ap.parse_args()
    files, edges = graph()
    if args.svg or args.markdown:
        svg, weight, row = draw_svg(files, edges)
        if args.svg:
            with open(args.svg, "w", encoding="utf-8") as f:
                f.write(svg)
        if args.markdown:
            name = os.path.relpath(args.svg, os.path.dirname(args.markdown)) if args.svg else "include_graph.svg"
            with open(args.markdown, "w", encoding="utf-8") as f:
                f.write(markdown(weight, row, name))
    if args.check:
        problems = check(files, edges)
        for p in problems:
            print("include_graph: " + p, file=sys.stderr)
        print(f"include_graph: {len(files)} headers, {sum(len(v) for v in edges.values())} "
              f"includes, {len(problems)} problems")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
