#!/usr/bin/env python3
"""flight_recorder.py — reads every rank's flight recorder (DIR/flight_NNNNN, written by
src/dist/watchdog.c; the layout is in src/dist/watchdog.h) and says where the ranks diverge.

    python3 tools/flight_recorder.py CHECKPOINT_DIR/.watchdog [--last N]

DIR is checkpoint.dir/.watchdog (or /dev/shm/gtrain-watchdog-* for a run without checkpoint.dir).
It prints, per rank, the newest operation it started and whether it completed, then one line per
rank that is behind: the first operation (sequence number) the most advanced rank started and it did
not. --last N also lists each rank's N newest operations. Standard library only.

When the watchdog ended the job, DIR/verdict is there, and the rings are read as they were at that
moment (the file's modification time): the launcher then ends the other ranks, and a stopped rank,
sent SIGCONT and SIGTERM on the way, may still run a few operations against ranks already gone.
"""
import argparse
import glob
import os
import struct
import sys

HEADER = struct.Struct("<16sIii36x")
ENTRY = struct.Struct("<QQddii24s")
STATES = {0: "empty", 1: "in flight", 2: "done"}


def read_ring(path, cutoff):
    with open(path, "rb") as f:
        data = f.read()
    magic, entries, rank, pid = HEADER.unpack_from(data, 0)
    if magic.rstrip(b"\0") != b"gtrain-flight 1":
        raise ValueError(f"{path}: not a gtrain flight recorder file (magic {magic!r})")
    ops = []
    for i in range(entries):
        off = HEADER.size + i * ENTRY.size
        if off + ENTRY.size > len(data):
            break
        seq, nbytes, t_issue, t_done, step, state, op = ENTRY.unpack_from(data, off)
        if state == 0 or t_issue > cutoff:
            continue
        if t_done > cutoff:
            state, t_done = 1, 0.0
        ops.append(dict(seq=seq, bytes=nbytes, t_issue=t_issue, t_done=t_done, step=step,
                        state=state, op=op.split(b"\0")[0].decode(errors="replace")))
    ops.sort(key=lambda o: o["seq"])
    return rank, pid, ops


def describe(o):
    what = f"{o['op']} #{o['seq']} ({o['bytes']} bytes, step {o['step']})"
    if o["state"] == 2:
        return f"{what}, done in {1e3 * (o['t_done'] - o['t_issue']):.2f} ms"
    return f"{what}, in flight"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--last", type=int, default=0)
    args = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(args.dir, "flight_*")))
    if not paths:
        print(f"flight_recorder: no flight_* files in {args.dir}", file=sys.stderr)
        return 2
    verdict = os.path.join(args.dir, "verdict")
    cutoff = os.stat(verdict).st_mtime if os.path.exists(verdict) else float("inf")
    if cutoff != float("inf"):
        print(f"as at the watchdog's verdict ({verdict})")
    ranks = {}
    for p in paths:
        try:
            rank, pid, ops = read_ring(p, cutoff)
        except (OSError, ValueError, struct.error) as e:
            print(f"flight_recorder: {e}", file=sys.stderr)
            return 2
        ranks[rank] = (pid, ops)
    newest = {r: (ops[-1] if ops else None) for r, (pid, ops) in ranks.items()}
    most = max((o["seq"] for o in newest.values() if o), default=0)
    leader = next(r for r, o in sorted(newest.items()) if o and o["seq"] == most) if most else None
    for r in sorted(ranks):
        pid, ops = ranks[r]
        o = newest[r]
        print(f"rank {r} (pid {pid}): {len(ops)} operations recorded; newest: {describe(o) if o else 'none'}")
        for e in ops[-args.last:] if args.last else []:
            print(f"    {describe(e)}")
    behind = [r for r, o in sorted(newest.items()) if (o["seq"] if o else 0) < most]
    if not behind:
        stuck = [r for r, o in sorted(newest.items()) if o and o["state"] == 1]
        print(f"no rank is behind: every rank started operation #{most}"
              + (f"; still in flight on {', '.join(f'rank {r}' for r in stuck)}" if stuck else ""))
        return 0
    lead_ops = {o["seq"]: o for o in ranks[leader][1]}
    for r in behind:
        o = newest[r]
        first = (o["seq"] if o else 0) + 1
        missing = lead_ops.get(first)
        at = describe(missing) if missing else f"#{first}"
        print(f"rank {r} is behind: rank {leader} started {at}, rank {r} never did; "
              f"its newest operation is {describe(o) if o else 'none'}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
