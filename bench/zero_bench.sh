#!/usr/bin/env bash
# zero_bench.sh — ZeRO stages on the CPU: the ~100M LLaMA (configs/llama100m.ini) on 2 MPI ranks x 1
# thread, the same global batch, for dist.shard = optimizer, gradients and parameters and
# dist.grad_sync = step and micro. Prints a markdown table of tokens/s, memory per rank (total peak,
# working-parameter peak, gradient peak, optimizer state), bytes sent per step, and communication
# time: comm_exposed_ms (the compute thread waiting for communication), comm_ms (inside communicating
# calls: the waits, the starts and the progress calls) and comm_total_ms (the collectives' whole time;
# with blocking collectives the three are equal: nothing is hidden). Not a test: numbers depend on the
# machine and on whatever else runs on it.
#
#   bench/zero_bench.sh [BUILD_DIR]          (default: build)
#
# Environment (all optional): MICRO=2 (sequences per micro-batch), ACCUM=2 (micro-batches per rank
# and step, so step and micro differ), WARMUP=1, MEASURE=2, RECOMPUTE=none, OUT=runs/zero_bench-DATE,
# DATA=token file (default data/fortunes.train.bin, else made from /usr/share/common-licenses).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
GTRAIN=$BUILD/gtrain
PREP=$BUILD/gtrain-prep
[[ -x $GTRAIN ]] || { echo "zero_bench: $GTRAIN not found (build first, or pass the build dir)" >&2; exit 2; }
MICRO=${MICRO:-2}
ACCUM=${ACCUM:-2}
WARMUP=${WARMUP:-1}
MEASURE=${MEASURE:-2}
RECOMPUTE=${RECOMPUTE:-none}
STAMP=$(date -u +%Y%m%d-%H%M%S)
OUT=${OUT:-runs/zero_bench-$STAMP}
mkdir -p "$OUT"
MPIEXEC=${MPIEXEC:-mpiexec}
STEPS=$((WARMUP + MEASURE))
CONFIG=${CONFIG:-configs/llama100m.ini}
DATA=${DATA:-data/fortunes.train.bin}
if [[ ! -s $DATA ]]; then
  cat /usr/share/common-licenses/* >"$OUT/corpus.txt"
  "$PREP" --val-fraction 0 -o "$OUT/corpus" "$OUT/corpus.txt" >/dev/null
  DATA=$OUT/corpus.train.bin
fi

run() {   # NAME SHARD SYNC
  local name=$1 shard=$2 sync=$3
  local cmd=("$MPIEXEC" -n 2 --allow-run-as-root --bind-to core "$GTRAIN" "$CONFIG"
             "train.micro_batch=$MICRO" "train.grad_accum=$ACCUM" "train.steps=$STEPS" "train.warmup_steps=1"
             "dist.shard=$shard" "dist.grad_sync=$sync" "memory.recompute=$RECOMPUTE" "dist.comm=mpi"
             "data.train=$DATA" "data.val=" "data.val_every=0" "checkpoint.dir=" "log.every=1"
             "log.metrics=$OUT/$name.metrics.jsonl")
  echo "+ OMP_NUM_THREADS=1 ${cmd[*]}" | tee "$OUT/$name.log" >&2
  cut -d' ' -f1 /proc/loadavg >"$OUT/$name.load"
  OMP_NUM_THREADS=1 "${cmd[@]}" >>"$OUT/$name.log" 2>&1 ||
    { echo "zero_bench: run $name failed, see $OUT/$name.log" >&2; tail -20 "$OUT/$name.log" >&2; exit 1; }
  cut -d' ' -f1 /proc/loadavg >>"$OUT/$name.load"
}

echo "zero_bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
     "config $CONFIG, 2 ranks x 1 thread, micro_batch $MICRO, grad_accum $ACCUM, recompute $RECOMPUTE" >&2
RUNS=("z1 optimizer step" "z2_step gradients step" "z2_micro gradients micro" "z3_step parameters step"
      "z3_micro parameters micro")
for r in "${RUNS[@]}"; do run $r; done

python3 - "$OUT" "$WARMUP" "${RUNS[@]}" <<'PY'
import json, sys
out, warmup = sys.argv[1], int(sys.argv[2])
print("\n| shard / grad_sync | tokens/s | step ms | mem peak MiB | params peak MiB | grads peak MiB "
      "| optim MiB | comm MiB/step | comm_exposed_ms | comm_ms | comm_total_ms | last loss | load before/after |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
M = 2**20
for spec in sys.argv[3:]:
    name, shard, sync = spec.split()
    lines = [json.loads(l) for l in open(f"{out}/{name}.metrics.jsonl") if l.strip()]
    lines = [l for l in lines if "loss" in l]
    meas = [l for l in lines if l["step"] > warmup]
    ms = sum(l["step_ms"] for l in meas) / len(meas)
    toks = (lines[-1]["tokens"] - lines[warmup - 1]["tokens"]) / len(meas) if warmup else lines[-1]["tokens"] / len(meas)
    last = meas[-1]
    load = "/".join(open(f"{out}/{name}.load").read().split())
    label = shard + ("" if shard == "optimizer" else " / " + sync)
    print(f"| {label} | {toks / (ms / 1e3):.1f} | {ms:.0f} | {last['mem_peak_bytes'] / M:.0f} "
          f"| {last['params_peak_bytes'] / M:.0f} | {last['grads_peak_bytes'] / M:.0f} | {last['optim_bytes'] / M:.0f} "
          f"| {last['comm_bytes'] / M:.0f} | {sum(l['comm_exposed_ms'] for l in meas) / len(meas):.0f} "
          f"| {sum(l['comm_ms'] for l in meas) / len(meas):.0f} "
          f"| {sum(l['comm_total_ms'] for l in meas) / len(meas):.0f} | {last['loss']:.4f} | {load} |")
PY
