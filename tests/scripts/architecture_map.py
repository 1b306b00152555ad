#!/usr/bin/env python3
"""docs/architecture.md is the map of the code, and this checks that it holds:

  1. every file of src/ appears in it, by its name ("state.c"; a header also as "state.c/.h"); a
     family written with a wildcard ("comm*.c", "cpu_<family>.c") does not count, each file is named;
  2. every path it names exists: each `code span` that looks like a file (has a "/" or ends in a
     source or document extension) names a file or directory of the repository, or the tail of
     one's path ("core/state.c", "cpu_norm.c"); "config.c/.h" names both; "*" and "<...>" match
     as in a glob. Spans such as `DIR/.gtrain-claim` (a run's files) are not paths of the repository.

Usage: architecture_map.py REPO_ROOT. Exit 1 naming what is missing, else 0.
"""
import fnmatch
import os
import re
import sys

EXTS = (".c", ".h", ".cu", ".cuh", ".md", ".py", ".sh", ".ini", ".cmake", ".txt", ".json")


def src_files(root):
    out = []
    for d, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            out.append(os.path.relpath(os.path.join(d, f), os.path.join(root, "src")))
    return sorted(out)


def named(doc, rel):
    base = os.path.basename(rel)
    stem, ext = os.path.splitext(base)
    forms = [base]
    if ext == ".h":
        forms += [stem + ".c/.h", stem + ".cu/.h"]
    return any(re.search(r"(?<![\w*<>-])" + re.escape(f) + r"(?![\w*<>])", doc) for f in forms)


def spans(doc):
    for s in re.findall(r"`([^`\n]+)`", doc):
        s = s.strip()
        if " " in s or "(" in s or "=" in s or s.startswith(".") or re.match(r"^[A-Z]+/", s):
            continue  # prose, a call, a setting, an extension alone, a run's path (DIR/...)
        if "/" in s or s.endswith(EXTS):
            yield s


def repo_files(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
        rel = os.path.relpath(d, root)
        out += [x if rel == "." else os.path.join(rel, x) for x in dirs + files]
    return out


def exists(files, s):
    """A path of the repository, or the tail of one ("core/state.c", "cpu_norm.c")."""
    m = re.match(r"^(.*)\.(c|cu)/\.h$", s)  # "config.c/.h": the .c and its header
    variants = [m.group(1) + "." + m.group(2), m.group(1) + ".h"] if m else [s]
    for v in variants:
        pattern = re.sub(r"<[^>]*>", "*", v).rstrip("/")
        if not any(fnmatch.fnmatchcase(f, pattern) or fnmatch.fnmatchcase(f, "*/" + pattern) for f in files):
            return False
    return True


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    path = os.path.join(root, "docs", "architecture.md")
    doc = open(path, encoding="utf-8").read()
    missing = [f for f in src_files(root) if not named(doc, f)]
    files = repo_files(root)
    dangling = sorted({s for s in spans(doc) if not exists(files, s)})
    for f in missing:
        print(f"docs/architecture.md: src/{f} is not in the map (expected its name, e.g. `{os.path.basename(f)}`)")
    for s in dangling:
        print(f"docs/architecture.md: `{s}` names no file of the repository")
    if missing or dangling:
        return 1
    print(f"docs/architecture.md: all {len(src_files(root))} files of src/ in the map, every path it names exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
