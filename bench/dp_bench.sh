#!/usr/bin/env bash
# dp_bench.sh — data-parallel throughput of gtrain on the CPU: the ~100M LLaMA (configs/llama100m.ini)
# on 1 rank with 2 OpenMP threads vs 2 MPI ranks with 1 thread each, the same global batch per step
# (1 rank: grad_accum 2; 2 ranks: grad_accum 1), ZeRO-1 (dist.shard=optimizer). Prints a markdown
# table of tokens/s, step time and the communication share of the step (comm_ms / step_ms from the
# metrics JSONL; comm_ms is wall time inside the collectives, so it includes waiting for the slower
# rank). Not a test: numbers depend on the machine and on whatever else runs on it.
#
#   bench/dp_bench.sh [BUILD_DIR]          (default: build)
#
# Environment (all optional):
#   CONFIG=configs/llama100m.ini  the model; without the file the shape is written here (dim 768,
#                                 12 layers, 12 heads / 4 kv heads, ffn 2048, vocab 32000, seq 512)
#   MICRO=2        sequences per micro-batch (the config says 4; 2 keeps a step near half a minute
#                  on 2 cores)
#   WARMUP=1       steps not measured (the first pays for allocation and cold caches)
#   MEASURE=3      steps measured after the warm-up
#   DATA=...       token file (default data/fortunes.train.bin; made from /usr/share/common-licenses
#                  with gtrain-prep into OUT when missing)
#   OUT=runs/dp_bench-DATE   configs, logs and metrics of every run
#   EXTRA="none"   also run 2 ranks with dist.shard=none; "single" also runs 1 rank x 1 thread
#                  (the per-core baseline); both: EXTRA="none single"
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
GTRAIN=$BUILD/gtrain
PREP=$BUILD/gtrain-prep
[[ -x $GTRAIN ]] || { echo "dp_bench: $GTRAIN not found (build first, or pass the build dir)" >&2; exit 2; }
MICRO=${MICRO:-2}
WARMUP=${WARMUP:-1}
MEASURE=${MEASURE:-3}
EXTRA=${EXTRA:-}
STAMP=$(date -u +%Y%m%d-%H%M%S)
OUT=${OUT:-runs/dp_bench-$STAMP}
mkdir -p "$OUT"
MPIEXEC=${MPIEXEC:-mpiexec}
MPIFLAGS=(--allow-run-as-root)
STEPS=$((WARMUP + MEASURE))

CONFIG=${CONFIG:-configs/llama100m.ini}
if [[ ! -f $CONFIG ]]; then
  CONFIG=$OUT/llama100m.ini
  cat >"$CONFIG" <<'EOF'
; written by bench/dp_bench.sh: the ~100M LLaMA shape (configs/llama100m.ini was missing)
[model]
dim = 768
n_layers = 12
n_heads = 12
n_kv_heads = 4
vocab_size = 32000
ffn_dim = 2048
max_seq_len = 512
[train]
seq_len = 512
lr = 6e-4
min_lr = 6e-5
warmup_steps = 1
precision = fp32
device = cpu
[memory]
recompute = none
[data]
val =
val_every = 0
[checkpoint]
resume = never
EOF
fi

DATA=${DATA:-data/fortunes.train.bin}
if [[ ! -s $DATA ]]; then
  [[ -x $PREP ]] || { echo "dp_bench: no $DATA and no $PREP to make one" >&2; exit 2; }
  cat /usr/share/common-licenses/* >"$OUT/corpus.txt"
  "$PREP" --val-fraction 0 -o "$OUT/corpus" "$OUT/corpus.txt" >/dev/null
  DATA=$OUT/corpus.train.bin
fi

# run NAME RANKS THREADS ACCUM SHARD BIND
run() {
  local name=$1 ranks=$2 threads=$3 accum=$4 shard=$5 bind=$6
  local cmd=("$MPIEXEC" -n "$ranks" "${MPIFLAGS[@]}" --bind-to "$bind" "$GTRAIN" "$CONFIG"
             "train.micro_batch=$MICRO" "train.grad_accum=$accum" "train.steps=$STEPS" "train.warmup_steps=1" "dist.shard=$shard"
             "dist.comm=mpi" "data.train=$DATA" "data.val=" "data.val_every=0" "checkpoint.dir="
             "log.every=1" "log.metrics=$OUT/$name.metrics.jsonl")
  echo "+ OMP_NUM_THREADS=$threads ${cmd[*]}" | tee "$OUT/$name.log" >&2
  cut -d' ' -f1 /proc/loadavg >"$OUT/$name.load"
  OMP_NUM_THREADS=$threads "${cmd[@]}" >>"$OUT/$name.log" 2>&1 ||
    { echo "dp_bench: run $name failed, see $OUT/$name.log" >&2; tail -20 "$OUT/$name.log" >&2; exit 1; }
  cut -d' ' -f1 /proc/loadavg >>"$OUT/$name.load"   # 1-minute load before and after: noise indicator
}

echo "dp_bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
     "config $CONFIG, micro_batch $MICRO, $WARMUP warm-up + $MEASURE measured steps, out $OUT" >&2
RUNS=()
# 1 rank: not bound, so its 2 OpenMP threads get both cores; 2 ranks: one core each
run r1_t2 1 2 2 optimizer none; RUNS+=("r1_t2 1 2 2 optimizer")
run r2_t1 2 1 1 optimizer core; RUNS+=("r2_t1 2 1 1 optimizer")
if [[ " $EXTRA " == *" none "* ]]; then run r2_t1_none 2 1 1 none core; RUNS+=("r2_t1_none 2 1 1 none"); fi
if [[ " $EXTRA " == *" single "* ]]; then run r1_t1 1 1 2 optimizer core; RUNS+=("r1_t1 1 1 2 optimizer"); fi

python3 - "$OUT" "$WARMUP" "$MICRO" "$CONFIG" "${RUNS[@]}" <<'EOF'
import json, sys
out, warmup, micro, config = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = []
for spec in sys.argv[5:]:
    name, ranks, threads, accum, shard = spec.split()
    lines = [json.loads(l) for l in open(f"{out}/{name}.metrics.jsonl") if l.strip()]
    lines = [l for l in lines if "loss" in l]
    meas = [l for l in lines if l["step"] > warmup]
    ms = sum(l["step_ms"] for l in meas)
    toks = (lines[-1]["tokens"] - (lines[warmup - 1]["tokens"] if warmup else 0))
    comm = sum(l["comm_ms"] for l in meas)
    load = "/".join(open(f"{out}/{name}.load").read().split())
    rows.append((f"{ranks} x {threads}", accum, shard, toks / len(meas), toks / (ms / 1e3), ms / len(meas),
                 comm / len(meas), 100.0 * comm / ms, meas[-1]["comm_bytes"] / 2**20,
                 meas[-1]["optim_bytes"] / 2**20, meas[-1]["mem_peak_bytes"] / 2**30, meas[-1]["loss"], load,
                 " ".join(f"{l['step_ms'] / 1e3:.1f}" for l in lines)))
print(f"\nconfig `{config}`, micro_batch {micro}; means over the steps after {warmup} warm-up step(s)\n")
print("| ranks x threads | grad_accum | shard | tokens/step | tokens/s | step ms | comm ms | comm share "
      "| comm MiB/rank/step | optim MiB/rank | mem peak GiB/rank | last loss | load before/after "
      "| every step, s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.0f} | {r[4]:.1f} | {r[5]:.0f} | {r[6]:.0f} | {r[7]:.1f}% "
          f"| {r[8]:.0f} | {r[9]:.0f} | {r[10]:.2f} | {r[11]:.4f} | {r[12]} | {r[13]} |")
EOF
