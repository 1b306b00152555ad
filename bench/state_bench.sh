#!/usr/bin/env bash
# state_bench.sh — training-state saves, collective (checkpoint.async = false) vs asynchronous
# (true), on one shape: configs/llama100m.ini with model.vocab_size=256, micro_batch 1,
# seq_len 256, 2 ranks on the CPU; a save every CKPT_EVERY steps.
#
#   bench/state_bench.sh [BUILD_DIR] [STEPS] [CKPT_EVERY] [RANKS]      (defaults: build 10 3 2)
#
# One training run per mode (the same seed and data), each under strace (the write calls only) so that
# the bytes that reach the state files are counted: "written" vs the files' size shows whether any
# byte is written twice. Then each mode's newest file is loaded by a run that has nothing left to
# train (gtrain's "resumed from ...: X GB read in Y s"; the file is still in the page cache). The
# disk's own rate is a plain write + fsync of the same number of bytes in the same directory
# (dd conv=fsync), measured in the same minutes. From the metrics (log.metrics):
#   blocked ms    save_blocking_ms of the save records: what the loop waited per save (sync: the
#                 whole save; async: the copy into the host buffer, plus any wait for a save still
#                 in flight, which the wait lines report)
#   write s, GB/s save_write_s / save_gb_per_s (sync: the collective write with fsync and rename;
#                 async: the slowest rank's write + fsync, in the background)
#   async_nice10  the asynchronous save with the writer thread at nice +10 / SCHED_BATCH
#                 (GTRAIN_SAVE_NICE=10) instead of the default normal priority: a writer that yields
#                 the cores to the compute threads, and how much longer its write then takes
#   step ms       step_ms of steps 2.. without a save in flight, and of the steps that ran while an
#                 asynchronous write was in flight (the steps after a save's start up to the step
#                 whose boundary published it). step_ms never includes the save itself.
# The numbers depend on the disk and on what else runs on the machine.
set -euo pipefail

BUILD=${1:-build}
STEPS=${2:-10}
EVERY=${3:-3}
NP=${4:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${GTRAIN_BENCH_DIR:-${TMPDIR:-/tmp}/gtrain-state-bench}
GTRAIN=$BUILD/gtrain
[ -x "$GTRAIN" ] || { echo "state_bench: $GTRAIN not found (build first; first argument = build dir)" >&2; exit 2; }
command -v strace > /dev/null || { echo "state_bench: strace is needed (apt-get install strace)" >&2; exit 2; }

mkdir -p "$WORK"
if [ ! -f "$WORK/corpus.train.bin" ]; then
    for i in $(seq 1 2000); do echo "training-state benchmark line $i: HDF5, Fletcher32, ZeRO-1, a writer thread"; done > "$WORK/corpus.txt"
    "$BUILD/gtrain-prep" --val-fraction 0 -o "$WORK/corpus" "$WORK/corpus.txt" > /dev/null
fi

run() { # mode(sync|async) tag resume(never|auto) [strace]
    local mode=$1 tag=$2 resume=$3 trace=${4:-}
    local async=true nice=0
    [ "$mode" = sync ] && async=false
    [ "$mode" = async_nice10 ] && nice=10
    local cmd=(env "GTRAIN_SAVE_NICE=$nice" mpiexec -n "$NP" --allow-run-as-root --oversubscribe "$GTRAIN" "$ROOT/configs/llama100m.ini"
               model.vocab_size=256 train.micro_batch=1 train.seq_len=256 train.grad_accum=1 "train.steps=$STEPS"
               train.device=cpu train.precision=fp32 "data.train=$WORK/corpus.train.bin" data.val= log.every=1
               "log.metrics=$WORK/$mode.metrics.jsonl" "checkpoint.dir=$WORK/ck_$mode" "checkpoint.every=$EVERY"
               checkpoint.keep=1 checkpoint.every_minutes=0 "checkpoint.async=$async" "checkpoint.resume=$resume")
    if [ -n "$trace" ]; then
        strace -f -y -qq --seccomp-bpf -o "$trace" -e trace=pwrite64,pwritev,pwritev2,write -e signal=none "${cmd[@]}" > "$WORK/$tag.log" 2>&1
    else
        "${cmd[@]}" > "$WORK/$tag.log" 2>&1
    fi || { cat "$WORK/$tag.log"; exit 1; }
}

for mode in sync async async_nice10; do
    rm -rf "$WORK/ck_$mode" "$WORK/$mode.metrics.jsonl"
    run "$mode" "train_$mode" never "$WORK/$mode.strace"
    run "$mode" "load_$mode" auto   # resumes at the end: only loads
done
# the disk's own rate for the same number of bytes, in the same directory
bytes=$(du -sb --apparent-size "$WORK/ck_sync/step_$(printf %08d "$STEPS").h5" | cut -f1)
dd_log=$(dd if=/dev/zero of="$WORK/dd.bin" bs=4M count=$(( (bytes + 4194303) / 4194304 )) conv=fsync 2>&1 | tail -1)
rm -f "$WORK/dd.bin"

python3 - "$WORK" "$STEPS" "$NP" "$dd_log" <<'EOF'
import json, os, re, statistics, sys
work, steps, ranks, dd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", dd)
dd_gbs = int(m.group(1)) / 1e9 / float(m.group(2)) if m else float("nan")

def written(trace, ckdir):
    """Bytes that pwrite64/pwritev/write put into the state files under ckdir, from the calls' results.
    With several threads strace splits a call into an <unfinished ...> line, which names the file,
    and a "<... resumed>" line with the result: they are paired by thread id."""
    total, pending = 0, {}
    for line in open(trace):
        tid = line.split(" ", 1)[0]
        r = re.search(r"= (\d+)$", line.strip())
        if "resumed>" in line:
            if pending.pop(tid, False) and r:
                total += int(r.group(1))
        elif line.rstrip().endswith("<unfinished ...>"):
            pending[tid] = f"<{ckdir}/step_" in line
        elif f"<{ckdir}/step_" in line and r:  # the state files, not the watchdog records or probes
            total += int(r.group(1))
    return total


def state_bytes(ckdir):
    total = 0
    for root, _, files in os.walk(ckdir):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total

rows = {}
for mode in ("sync", "async", "async_nice10"):
    recs = [json.loads(l) for l in open(f"{work}/{mode}.metrics.jsonl")]
    saves = [r for r in recs if "save_step" in r]
    step_recs = [r for r in recs if "loss" in r]
    # which steps ran while a write was in flight: after a save started (save_blocking_ms > 0 at
    # its step) until the record of its completion
    in_flight, flying = set(), False
    for r in recs:
        if "save_step" in r:
            flying = False
        elif "loss" in r:
            if flying:
                in_flight.add(r["step"])
            if mode != "sync" and r["save_blocking_ms"] > 0:
                flying = True
    quiet = [r["step_ms"] for r in step_recs if r["step"] > 1 and r["step"] not in in_flight]
    busy = [r["step_ms"] for r in step_recs if r["step"] in in_flight]
    load = re.search(r"GB read in ([\d.]+) s \(([\d.]+) GB/s\)", open(f"{work}/load_{mode}.log").read())
    ckdir = os.path.realpath(f"{work}/ck_{mode}")
    waits = [l for l in open(f"{work}/train_{mode}.log") if "is due: waited" in l]
    rows[mode] = dict(
        blocked=statistics.median(s["save_blocking_ms"] for s in saves),
        write=statistics.median(s["save_write_s"] for s in saves),
        gbs=statistics.median(s["save_gb_per_s"] for s in saves),
        written=written(f"{work}/{mode}.strace", ckdir) / len(saves) / 1e9,
        size=state_bytes(ckdir) / 1e9,
        quiet=statistics.median(quiet) if quiet else float("nan"),
        busy=statistics.median(busy) if busy else float("nan"), n_busy=len(busy),
        load_s=float(load.group(1)) if load else float("nan"), load_gbs=float(load.group(2)) if load else float("nan"),
        n=len(saves), waits=len(waits))

print(f"\nstate saves, configs/llama100m.ini (vocab 256, micro_batch 1, seq 256), {ranks} ranks, CPU, {os.uname().nodename}")
print(f"disk's own rate, dd of the same size + fsync in the same directory: {dd_gbs:.3f} GB/s")
print(f"{'mode':6} {'saves':>5} {'blocked ms':>10} {'write s':>8} {'GB/s':>6} {'of dd':>6} {'GB written':>10} {'file GB':>8} "
      f"{'step ms':>8} {'in flight':>14} {'waits':>5} {'load s':>7} {'load GB/s':>9}")
for mode, r in rows.items():
    busy = f"{r['busy']:.0f} ({r['n_busy']})" if r["n_busy"] else "-"
    print(f"{mode:6} {r['n']:>5} {r['blocked']:>10.0f} {r['write']:>8.2f} {r['gbs']:>6.3f} {r['gbs'] / dd_gbs:>6.0%} "
          f"{r['written']:>10.3f} {r['size']:>8.3f} {r['quiet']:>8.0f} {busy:>14} {r['waits']:>5} {r['load_s']:>7.2f} "
          f"{r['load_gbs']:>9.2f}")
print("blocked ms, write s, GB/s: medians over the saves; GB written: bytes that reached the state files per save "
      "(strace); file GB: the newest file (async: top file + rank files); step ms: median without a save in flight; "
      "in flight: median step ms while an asynchronous write ran (number of steps); waits: saves that waited for the "
      "previous one")
EOF
echo "(logs in $WORK)"
