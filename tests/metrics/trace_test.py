"""A picture of the step (src/core/trace.c): Chrome trace JSON of the predicted step (`gtrain --plan
--trace FILE`) and of the measured steps (`log.trace`), read with Python's json. Each scenario is one
CTest test (tests/metrics.cmake):

  plan       the tiny model, ZeRO-3 on 2 ranks (--world 2), grad_accum 2: the file parses; every
             event is a complete ("X") or metadata ("M") event of pid 0 on tid 1 (compute) or 2
             (communication); one "step" whose duration is the printed predicted step (to its 0.1 ms)
             holds both micro-batches, each the same number of ops, every op and wait within the step;
             no two ops, waits or collectives of one tid overlap; tools/trace_by_kind.py on the
             prediction against itself gives each kind its calls and milliseconds and a ratio of 1.00;
             a --trace path that is a directory is exit 2 with one line on stderr
  measured   2 ranks, 4 steps, log.trace_first = 2, log.trace_last = 3, a save at step 3: one file per
             rank (FILE.rankN.json), each valid JSON with pid = its rank; "step" events for steps 2 and 3
             only, every op, wait, collective and micro-batch within the step its args name (and none of
             step 1 or 4), grad_accum micro-batches per step, the same op names as the prediction's
             and its collectives with the same names and bytes,
             ops on tid 1 never overlapping; rank 0's waits of a step, less the loss's scalar all-reduce,
             are the metrics' comm_exposed_ms; the save of step 3 drawn after its step; a log.trace below a
             regular file is exit 2 on both ranks with one line naming [log] trace, before step 1;
             tools/trace_side_by_side.py lays the prediction at the start of each measured step

Exit status: 0 pass, 1 fail (with the reason).
"""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import testlib  # noqa: E402
from testlib import TINY_MODEL, check, word_corpus  # noqa: E402

ARGS = None

CONFIG = TINY_MODEL + """[train]
seq_len = 32
micro_batch = 2
grad_accum = 2
steps = 4
warmup_steps = 1
seed = 5
[data]
train = {prefix}.train.bin
val =
[dist]
shard = parameters
grad_sync = micro
prefetch = 1
[checkpoint]
dir = {work}/ck
every = 3
[log]
every = 100
trace = {work}/out/run.json
trace_first = 2
trace_last = 3
"""


def setup(work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prefix = word_corpus(ARGS.prep, work, 3, ["trace", "event", "span", "step", "op", "the", "a"], 40_000)
    config = os.path.join(work, "tiny.ini")
    with open(config, "w") as f:
        f.write(CONFIG.format(prefix=prefix, work=work))
    return config


def run(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)


def load(path):
    with open(path) as f:
        d = json.load(f)
    check(isinstance(d.get("traceEvents"), list), f"{os.path.basename(path)}: an object with a traceEvents list")
    return d["traceEvents"]


EPS = 1e-3  # microseconds: the file's rounding


def inside(e, outer):
    return outer["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + EPS


def overlapping(events):
    """The first pair of events of one (pid, tid) that overlap, or None."""
    by = {}
    for e in events:
        by.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in by.values():
        evs.sort(key=lambda e: (e["ts"], e["dur"]))
        for a, b in zip(evs, evs[1:]):
            if b["ts"] < a["ts"] + a["dur"] - EPS:
                return a, b
    return None


def plan():
    work = ARGS.work
    config = setup(work)
    path = os.path.join(work, "plan.json")
    out = run([ARGS.gtrain, "--plan", "--world", "2", "--trace", path, config])
    check(out.returncode == 0, f"--plan --trace ends 0 ({out.returncode}: {out.stderr[-300:]})")
    m = re.search(r"^predicted step[^:]*: ([0-9.]+) ms", out.stdout, re.M)
    check(m, f"--plan prints the predicted step ({out.stdout[-300:]})")
    printed_ms = float(m.group(1))
    ev = load(path)
    check(all(e.get("ph") in ("X", "M") for e in ev), "only complete and metadata events")
    x = [e for e in ev if e["ph"] == "X"]
    check(all(e["pid"] == 0 and e["tid"] in (1, 2) for e in x), "pid 0 (rank 0), tid 1 compute or 2 communication")
    names = {(e["tid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    check(names == {(1, "compute"), (2, "communication")}, f"the tids are named compute and communication ({names})")
    steps = [e for e in x if e["name"] == "step"]
    check(len(steps) == 1, f"one step event ({len(steps)})")
    step = steps[0]
    check(abs(step["dur"] / 1e3 - printed_ms) <= 0.05 + 1e-9,
          f"the step's duration {step['dur'] / 1e3:.4f} ms is the printed prediction {printed_ms} ms")
    micro = [e for e in x if e["cat"] == "micro_batch"]
    check(sorted(e["args"]["micro"] for e in micro) == [0, 1] and all(inside(e, step) for e in micro),
          f"two micro-batches within the step ({[(e['ts'], e['dur']) for e in micro]})")
    ops = [e for e in x if e["cat"] == "op"]
    per = [sum(1 for e in ops if e["args"].get("micro") == m and inside(e, mb)) for m, mb in
           ((mb["args"]["micro"], mb) for mb in micro)]
    check(per[0] > 0 and per[0] == per[1], f"each micro-batch holds the same ops ({per})")
    check(all(inside(e, step) for e in x if e["cat"] in ("op", "wait", "collective")),
          "every op, wait and collective within the step")
    check(any(e["cat"] == "collective" for e in x) and any(e["name"] == "wait_all_gather_v" for e in x),
          "ZeRO-3 on 2 ranks: collectives, and compute waiting for a gather")
    check(all(e["args"].get("flops", 0) > 0 for e in ops if e["name"].startswith("matmul")),
          "matmuls carry their FLOPs")
    bad = overlapping([e for e in x if e["cat"] in ("op", "wait", "collective")])
    check(bad is None, f"no two ops, waits or collectives of one tid overlap ({bad})")
    # tools/trace_by_kind.py on the prediction against itself: every kind's calls and milliseconds
    # are the trace's own, each ratio 1.00
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools",
                        "trace_by_kind.py")
    t = subprocess.run([sys.executable, tool, path, path], capture_output=True, text=True)
    check(t.returncode == 0, f"trace_by_kind.py ends 0 ({t.stderr[-300:]})")
    rows = {}
    for ln in t.stdout.splitlines():
        f = ln.rsplit(None, 4)
        if len(f) == 5 and re.fullmatch(r"[0-9]+", f[1]):
            rows[f[0]] = (int(f[1]), float(f[2]), float(f[3]), f[4])
    fwd = [e for e in ops if e["name"] == "matmul_forward"]
    kind = "matmul_forward %.1f MFLOP" % (fwd[0]["args"]["flops"] / 1e6)
    n_kind = sum(1 for e in fwd if abs(e["args"]["flops"] - fwd[0]["args"]["flops"]) < 1)
    ms_kind = sum(e["dur"] for e in fwd if abs(e["args"]["flops"] - fwd[0]["args"]["flops"]) < 1) / 1e3
    check(kind in rows and rows[kind][0] == n_kind and abs(rows[kind][1] - ms_kind) < 2e-3,
          f"by kind: {kind} {n_kind} calls, {ms_kind:.3f} ms ({rows.get(kind)})")
    check(rows and all(r[3] == "1.00" for r in rows.values() if r[1] > 0),
          f"by kind: the prediction against itself, every ratio 1.00 ({t.stdout[-600:]})")
    os.makedirs(os.path.join(work, "adir"))
    out = run([ARGS.gtrain, "--plan", "--trace", os.path.join(work, "adir"), config])
    lines = out.stderr.strip().splitlines()
    check(out.returncode == 2 and len(lines) == 1 and "--trace" in lines[0] and "directory" in lines[0],
          f"--trace naming a directory: exit 2, one line ({out.returncode}: {out.stderr!r})")


def measured():
    work = ARGS.work
    config = setup(work)
    mpi = [ARGS.mpiexec] + ([ARGS.np_flag, "2"] if ARGS.np_flag else ["-n", "2"]) + ARGS.mpi_flags.split()
    out = run(mpi + [ARGS.gtrain, config, f"log.metrics={work}/metrics.jsonl"])
    check(out.returncode == 0, f"a 2-rank run with log.trace ends 0 ({out.returncode}: {out.stderr[-400:]})")
    metrics = {}
    with open(os.path.join(work, "metrics.jsonl")) as f:
        for line in f:
            o = json.loads(line)
            if "comm_exposed_ms" in o:
                metrics[o["step"]] = o
    pred = os.path.join(work, "plan.json")
    check(run([ARGS.gtrain, "--plan", "--world", "2", "--trace", pred, config]).returncode == 0, "--plan --trace")
    pred_ops = {e["name"] for e in load(pred) if e.get("cat") == "op"}
    pred_colls = {(e["name"], e["args"]["bytes"]) for e in load(pred) if e.get("cat") == "collective"}
    files = sorted(os.listdir(os.path.join(work, "out")))
    check(files == ["run.rank0.json", "run.rank1.json"], f"one file per rank ({files})")
    for rank in (0, 1):
        ev = load(os.path.join(work, "out", files[rank]))
        x = [e for e in ev if e["ph"] == "X"]
        check(x and all(e["pid"] == rank for e in ev), f"rank {rank}: pid {rank} throughout")
        steps = {e["args"]["step"]: e for e in x if e["name"] == "step"}
        check(sorted(steps) == [2, 3], f"rank {rank}: step events for steps 2 and 3 only ({sorted(steps)})")
        check(all(e["args"].get("step") in (2, 3) for e in x), f"rank {rank}: every event of step 2 or 3")
        for cat in ("op", "wait", "collective", "micro_batch"):
            evs = [e for e in x if e["cat"] == cat]
            check(evs, f"rank {rank}: {cat} events")
            out_of = [e for e in evs if not inside(e, steps[e["args"]["step"]])]
            check(not out_of, f"rank {rank}: every {cat} within its step ({out_of[:2]})")
        for s in (2, 3):
            n = sorted(e["args"]["micro"] for e in x if e["cat"] == "micro_batch" and e["args"]["step"] == s)
            check(n == [0, 1], f"rank {rank}: step {s} holds micro-batches 0 and 1 ({n})")
        if rank == 0:  # the waits are comm_exposed_ms, and the loss's scalar all-reduce it leaves out
            for s in (2, 3):
                waits = sorted((e for e in x if e["cat"] == "wait" and e["args"]["step"] == s), key=lambda e: e["ts"])
                loss = next(e for e in waits if e["name"] == "wait_all_reduce_scalar")
                drawn = (sum(e["dur"] for e in waits) - loss["dur"]) / 1e3
                check(abs(drawn - metrics[s]["comm_exposed_ms"]) < 0.01,
                      f"step {s}: the waits less the loss's all-reduce, {drawn:.4f} ms, are the metrics' "
                      f"comm_exposed_ms {metrics[s]['comm_exposed_ms']}")
                check(steps[s]["dur"] / 1e3 >= metrics[s]["step_ms"] - 0.01,
                      f"step {s}: the step event ({steps[s]['dur'] / 1e3:.3f} ms) holds the metrics' step_ms "
                      f"{metrics[s]['step_ms']}")
        ops = {e["name"] for e in x if e["cat"] == "op"}
        check(pred_ops <= ops, f"rank {rank}: every op name of the prediction is measured ({pred_ops - ops})")
        colls = {(e["name"], e["args"].get("bytes")) for e in x if e["cat"] == "collective"}
        check(pred_colls and pred_colls <= colls,
              f"rank {rank}: every collective of the prediction is measured, named and sized alike ({pred_colls - colls})")
        bad = overlapping([e for e in x if e["cat"] in ("op", "wait")])
        check(bad is None, f"rank {rank}: ops and waits of the compute tid do not overlap ({bad})")
        saves = [e for e in x if e["name"] == "save"]
        check(len(saves) == 1 and saves[0]["args"]["step"] == 3 and
              saves[0]["ts"] >= steps[3]["ts"] + steps[3]["dur"] - EPS,
              f"rank {rank}: the save of step 3 after its step ({saves})")
    # tools/trace_side_by_side.py: the prediction under pid 1000 at each measured step's start
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools",
                        "trace_side_by_side.py")
    both = os.path.join(work, "both.json")
    t = subprocess.run([sys.executable, tool, pred, os.path.join(work, "out", files[0]), "-o", both],
                       capture_output=True, text=True)
    check(t.returncode == 0, f"trace_side_by_side.py ends 0 ({t.stderr[-300:]})")
    ev = load(both)
    n_pred = sum(1 for e in load(pred) if e["ph"] == "X")
    side = [e for e in ev if e["ph"] == "X" and e["pid"] == 1000]
    mine = {e["args"]["step"]: e for e in ev if e["ph"] == "X" and e["pid"] == 0 and e["name"] == "step"}
    starts = {e["args"]["step"]: e["ts"] for e in side if e["name"] == "step"}
    check(len(side) == 2 * n_pred and all(abs(starts[s] - mine[s]["ts"]) < EPS for s in (2, 3)),
          f"side by side: the {n_pred} predicted events twice under pid 1000, each step at its measured start")
    blocker = os.path.join(work, "blocker")
    open(blocker, "w").close()
    out = run(mpi + [ARGS.gtrain, config, f"log.trace={blocker}/t.json", f"checkpoint.dir={work}/ck2"])
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("gtrain:")]
    check(out.returncode == 2 and len(lines) == 1 and ("[log] trace" in lines[0] or "log.trace=" in lines[0]),
          f"a log.trace below a regular file: exit 2, one line naming the key ({out.returncode}: {out.stderr[-400:]})")
    check(not re.search(r"^step 1\b", out.stdout, re.M), f"... before step 1 ({out.stdout[-200:]})")


SCENARIOS = {"plan": plan, "measured": measured}

if __name__ == "__main__":
    ARGS = testlib.scenario_args(SCENARIOS)
    SCENARIOS[ARGS.scenario]()
    print(f"PASS: {ARGS.scenario}, {testlib.CHECKS} checks")
