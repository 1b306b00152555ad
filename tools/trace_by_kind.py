#!/usr/bin/env python3
"""Predicted against measured time per op kind (docs/planner.md, "A picture of the step").

  python3 tools/trace_by_kind.py PLAN.json MEASURED.rank0.json [MEASURED.rank1.json ...]

PLAN.json is what `gtrain --plan --trace` wrote, the others what `log.trace` wrote. For each op name
of the compute track (matrix products apart by their FLOPs per call, which name the GEMM shape), the
waits and the step's fixed costs between ops, it prints the calls per step of the prediction, the
predicted milliseconds per step, the measured ones (the median over every recorded step of every
file) and measured / predicted; then the same by group (matmul, attention, memory-bound, the step's
own kernels, waits and the rest, the gaps between ops), each with its share of the step. A load on
the host slows every group alike, so the groups' ratios set beside one another tell a kernel the
model prices wrongly from a step the host slowed.

A measured op is given the FLOPs of the prediction's call of that name at the same place in the
step (the k-th matmul_forward of a step is the prediction's k-th).

--calls adds, per op kind, how measured / predicted spreads over the single calls (the k-th call of a
name in each recorded step against the prediction's k-th; names whose calls per step differ from the
prediction's, as AdamW's per tensor, are left out): the 10th, 50th and 90th percentile. A kernel the
model prices wrongly has its calls' ratios tight around a value away from 1; a host's load widens them.
"""
import argparse
import collections
import json
import statistics
import sys

STEP_KERNELS = {"sumsq", "adamw", "to_working", "scale"}
OTHER = {"zero", "copy", "copy_to_host", "copy_to_device", "synchronize"}
GROUPS = ("matmul", "attention", "memory-bound", "step kernels", "waits and other", "gaps between ops")


def events(path):
    with open(path) as f:
        d = json.load(f)
    if not isinstance(d, dict) or not isinstance(d.get("traceEvents"), list):
        sys.exit(f"{path}: not a Chrome trace of gtrain (expected an object with traceEvents)")
    return [e for e in d["traceEvents"] if e.get("ph") == "X"]


def group(name):
    if name.startswith("matmul"):
        return "matmul"
    if name.startswith("attention"):
        return "attention"
    if name in STEP_KERNELS:
        return "step kernels"
    if name.startswith("wait") or name in OTHER:
        return "waits and other"
    return "memory-bound"


def compute_events(ev, t0, t1):
    return [e for e in ev if e.get("tid") == 1 and e.get("cat") in ("op", "wait") and t0 <= e["ts"] < t1]


def kinds(ops, flops_of):
    """ms by kind of one step's compute events; flops_of(name, k) gives the k-th call's FLOPs"""
    seen, out = collections.Counter(), collections.Counter()
    for e in ops:
        n = e["name"]
        k = n
        if n.startswith("matmul"):
            k = "%s %.1f MFLOP" % (n, flops_of(n, seen[n]) / 1e6)
        seen[n] += 1
        out[k] += e["dur"] / 1e3
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("measured", nargs="+")
    ap.add_argument("--calls", action="store_true", help="the spread of measured / predicted over single calls")
    a = ap.parse_args()
    plan = events(a.plan)
    psteps = [e for e in plan if e["name"] == "step"]
    if len(psteps) != 1:
        sys.exit(f"{a.plan}: not a predicted step (expected one step event, found {len(psteps)})")
    pstep = psteps[0]
    pops = compute_events(plan, pstep["ts"], pstep["ts"] + pstep["dur"] + 1e-6)
    calls = collections.defaultdict(list)
    for e in pops:
        calls[e["name"]].append(e.get("args", {}).get("flops", 0))

    def flops_of(name, k):
        return calls[name][k] if k < len(calls[name]) else 0

    pred = kinds(pops, flops_of)
    pcount = kinds([dict(e, dur=1e3) for e in pops], flops_of)
    pred_step = pstep["dur"] / 1e3
    meas, meas_steps, gaps = collections.defaultdict(list), [], []
    per_call = collections.defaultdict(list)  # kind -> measured / predicted of single calls
    pdur = collections.defaultdict(list)
    for e in pops:
        pdur[e["name"]].append(e["dur"])
    for path in a.measured:
        ev = events(path)
        steps = [e for e in ev if e["name"] == "step"]
        if not steps:
            print(f"{path}: no recorded step", file=sys.stderr)
        for s in steps:
            ops = compute_events(ev, s["ts"], s["ts"] + s["dur"] + 1e-6)
            k = kinds(ops, flops_of)
            for name in set(k) | set(pred):
                meas[name].append(k.get(name, 0.0))
            meas_steps.append(s["dur"] / 1e3)
            by_name = collections.defaultdict(list)
            for e in ops:
                by_name[e["name"]].append(e)
            for n, es in by_name.items():
                if len(es) != len(pdur.get(n, ())):
                    continue
                for j, e in enumerate(es):
                    if pdur[n][j] > 0:
                        kk = "%s %.1f MFLOP" % (n, flops_of(n, j) / 1e6) if n.startswith("matmul") else n
                        per_call[kk].append(e["dur"] / pdur[n][j])
            gaps.append(s["dur"] / 1e3 - sum(e["dur"] for e in ops) / 1e3)
    if not meas_steps:
        sys.exit("no measured step in the files given")
    med = {k: statistics.median(v) for k, v in meas.items()}
    mstep = statistics.median(meas_steps)

    def ratio(m, p):
        return "%7.2f" % (m / p) if p > 0 else "      -"

    print("%-36s %6s %10s %10s %7s" % ("op", "calls", "pred ms", "meas ms", "ratio"))
    for k in sorted(med, key=lambda k: -med[k]):
        print("%-36s %6d %10.3f %10.3f %s" % (k, pcount.get(k, 0), pred.get(k, 0), med[k], ratio(med[k], pred.get(k, 0))))
    print("%-36s %6s %10.3f %10.3f %s" % ("step", "", pred_step, mstep, ratio(mstep, pred_step)))
    print()
    pg, mg = collections.Counter(), collections.Counter()
    for k, v in pred.items():
        pg[group(k)] += v
    for k, v in med.items():
        mg[group(k)] += v
    pgap = pred_step - sum(pred.values())
    pg["gaps between ops"] = pgap if pgap > 1e-6 else 0.0  # the sum's rounding is no gap
    mg["gaps between ops"] = statistics.median(gaps)
    print("%-18s %10s %6s %10s %6s %7s" % ("group", "pred ms", "share", "meas ms", "share", "ratio"))
    for g in GROUPS:
        print("%-18s %10.3f %5.1f%% %10.3f %5.1f%% %s" % (g, pg[g], 100 * pg[g] / pred_step if pred_step else 0,
                                                        mg[g], 100 * mg[g] / mstep if mstep else 0, ratio(mg[g], pg[g])))
    print("(measured: the median of %d recorded steps over %d file(s))" % (len(meas_steps), len(a.measured)))
    if a.calls:
        print()
        print("%-36s %6s %7s %7s %7s" % ("measured / predicted per call", "calls", "p10", "median", "p90"))
        for k in sorted(per_call, key=lambda k: -med.get(k, 0)):
            v = sorted(per_call[k])
            n = len(v)
            print("%-36s %6d %7.2f %7.2f %7.2f" % (k, n, v[n // 10], v[n // 2], v[min(n - 1, 9 * n // 10)]))


if __name__ == "__main__":
    main()
