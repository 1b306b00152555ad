#!/usr/bin/env python3
"""include_cycles.py — finds include rings among the modules of a source tree.

    python3 tools/include_cycles.py [DIR]        (default: src)

A module is a .c/.cu/.h/.cuh file's name without its extension, so a .c and its .h count as one; an
edge a -> b is a `#include "b.h"` in one of a's files. Prints every strongly connected component of
more than one module (a ring) and exits 1 if there is one, else prints "no include rings" and exits 0.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
EXTS = (".c", ".cu", ".h", ".cuh", ".inc")


def modules(root):
    edges, names = {}, set()
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(EXTS):
                names.add(os.path.splitext(f)[0])
    for d, _, files in os.walk(root):
        for f in files:
            if not f.endswith(EXTS):
                continue
            a = os.path.splitext(f)[0]
            with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
                for inc in INCLUDE.findall(fh.read()):
                    b = os.path.splitext(os.path.basename(inc))[0]
                    if b in names and b != a:
                        edges.setdefault(a, set()).add(b)
    return names, edges


def rings(names, edges):
    """Tarjan's strongly connected components, iteratively; those of two or more modules."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(names):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    found = rings(*modules(root))
    for comp in found:
        print("include ring: " + " <-> ".join(comp))
    if not found:
        print("no include rings")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
