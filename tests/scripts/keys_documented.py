#!/usr/bin/env python3
"""configs/README.md documents every key of the key table, with its default.

    python3 tests/scripts/keys_documented.py GTRAIN SOURCE_DIR

`gtrain --show-config EMPTY.ini` prints every key of src/core/config.c's table with its built-in
default. configs/README.md has, under each `## [section]` heading, a table whose header starts with
`| key |` and whose rows start with `` | `name` | type | default | ``. Fails, listing each, on a key
of the program that the README leaves out, a README row that names no key of the program (a key
removed or renamed), and a README default that is not the program's. Defaults compare as numbers
when both read as numbers (1.0 = 1, 1e-5 = 1e-05); "(none)", "(empty)" and an empty cell mean the
empty text.
"""
import math
import os
import re
import subprocess
import sys
import tempfile


def program_keys(gtrain):
    with tempfile.TemporaryDirectory() as tmp:
        empty = os.path.join(tmp, "empty.ini")
        open(empty, "w").close()
        out = subprocess.run([gtrain, "--show-config", empty], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAILED: gtrain --show-config exit {out.returncode}: {out.stderr.strip()}")
    keys, section = {}, None
    for line in out.stdout.splitlines():
        if m := re.fullmatch(r"\[(\w+)\]", line):
            section = m.group(1)
        elif m := re.fullmatch(r"(\w+) = ?(.*)", line):
            keys[f"{section}.{m.group(1)}"] = m.group(2)
    if not keys:
        sys.exit("FAILED: gtrain --show-config printed no keys:\n" + out.stdout)
    return keys


def readme_keys(path):
    """{section.key: (line number, default cell)} of the key tables."""
    keys, section, in_key_table = {}, None, False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if m := re.match(r"## \[(\w+)\]", line):
                section, in_key_table = m.group(1), False
                continue
            if line.startswith("## "):
                section, in_key_table = None, False
                continue
            if not line.startswith("|"):
                in_key_table = False
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == "key":
                in_key_table = section is not None
                continue
            if not in_key_table or set(cells[0]) <= set("-: "):
                continue
            m = re.fullmatch(r"`(\w+)`", cells[0])
            if not m or len(cells) < 3:
                sys.exit(f"FAILED: {path}:{n}: a key table row that does not start with | `name` | type | default |")
            name = f"{section}.{m.group(1)}"
            if name in keys:
                sys.exit(f"FAILED: {path}:{n}: {name} is in the table twice (first on line {keys[name][0]})")
            keys[name] = (n, cells[2])
    return keys


def same_default(doc, value):
    doc = doc.strip("`")
    if doc in ("(none)", "(empty)", ""):
        doc = ""
    if doc == value:
        return True
    try:
        a, b = float(doc), float(value)
    except ValueError:
        return False
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: keys_documented.py GTRAIN SOURCE_DIR")
    gtrain, src = sys.argv[1], sys.argv[2]
    readme = os.path.join(src, "configs", "README.md")
    have = program_keys(gtrain)
    doc = readme_keys(readme)
    problems = []
    for k in have:
        if k not in doc:
            problems.append(f"configs/README.md: no row for {k} (default {have[k] or '(empty)'})")
    for k, (n, d) in doc.items():
        if k not in have:
            problems.append(f"configs/README.md:{n}: {k} is no key of gtrain")
        elif not same_default(d, have[k]):
            problems.append(f"configs/README.md:{n}: {k}: default {d!r} in the table, {have[k]!r} in gtrain")
    if problems:
        print("FAILED: configs/README.md and the key table differ:")
        print("\n".join("  " + p for p in problems))
        sys.exit(1)
    print(f"configs/README.md documents all {len(have)} keys with their defaults")


if __name__ == "__main__":
    main()
