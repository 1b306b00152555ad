#!/usr/bin/env python3
"""The repository speaks of the product alone: no issue numbers, no words about how the work on it
was organised, no paths of the machine someone ran something on.

    python3 tests/scripts/product_words.py SOURCE_DIR

Reads every file of the repository (`git ls-files` with the untracked files git does not ignore, or,
outside a git checkout, every file below SOURCE_DIR except build trees), skips binary files, and
prints one line `FILE:LINE: what: the line` per hit; exit 1 when there is one. What is looked for,
and what is not a hit:

- an issue or pull-request number: "issue 14", "issues 20-22", "PR 7", "(#12)", "#12" after a
  blank. Not a hit: the watchdog's numbered collectives, "agree #44", "all_reduce #42", "the save
  of step 8, #51", "step 8 (#44)" (src/dist/watchdog.c prints them; docs quote them).
- how the work was organised: "session(s)" (not "ssh/tmux/login/interactive session"), "lent",
  "the lead", "device tool", a device tool's `carry [...]`, "$OUT" in prose (documentation files
  only: the bench scripts name their output directory OUT), "helper" counted as a worker ("another
  helper", "four helpers"), "branch NAME-N" (a work branch named after an issue).
- a path of some machine: /work/..., /root/..., /home/USER/..., /Users/... (the paths the project
  itself chooses, /opt/gtrain-venv, /var/tmp/gtrain-*, /tmp/..., are not machine paths).

Files that must spell these words to look for them are skipped, each with its reason, in SKIP.
"""
import os
import re
import subprocess
import sys

# path (relative, '/'-separated) or directory prefix ending in '/': the reason it is not read
SKIP = {
    "tests/scripts/product_words.py": "this test: it spells every pattern it looks for",
    "tests/fuzz/corpus/": "fuzzer inputs: bytes, not text anyone reads",
}

BUILD_DIRS = re.compile(r"^(build[^/]*|\.git|\.bundle|data|runs|out)$")

ISSUE = re.compile(r"\b(issues?|pull requests?|PRs?|tickets?)\s*#?\d+", re.I)
HASH_NUMBER = re.compile(r"(?:^|(?<=[\s(\[]))#\d+\b")
# the watchdog's sequence numbers: an operation name (lower case, maybe with _) or "step N," / "step N ("
WATCHDOG_SEQ = re.compile(r"(\b[a-z][a-z0-9]*(_[a-z0-9]+)* |\bstep \d+, |\bstep \d+ \()$")
WATCHDOG_OPS = re.compile(r"\b(agree|all_reduce|all_gather|reduce_scatter|broadcast|barrier|collective|"
                          r"stop_agreement|[a-z0-9]+_[a-z0-9_]+) $")
WORK = [
    (re.compile(r"\bsessions?\b", re.I), re.compile(r"\b(ssh|tmux|screen|login|interactive|shell|x11|desktop)\s+sessions?\b", re.I),
     "a work session"),
    (re.compile(r"\blent\b", re.I), None, "a lent machine"),
    (re.compile(r"\bthe lead\b", re.I), None, "the lead"),
    (re.compile(r"\bdevice tool\b", re.I), None, "the device tool"),
    (re.compile(r"\bcarry\s*[:=]?\s*\[", re.I), None, "the device tool's carry"),
    (re.compile(r"\b(another|other|one|two|three|four|five|six) helpers?\b(?!\s+(scripts?|functions?|programs?|tools?))", re.I),
     None, "a helper at work"),
    (re.compile(r"\bbranch [A-Za-z]+-\d+\b"), None, "a work branch"),
]
DOLLAR_OUT = re.compile(r"\$OUT\b|\$\{OUT\}")
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(work|root|Users)/[\w.-]|(?<![\w.~-])/home/[a-z_][\w-]*/")


def files(src):
    if os.path.isdir(os.path.join(src, ".git")) or os.path.isfile(os.path.join(src, ".git")):
        out = subprocess.run(["git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True)
        if out.returncode == 0:
            return sorted(set(p.decode() for p in out.stdout.split(b"\0") if p))
    found = []
    for root, dirs, names in os.walk(src):
        dirs[:] = [d for d in dirs if not BUILD_DIRS.match(d)]
        for n in names:
            found.append(os.path.relpath(os.path.join(root, n), src).replace(os.sep, "/"))
    return sorted(found)


def skipped(rel):
    return any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in SKIP)


def hits_in_line(line, prose):
    found = []
    for m in ISSUE.finditer(line):
        found.append(("an issue number", m.group(0)))
    for m in HASH_NUMBER.finditer(line):
        before = line[max(0, m.start() - 40):m.start()]
        if WATCHDOG_OPS.search(before) or re.search(r"\bstep \d+(, | \()$", before):
            continue
        found.append(("an issue number", m.group(0)))
    for pattern, unless, what in WORK:
        for m in pattern.finditer(line):
            if unless and unless.search(line):
                continue
            found.append((what, m.group(0)))
    if prose:
        for m in DOLLAR_OUT.finditer(line):
            found.append(("the device tool's $OUT", m.group(0)))
    for m in MACHINE_PATH.finditer(line):
        found.append(("a machine path", m.group(0)))
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: product_words.py SOURCE_DIR")
    src = sys.argv[1]
    hits = []
    n_files = 0
    for rel in files(src):
        if skipped(rel):
            continue
        path = os.path.join(src, rel)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        n_files += 1
        prose = rel.endswith(".md")
        for n, line in enumerate(text.splitlines(), 1):
            for what, word in hits_in_line(line, prose):
                hits.append(f"{rel}:{n}: {what} ({word!r}): {line.strip()[:160]}")
    if hits:
        print(f"FAILED: {len(hits)} place(s) speak of something other than the product:")
        print("\n".join(hits))
        sys.exit(1)
    print(f"{n_files} files speak of the product alone")


if __name__ == "__main__":
    main()
