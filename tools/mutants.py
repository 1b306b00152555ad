#!/usr/bin/env python3
"""The mutation harness (tools/mutants.sh runs it; docs/testing.md): puts each curated bug of
tests/mutants/*.mutant into a copy of the source tree, one at a time, rebuilds that copy's build
incrementally, runs the tests the mutant names and prints one table, mutant -> the test that caught it,
or NOT CAUGHT. With --jobs N, N copies (BUILD/tree-K, built in BUILD/build-K) take the mutants in turn:
the checkout it runs from is never edited.

A mutant file (standard library parsing, no patch tool, so a mutant survives code moving around):

    # free text: the bug, and what a user would lose
    file: src/core/optim.c
    tests: -R ^optim_cosine_matches_torch_adamw$      (ctest arguments that select the catching tests)
    expect: optim_cosine_matches_torch_adamw          (optional: the test expected to catch it, if it is
                                                       not on this branch yet; reported, not required)
    timeout: 300                                      (optional, seconds for the whole ctest run)
    needs: bf16-units                                 (optional: the catching tests can only tell on a CPU
                                                       with bf16 instructions, which `gtrain --version`
                                                       names; elsewhere the mutant is SKIPPED, said so in
                                                       the table and the count, and not a failure)
    --- find
    <lines that must occur exactly once in file>
    --- replace
    <their replacement>

A find text that is missing or occurs more than once makes the mutant STALE (re-anchor it after the code
moved). Every mutated file of a copy is restored byte for byte after its run (and a copy is brought in
line with the checkout at each start: files whose bytes did not change keep their times, so the builds
stay incremental). Exit 1 on any NOT CAUGHT, STALE or BUILD FAILED mutant (a mutant must compile: it
models a bug that would ship).
"""
import argparse
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import shutil
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILDREN = []  # the ctest run in flight (its own process group), ended on Ctrl-C


class Mutant:
    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)[:-len(".mutant")]
        self.file = self.tests = self.expect = self.needs = None
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
                elif key == "needs" and value == "bf16-units":
                    self.needs = value
                else:
                    sys.exit(f"{path}: unknown key '{key}: {value}' (expected file, tests, expect, timeout, "
                             "needs: bf16-units)")
        while blocks["replace"] and blocks["replace"][-1] == "":  # the file's final newline
            blocks["replace"].pop()
        while blocks["find"] and blocks["find"][-1] == "":
            blocks["find"].pop()
        self.find, self.replace = "\n".join(blocks["find"]), "\n".join(blocks["replace"])
        if not self.file or not self.tests or not self.find:
            sys.exit(f"{path}: needs file:, tests: and a '--- find' block")
        if self.find == self.replace:
            sys.exit(f"{path}: the replacement equals the find text")

    def anchor(self, root=ROOT):
        """None when the find text occurs exactly once in root's copy of the file, else why not."""
        target = os.path.join(root, self.file)
        if not os.path.exists(target):
            return f"{self.file} does not exist"
        n = open(target).read().count(self.find)
        return None if n == 1 else f"find text occurs {n} times in {self.file}"


def source_files():
    """The checkout's files: tracked (as they are now in the work tree) and untracked but not ignored."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True).stdout
        return sorted({f for f in out.decode().split("\0") if f and os.path.isfile(os.path.join(ROOT, f))})
    except (OSError, subprocess.CalledProcessError):
        sys.exit("mutants.py: needs a git checkout (git ls-files names the files to copy)")


def sync_tree(files, dst):
    """dst becomes a copy of the checkout's files; a file whose bytes are unchanged is left alone (its
    time too), one no longer in the checkout is removed."""
    want = set(files)
    for f in files:
        src, out = os.path.join(ROOT, f), os.path.join(dst, f)
        data = open(src, "rb").read()
        if os.path.isfile(out) and open(out, "rb").read() == data:
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as g:
            g.write(data)
        shutil.copymode(src, out)
    for base, _, names in os.walk(dst):
        for n in names:
            rel = os.path.relpath(os.path.join(base, n), dst)
            if rel not in want:
                os.remove(os.path.join(base, n))


def build(build_dir, log, jobs, targets=None):
    cmd = ["cmake", "--build", build_dir, f"-j{jobs}"] + (["--target"] + targets if targets else [])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    open(log, "w").write(p.stdout)
    return p.returncode == 0


def known_targets(build_dir):
    p = subprocess.run(["cmake", "--build", build_dir, "--target", "help"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return set(re.findall(r"^\.\.\. (\S+)", p.stdout, re.M))


def selected_tests(build_dir, mutant):
    """ctest's description of the tests the mutant selects (and the fixtures they require), or None
    when ctest does not give one."""
    p = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1"] + mutant.tests,
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        return json.loads(p.stdout).get("tests", [])
    except ValueError:
        return None


def targets_of(build_dir, tests, known):
    """The build targets the selected tests (selected_tests) run: every executable of
    this build a test's command names, anywhere in an argument (a cmake -DCMD=a|b list too), plus
    gtrain, gtrain-prep and gtrain-sample, which scripts also find beside each other. None (build everything) when a
    command names the build directory itself (a script that picks its own binaries from it), or an
    executable that is not a target of its own name. A target not built stays as the last build left
    it, and no test of this mutant runs it; the next mutant whose tests do run it builds it first."""
    if tests is None:
        return None
    roots = {os.path.realpath(build_dir), os.path.abspath(build_dir)}
    want, found = {"gtrain", "gtrain-prep", "gtrain-sample"} & known, False
    for t in tests:
        for arg in t.get("command", []):
            for root, path in ((r, q) for r in roots for q in re.findall(re.escape(r) + r"[^|;=\s]*", arg)):
                path = path.rstrip("/")
                if path == root:
                    return None
                if os.path.isfile(path) and os.access(path, os.X_OK):
                    found = True
                    name = os.path.basename(path)
                    if name not in known:
                        return None
                    want.add(name)
    return sorted(want) if tests and found else None  # no executable of the build seen: build all


def runs_alone(tests):
    """Whether a test the mutant selects is RUN_SERIAL or labelled cluster or slurm (a test cluster, Slurm
    daemons, every core): such a mutant runs while no other does."""
    if tests is None:
        return True
    for t in tests:
        props = {q["name"]: q["value"] for q in t.get("properties", [])}
        if props.get("RUN_SERIAL") or {"cluster", "slurm"} & set(props.get("LABELS", [])):
            return True
    return False


def has_bf16_units(build_dir):
    """Whether this CPU has the bf16 instructions precision = auto takes bf16 on (gtrain --version says)."""
    p = subprocess.run([os.path.join(build_dir, "gtrain"), "--version"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    return "precision = auto takes bf16 on this CPU" in p.stdout


def run_tests(build_dir, mutant, log):
    """(failed test names, ctest's output); a per-test timeout counts as a failure."""
    cmd = ["ctest", "--test-dir", build_dir, "--output-on-failure", "--stop-on-failure",
           "--timeout", str(mutant.timeout)] + mutant.tests
    # GTRAIN_MUTANTS_FAIL_FAST: a test of several runs or cases that honours it stops at its first failure
    # (tests/optim/optim_vs_reference.py, tests/scripts/sbatch_stops.sh): a mutant needs one
    env = dict(os.environ, GTRAIN_MUTANTS_FAIL_FAST="1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env=env)
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
    ap.add_argument("--configure", default="-DCMAKE_BUILD_TYPE=Release -DGTRAIN_CUDA=OFF",
                    help="cmake arguments of each copy's build (one string)")
    ap.add_argument("--jobs", type=int, default=1, help="copies of the tree that run mutants side by side")
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

    def on_signal(signum, frame):
        for p in list(CHILDREN):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        print(f"\nmutants.py: signal {signum} (the checkout was not edited; each copy is brought back in line "
              f"at the next start)", file=sys.stderr)
        os._exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    jobs = max(1, min(args.jobs, len(mutants) or 1))
    make_jobs = max(1, (os.cpu_count() or 1) // jobs)
    logs = os.path.join(args.build, "mutants-logs")
    os.makedirs(logs, exist_ok=True)
    files = source_files()
    trees = [os.path.join(args.build, f"tree-{k}") for k in range(jobs)]
    builds = [os.path.join(args.build, f"build-{k}") for k in range(jobs)]
    t_all = time.time()

    def prepare(k):
        sync_tree(files, trees[k])
        log = os.path.join(logs, f"baseline-{k}.build.log")
        p = subprocess.run(["cmake", "-S", trees[k], "-B", builds[k]] + shlex.split(args.configure),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        open(log, "w").write(p.stdout)
        return p.returncode == 0 and build(builds[k], log + ".build", make_jobs)

    ready = [False] * jobs
    threads = [threading.Thread(target=lambda k=k: ready.__setitem__(k, prepare(k))) for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not all(ready):
        sys.exit(f"mutants.py: the unmutated tree does not build (see {logs}/baseline-*.build.log*)")
    print(f"mutants.py: {jobs} cop{'y' if jobs == 1 else 'ies'} of the tree built in {time.time() - t_all:.0f} s",
          flush=True)

    rows = [None] * len(mutants)
    lock = threading.Lock()
    selected = [selected_tests(builds[0], m) for m in mutants]
    alone = [runs_alone(t) for t in selected]
    known = known_targets(builds[0])
    bf16_units = has_bf16_units(builds[0])
    targets = [targets_of(builds[0], t, known) for t in selected]
    print(f"mutants.py: {sum(t is not None for t in targets)} of {len(mutants)} mutants rebuild only the targets "
          "their tests run", flush=True)
    queue = [i for i in range(len(mutants)) if not alone[i]]

    def work(k):
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop(0)
            m, t0 = mutants[i], time.time()
            why = m.anchor(trees[k])
            if why:
                rows[i] = (m.name, "STALE", why, 0.0)
                continue
            if m.needs == "bf16-units" and not bf16_units:
                rows[i] = (m.name, "SKIPPED", "needs a CPU with bf16 instructions; this one has none", 0.0)
                with lock:
                    print(f"  {m.name}: SKIPPED (no bf16 instructions here)", flush=True)
                continue
            target = os.path.join(trees[k], m.file)
            text = open(target).read()
            try:
                with open(target, "w") as f:
                    f.write(text.replace(m.find, m.replace))
                if not build(builds[k], os.path.join(logs, m.name + ".build.log"), make_jobs, targets[i]):
                    verdict, detail = "BUILD FAILED", f"see {logs}/{m.name}.build.log"
                else:
                    failed, _ = run_tests(builds[k], m, os.path.join(logs, m.name + ".ctest.log"))
                    if failed is None:
                        verdict, detail = "STALE", f"no test matches: {' '.join(m.tests)}"
                    elif failed:
                        verdict, detail = "caught", ", ".join(failed)
                    else:
                        verdict = "NOT CAUGHT"
                        detail = f"expected: {m.expect}" if m.expect else f"ran: {' '.join(m.tests)}"
            finally:
                with open(target, "w") as f:
                    f.write(text)
            rows[i] = (m.name, verdict, detail, time.time() - t0)
            with lock:
                print(f"  {m.name}: {verdict} ({time.time() - t0:.0f} s)", flush=True)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue = [i for i in range(len(mutants)) if alone[i]]  # then those that run alone, one by one
    work(0)
    for k in range(jobs):  # leave each build matching its (restored) tree
        build(builds[k], os.path.join(logs, f"final-{k}.build.log"), make_jobs)

    print()
    print("| mutant | file | result | caught by / why | s |")
    print("|---|---|---|---|---|")
    files_of = {m.name: m.file for m in mutants}
    bad = skipped = 0
    for name, verdict, detail, secs in rows:
        bad += verdict not in ("caught", "SKIPPED")
        skipped += verdict == "SKIPPED"
        print(f"| {name} | {files_of[name]} | {verdict} | {detail} | {secs:.0f} |")
    print(f"\n{len(rows) - bad - skipped} of {len(rows)} mutants caught in {time.time() - t_all:.0f} s ({jobs} at a time)"
          + (f"; {skipped} skipped: their tests need bf16 instructions, which this CPU lacks" if skipped else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
