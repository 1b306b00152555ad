#!/usr/bin/env python3
"""Lays a predicted step beside measured ones in one Chrome trace (docs/planner.md, "A picture of the
step").

  python3 tools/trace_side_by_side.py PLAN.json MEASURED.rank0.json [MEASURED.rank1.json ...] -o OUT.json

PLAN.json is what `gtrain --plan --trace` wrote, the others what `log.trace` wrote. OUT.json holds
every measured event as it was, and under pid 1000 + R ("rank R (predicted)") a copy of the predicted
step at the start of each measured step of rank R, so that Perfetto or chrome://tracing shows each
op's prediction under its measurement.
"""
import argparse
import json
import sys

PREDICTED_PID = 1000


def events(path):
    with open(path) as f:
        d = json.load(f)
    if not isinstance(d, dict) or not isinstance(d.get("traceEvents"), list):
        sys.exit(f"{path}: not a Chrome trace of gtrain (expected an object with traceEvents)")
    return d["traceEvents"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("measured", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    plan = [e for e in events(a.plan) if e.get("ph") == "X"]
    out = []
    for path in a.measured:
        ev = events(path)
        out.extend(ev)
        steps = [e for e in ev if e.get("ph") == "X" and e.get("name") == "step"]
        if not steps:
            print(f"{path}: no recorded step (log.trace_first..log.trace_last outside the run?)", file=sys.stderr)
            continue
        rank = steps[0]["pid"]
        pid = PREDICTED_PID + rank
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"name": f"rank {rank} (predicted)"}})
        for tid, name in ((1, "compute"), (2, "communication")):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        for s in steps:
            for e in plan:
                c = dict(e, pid=pid, ts=e["ts"] + s["ts"], args=dict(e.get("args", {})))
                c["args"]["step"] = s["args"]["step"]
                out.append(c)
    with open(a.out, "w") as f:
        json.dump({"displayTimeUnit": "ms", "traceEvents": out}, f)


if __name__ == "__main__":
    main()
