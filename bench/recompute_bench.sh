#!/usr/bin/env bash
# recompute_bench.sh — activation checkpointing: memory and step time of every recompute policy,
# measured with the real `gtrain` binary on the CPU (one rank). Not a test: it prints a markdown
# table (docs/recompute.md holds one run of it) and never fails on the numbers.
#
#   bench/recompute_bench.sh [BUILD_DIR]            (default: build)
#
# For each policy it trains the same model for BENCH_STEPS steps (the first is a warm-up) and reads
# the metrics JSONL gtrain writes: act_peak_bytes (measured activation high-water mark),
# mem_peak_bytes (all tracked buffers), recomputed_blocks, step_ms (median of steps 2..n over all
# rounds). BENCH_ROUNDS runs every policy that many times, round-robin, so that load from other
# processes drifting over the run does not fall on one policy only. The
# prediction is the planner's exact figure (BUILD_DIR/tests/test_recompute --predict, which runs
# gt_plan_estimate as train.c does); without that binary, the rounded figure gtrain prints.
# Max RSS is the process's peak resident set (getrusage of the child): tracked buffers plus the
# program, OpenBLAS/OpenMP buffers and allocator slack.
#
# Knobs (environment): BENCH_DIM (512) BENCH_FFN (2048) BENCH_LAYERS (8) BENCH_HEADS (8)
# BENCH_KV_HEADS (= heads) BENCH_SEQ (256) BENCH_MB (4) BENCH_STEPS (4) BENCH_ROUNDS (2) BENCH_VOCAB (256)
# BENCH_POLICIES ("none selective sqrt uniform:2 blocks:4 full") BENCH_TEXT (a text file for
# gtrain-prep; default /usr/share/common-licenses/GPL-3) BENCH_WORK (scratch dir; default a new
# temporary one) OMP_NUM_THREADS (2). Needs python3 (to read the JSONL and measure RSS).
# BENCH_REPORT_ONLY=1 with BENCH_WORK=DIR of an earlier run prints its table again without running.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${1:-$root/build}"
build="$(cd "$build" && pwd)"
gtrain="$build/gtrain"
prep="$build/gtrain-prep"
predict="$build/tests/test_recompute"
for exe in "$gtrain" "$prep"; do
    [[ -x "$exe" ]] || { echo "recompute_bench: $exe not found (build first: cmake --build $build)" >&2; exit 2; }
done
command -v python3 >/dev/null || { echo "recompute_bench: python3 is needed" >&2; exit 2; }

DIM="${BENCH_DIM:-512}"
FFN="${BENCH_FFN:-2048}"
LAYERS="${BENCH_LAYERS:-8}"
HEADS="${BENCH_HEADS:-8}"
KV_HEADS="${BENCH_KV_HEADS:-$HEADS}"
SEQ="${BENCH_SEQ:-256}"
MB="${BENCH_MB:-4}"
STEPS="${BENCH_STEPS:-4}"
ROUNDS="${BENCH_ROUNDS:-2}"
VOCAB="${BENCH_VOCAB:-256}"
POLICIES="${BENCH_POLICIES:-none selective sqrt uniform:2 blocks:4 full}"
TEXT="${BENCH_TEXT:-/usr/share/common-licenses/GPL-3}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
[[ -r "$TEXT" ]] || TEXT="$root/docs/recompute.md"

work="${BENCH_WORK:-$(mktemp -d -t recompute_bench.XXXXXX)}"
mkdir -p "$work"
if [[ -z "${BENCH_REPORT_ONLY:-}" ]]; then
"$prep" --val-fraction 0 -o "$work/text" "$TEXT" >/dev/null

cat >"$work/bench.ini" <<EOF
; written by bench/recompute_bench.sh
[model]
dim = $DIM
n_layers = $LAYERS
n_heads = $HEADS
n_kv_heads = $KV_HEADS
vocab_size = $VOCAB
ffn_dim = $FFN
max_seq_len = $SEQ
dropout = 0
[train]
seq_len = $SEQ
micro_batch = $MB
grad_accum = 1
steps = $STEPS
warmup_steps = 1
seed = 1
device = cpu
[memory]
recompute = none
[dist]
shard = none
[data]
train = $work/text.train.bin
val =
[checkpoint]
dir =
[log]
every = 1
metrics =
EOF

# runs a command, writes its peak RSS (KiB, getrusage of the child) to $1, keeps its exit status
rss_run() {
    python3 - "$@" <<'PY'
import resource, subprocess, sys
out = sys.argv[1]
rc = subprocess.call(sys.argv[2:])
with open(out, "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
PY
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
started="$(date -u '+%Y-%m-%d %H:%M')"
cpu_model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$root" status --porcelain 2>/dev/null | head -1)" ]]; then commit="$commit (working tree modified)"; fi

echo "recompute_bench: $LAYERS blocks, dim $DIM, ffn $FFN, heads $HEADS/$KV_HEADS, vocab $VOCAB, micro-batch $MB x $SEQ, $STEPS steps, OMP_NUM_THREADS=$OMP_NUM_THREADS; work dir $work" >&2
for ((round = 1; round <= ROUNDS; round++)); do
    for pol in $POLICIES; do
        tag="${pol//:/_}"
        echo "recompute_bench: round $round/$ROUNDS, $pol ..." >&2
        if [[ -x "$predict" ]]; then
            "$predict" --predict "$work/bench.ini" "memory.recompute=$pol" >"$work/$tag.predict"
        else
            : >"$work/$tag.predict"
        fi
        rss_run "$work/$tag.r$round.rss" "$gtrain" "$work/bench.ini" "memory.recompute=$pol" \
            "log.metrics=$work/$tag.r$round.jsonl" >"$work/$tag.r$round.out" 2>&1 || {
            echo "recompute_bench: gtrain failed for $pol; see $work/$tag.r$round.out" >&2
            cat "$work/$tag.r$round.out" >&2
            exit 1
        }
    done
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
{
    echo "POLICIES='$POLICIES'"
    echo "ROUNDS=$ROUNDS"
    echo "machine='Machine: ${cpu_model:-unknown CPU}, $(nproc) CPUs visible, OMP_NUM_THREADS=$OMP_NUM_THREADS, one rank; load average before $load_before, after $load_after (1/5/15 min). Run $started to $(date -u '+%Y-%m-%d %H:%M UTC'), gtrain $commit.'"
    echo "shape='Shape: $LAYERS blocks, dim $DIM, ffn $FFN, heads $HEADS/$KV_HEADS kv, vocab $VOCAB, micro-batch $MB x $SEQ tokens, fp32, $STEPS steps x $ROUNDS rounds per policy.'"
} >"$work/run.info"
fi
# shellcheck disable=SC1091
. "$work/run.info"

python3 - "$work" "$POLICIES" "$ROUNDS" <<'PY'
import json, os, re, statistics, sys
work, policies, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
MiB = 1024.0 * 1024.0
units = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
rows = []
for pol in policies:
    tag = pol.replace(":", "_")
    runs = [[json.loads(l) for l in open(os.path.join(work, "%s.r%d.jsonl" % (tag, r))) if '"step_ms"' in l]
            for r in range(1, rounds + 1)]
    steps = [s for run in runs for s in run]
    times = [s["step_ms"] for run in runs for s in (run[1:] or run)]
    pred, exact = None, False
    text = open(os.path.join(work, tag + ".predict")).read()
    m = re.search(r"act_peak_bytes (\d+)", text)
    if m:
        pred, exact = int(m.group(1)), True
    else:
        m = re.search(r"activations ([0-9.]+) (\w+)", open(os.path.join(work, tag + ".r1.out")).read())
        if m:
            pred = float(m.group(1)) * units[m.group(2)]
    rows.append(dict(
        policy=pol,
        rec=sorted({s["recomputed_blocks"] for s in steps}),
        act=max(s["act_peak_bytes"] for s in steps),
        acts=sorted({s["act_peak_bytes"] for s in steps}),
        pred=pred, exact=exact,
        total=max(s["mem_peak_bytes"] for s in steps),
        rss=max(int(open(os.path.join(work, "%s.r%d.rss" % (tag, r))).read()) for r in range(1, rounds + 1)) * 1024,
        ms=statistics.median(times), best=min(times), all_ms=[[s["step_ms"] for s in run] for run in runs]))
base = next((r for r in rows if r["policy"] == "none"), rows[0])

print("| policy | recomputed blocks / step | activation peak (measured) | predicted | act. vs none "
      "| total tracked peak | process max RSS | median step | overhead vs none (median) | best step | overhead vs none (best) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    if r["pred"] is None:
        pred = "?"
    elif r["exact"]:
        pred = "= measured" if r["pred"] == r["act"] and len(r["acts"]) == 1 else "%.1f MiB (differs!)" % (r["pred"] / MiB)
    else:
        pred = "~%.1f MiB" % (r["pred"] / MiB)
    print("| %s | %s | %.1f MiB | %s | %.0f%% | %.1f MiB | %.1f MiB | %.0f ms | %+.1f%% | %.0f ms | %+.1f%% |" % (
        r["policy"], "/".join(str(x) for x in r["rec"]), r["act"] / MiB, pred, 100.0 * r["act"] / base["act"],
        r["total"] / MiB, r["rss"] / MiB, r["ms"], 100.0 * (r["ms"] / base["ms"] - 1.0),
        r["best"], 100.0 * (r["best"] / base["best"] - 1.0)))
print()
print("Step times in ms, one group per round (the first step of each is a warm-up, left out of the median):")
print()
for r in rows:
    print("- %s: %s" % (r["policy"], " | ".join(", ".join("%.0f" % t for t in run) for run in r["all_ms"])))
print()
def get(p):
    return next((r for r in rows if r["policy"] == p), None)
full, sel = get("full"), get("selective")
if full and base["policy"] == "none":
    q = full["act"] / base["act"]
    print("- target: full activation peak <= 30%% of none: %.1f%% -> %s" % (100 * q, "met" if q <= 0.30 else "NOT met"))
    for what, key in (("median", "ms"), ("best", "best")):
        o = full[key] / base[key] - 1.0
        print("- target: full step-time overhead <= 33%% (%s steps): %+.1f%% -> %s" % (what, 100 * o, "met" if o <= 0.33 else "NOT met"))
if sel and base["policy"] == "none":
    for what, key in (("median", "ms"), ("best", "best")):
        o = sel[key] / base[key] - 1.0
        print("- target: selective step-time overhead <= 10%% (%s steps): %+.1f%% -> %s" % (what, 100 * o, "met" if o <= 0.10 else "NOT met"))
PY
echo
echo "$machine"
echo "$shape"
