#!/usr/bin/env python3
"""goodput_table.py — the table of bench/goodput.sh, from its work directory.

    python3 bench/goodput_table.py WORKDIR

WORKDIR holds faults.tsv (one row per fault), summary.txt (wall, kept, final_rc, first_start),
metrics_K.jsonl and run_K.log of each start K (with goodput.sh -c, the part of the job's output from
the batch script's "start K" line, and the metrics file that start wrote). Goodput = steps kept x fault-free step time / wall
time, the fault-free step time being the median step_ms of every step but each start's first (it
pays for allocation). Where the wall time went is summed from what the logs say happened, each
second counted once: the steps as they were timed, the saves, the time from a fault to the job's
end less the save made in it (a preemption saves), the time from a (re)start to its first step less
that step; the rest is what none of these covers (the final stop's wait, MPI start and exit).
Asynchronous saves count with the time they blocked the loop (their write overlaps the steps).
With checkpoint.every = auto (goodput.sh -a) the table gains a column: the interval in force when the
fault came (the last choice its start printed), and one line per start gives each start's first choice.
Standard library only.
"""
import glob
import json
import os
import re
import statistics
import sys


def lines_of(path):
    with open(path) as f:
        return [json.loads(l) for l in f if '"loss"' in l]


def main():
    work = sys.argv[1]
    os.chdir(work)
    summary = dict(l.strip().split("=", 1) for l in open("summary.txt") if "=" in l)
    wall, kept = float(summary["wall"]), int(summary["kept"])
    rows = [l.rstrip("\n").split("\t") for l in open("faults.tsv")][1:]
    starts = sorted(glob.glob("metrics_*.jsonl"), key=lambda p: int(re.findall(r"\d+", p)[0]))
    per_start = [[l["step_ms"] / 1e3 for l in lines_of(p)] for p in starts]
    steady = [s for st in per_start for s in st[1:]]
    step_s = statistics.median(steady)
    all_steps = sum(s for st in per_start for s in st)
    save_re = re.compile(r"saved \S+: [0-9.]+ GB in ([0-9.]+) s")
    async_re = re.compile(r"saved \S+ \(.*written in the background .*the loop was blocked ([0-9.]+) ms")
    auto_re = re.compile(r"checkpoint\.every = auto: (?:now )?a save every (\d+) steps \(([^)]*)\)(.*)$", re.M)
    saves, saves_in_stop, auto_last, auto_first = [], {}, {}, {}
    for k in range(1, len(starts) + 1):
        text = open(f"run_{k}.log").read()
        saves += [float(m) for m in save_re.findall(text)]
        saves += [float(m) / 1e3 for m in async_re.findall(text)]
        chosen = auto_re.findall(text)
        if chosen:
            auto_last[k] = chosen[-1][0]
            cost = re.search(r"save cost ([0-9.e+-]+ s)", chosen[0][2])
            mtbf = re.search(r"MTBF ([0-9.e+-]+ h \([^)]*\))", chosen[0][2])
            auto_first[k] = (f"{chosen[0][0]} steps ({chosen[0][1]}), save cost {cost.group(1) if cost else '?'}, "
                             f"MTBF {mtbf.group(1) if mtbf else '?'}; {len(chosen) - 1} change(s)")
        stop = text.find("got SIGTERM")
        saves_in_stop[k] = sum(float(m) for m in save_re.findall(text[stop:])) if stop >= 0 else 0.0
    auto = bool(auto_last)
    print("| # | fault | at (s) | rank | step at fault | detected after (s) | exit | restart to first step (s) "
          "| resumed from | steps redone |" + (" save every (steps, auto) |" if auto else ""))
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if auto else ""))
    for r in rows:
        print("| " + " | ".join(r) + " |" + (f" {auto_last.get(int(r[0]), '-')} |" if auto else ""))
    # fault n ended start n and was followed by start n + 1
    detect = sum(float(r[5]) - saves_in_stop.get(int(r[0]), 0.0) for r in rows)
    first_step = {k + 1: st[0] if st else 0.0 for k, st in enumerate(per_start)}
    restart = sum(float(r[7]) - first_step.get(int(r[0]) + 1, 0.0) for r in rows)
    first_start = float(summary["first_start"]) - first_step.get(1, 0.0)
    redone = sum(int(r[9]) for r in rows)
    rest = wall - all_steps - sum(saves) - detect - restart - first_start
    print()
    print(f"wall {wall:.0f} s; {len(rows)} faults; steps kept {kept} (the newest state file after the final "
          f"stop, exit {summary['final_rc']}); fault-free step {step_s:.3f} s (median of {len(steady)} steps)")
    print(f"goodput = {kept} x {step_s:.3f} / {wall:.0f} = {kept * step_s / wall:.3f}")
    print(f"where the wall time went: {sum(len(st) for st in per_start)} steps {all_steps:.0f} s as timed "
          f"({redone} of them redone); {len(saves)} saves {sum(saves):.0f} s (mean "
          f"{statistics.mean(saves) if saves else 0:.1f} s); fault to job end, less the saves in it, {detect:.0f} s; "
          f"(re)start to first step, less that step, {restart + first_start:.0f} s; rest {rest:.0f} s")
    for k in sorted(auto_first):
        print(f"checkpoint.every = auto, start {k}: {auto_first[k]}")


if __name__ == "__main__":
    main()
