#!/usr/bin/env python3
"""The mutation harness (tools/mutants.sh runs it; docs/testing.md): puts each curated bug of
tests/mutants/*.mutant into the source tree, one at a time, rebuilds BUILD incrementally, runs the tests
the mutant names and prints one table, mutant -> the test that caught it, or NOT CAUGHT.

A mutant file (standard library parsing, no patch tool, so a mutant survives code moving around):

    # free text: the bug, and what a user would lose
    file: src/core/optim.c
    tests: -R ^optim_cosine_matches_torch_adamw$      (ctest arguments that select the catching tests)
    expect: optim_cosine_matches_torch_adamw          (optional: the test expected to catch it, if it is
                                                       not on this branch yet; reported, not required)
    timeout: 300                                      (optional, seconds for the whole ctest run)
    --- find
    <lines that must occur exactly once in file>
    --- replace
    <their replacement>

A find text that is missing or occurs more than once makes the mutant STALE (re-anchor it after the code
moved). Every mutated file is restored byte for byte after its run, also on Ctrl-C or SIGTERM. Exit 1 on
any NOT CAUGHT, STALE or BUILD FAILED mutant (a mutant must compile: it models a bug that would ship).
"""
import argparse
import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILDREN = []  # the ctest run in flight (its own process group), ended on Ctrl-C


class Mutant:
    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)[:-len(".mutant")]
        self.file = self.tests = self.expect = None
        self.timeout = 600
        self.find = self.replace = None
        section, blocks = None, {"find": [], "replace": []}
        for line in open(path).read().split("\n"):
            if line in ("--- find", "--- replace"):
                section = line[4:]
                continue
            if section:
                blocks[section].append(line)
            elif line.startswith("#") or not line.strip():
                continue
            else:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "file":
                    self.file = value
                elif key == "tests":
                    self.tests = shlex.split(value)
                elif key == "expect":
                    self.expect = value
                elif key == "timeout":
                    self.timeout = int(value)
                else:
                    sys.exit(f"{path}: unknown key '{key}' (expected file, tests, expect, timeout)")
        while blocks["replace"] and blocks["replace"][-1] == "":  # the file's final newline
            blocks["replace"].pop()
        while blocks["find"] and blocks["find"][-1] == "":
            blocks["find"].pop()
        self.find, self.replace = "\n".join(blocks["find"]), "\n".join(blocks["replace"])
        if not self.file or not self.tests or not self.find:
            sys.exit(f"{path}: needs file:, tests: and a '--- find' block")
        if self.find == self.replace:
            sys.exit(f"{path}: the replacement equals the find text")

    def anchor(self):
        """None when the find text occurs exactly once, else why not."""
        target = os.path.join(ROOT, self.file)
        if not os.path.exists(target):
            return f"{self.file} does not exist"
        n = open(target).read().count(self.find)
        return None if n == 1 else f"find text occurs {n} times in {self.file}"


class Restorer:
    """Holds the original text of the file being mutated; restore() puts it back (idempotent)."""
    def __init__(self):
        self.path = self.text = None

    def mutate(self, path, text, mutated):
        self.path, self.text = path, text
        with open(path, "w") as f:
            f.write(mutated)

    def restore(self):
        if self.path is not None:
            with open(self.path, "w") as f:
                f.write(self.text)
            self.path = self.text = None


def build(build_dir, log):
    p = subprocess.run(["cmake", "--build", build_dir, "-j2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    open(log, "w").write(p.stdout)
    return p.returncode == 0


def run_tests(build_dir, mutant, log):
    """(failed test names, ctest's output); a per-test timeout counts as a failure."""
    cmd = ["ctest", "--test-dir", build_dir, "--output-on-failure", "--stop-on-failure",
           "--timeout", str(mutant.timeout)] + mutant.tests
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    CHILDREN.append(p)
    try:
        out, _ = p.communicate(timeout=mutant.timeout + 60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        open(log, "w").write(out)
        return ["(ctest killed after %d s)" % (mutant.timeout + 60)], out
    finally:
        CHILDREN.remove(p)
    open(log, "w").write(out)
    failed = re.findall(r"^\s*\d+ - (\S+) \(", out.split("The following tests FAILED:")[-1], re.M) \
        if "The following tests FAILED:" in out else []
    if not failed and p.returncode != 0:
        failed = [f"(ctest exit {p.returncode})"]
    if "No tests were found" in out:
        return None, out
    return failed, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-mutants"))
    ap.add_argument("--only", action="append", default=[], help="run only this mutant (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the mutants, whether each anchors, and their tests; run nothing")
    args = ap.parse_args()

    paths = sorted(glob.glob(os.path.join(ROOT, "tests", "mutants", "*.mutant")))
    mutants = [Mutant(p) for p in paths]
    if args.only:
        unknown = set(args.only) - {m.name for m in mutants}
        if unknown:
            sys.exit(f"mutants.py: no such mutant: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name:40s} {m.file:32s} {m.anchor() or 'anchored'}: {' '.join(m.tests)}")
        return 0

    restorer = Restorer()

    def on_signal(signum, frame):
        for p in CHILDREN:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        restorer.restore()
        print(f"\nmutants.py: signal {signum}: source restored", file=sys.stderr)
        sys.exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    logs = os.path.join(args.build, "mutants-logs")
    os.makedirs(logs, exist_ok=True)
    if not build(args.build, os.path.join(logs, "baseline.build.log")):
        sys.exit(f"mutants.py: the unmutated tree does not build (see {logs}/baseline.build.log)")

    rows, bad, t_all = [], 0, time.time()
    for m in mutants:
        t0 = time.time()
        why = m.anchor()
        if why:
            rows.append((m.name, "STALE", why, 0.0))
            bad += 1
            continue
        target = os.path.join(ROOT, m.file)
        text = open(target).read()
        try:
            restorer.mutate(target, text, text.replace(m.find, m.replace))
            if not build(args.build, os.path.join(logs, m.name + ".build.log")):
                verdict, detail = "BUILD FAILED", f"see {logs}/{m.name}.build.log"
            else:
                failed, _ = run_tests(args.build, m, os.path.join(logs, m.name + ".ctest.log"))
                if failed is None:
                    verdict, detail = "STALE", f"no test matches: {' '.join(m.tests)}"
                elif failed:
                    verdict, detail = "caught", ", ".join(failed)
                else:
                    verdict = "NOT CAUGHT"
                    detail = f"expected: {m.expect}" if m.expect else f"ran: {' '.join(m.tests)}"
        finally:
            restorer.restore()
        if verdict != "caught":
            bad += 1
        rows.append((m.name, verdict, detail, time.time() - t0))
        print(f"  {m.name}: {verdict} ({time.time() - t0:.0f} s)", flush=True)
    build(args.build, os.path.join(logs, "final.build.log"))  # leave the build dir matching the tree

    print()
    print(f"| mutant | file | result | caught by / why | s |")
    print(f"|---|---|---|---|---|")
    files = {m.name: m.file for m in mutants}
    for name, verdict, detail, secs in rows:
        print(f"| {name} | {files[name]} | {verdict} | {detail} | {secs:.0f} |")
    print(f"\n{len(rows) - bad} of {len(rows)} mutants caught in {time.time() - t_all:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
