#!/usr/bin/env bash
# scaling.sh — data-parallel scaling on links shaped like a cluster's: one rank per node on the 2-node
# test cluster (tests/cluster/cluster.sh up 2 --link RATE, one thread per rank) against one rank alone,
# for ZeRO-1, ZeRO-2 (grad_sync step and micro) and ZeRO-3, each with overlap off and on. Prints one
# markdown table: tokens/s per rank, efficiency (the 2-node run's tokens/s per rank over the lone
# rank's), the share of the step the compute thread waited on communication (comm_exposed_ms /
# step_ms), comm_ms and comm_total_ms beside it, bytes sent per rank per step, the last loss.
# Not a test: the numbers are what the machine gives while it runs.
#
# The lone rank runs as a twin by default (BASELINE=twin): two independent one-rank runs at once, one
# per core, tokens/s per rank their mean. The test cluster's two nodes are namespaces of one machine:
# their ranks share its cores' caches and memory bandwidth, which a real cluster's nodes do not. A lone
# rank with its twin beside it took 27-30% longer a step here than one with the other core idle
# (llama100m's shape, micro-batch 4, no communication at all), a slowdown the 2-node run pays whatever
# its links do; the twin's figure is the lone rank a 2-node run can be held to. BASELINE=alone runs one.
#
#   bench/scaling.sh [options]
#     --build DIR     the build to run (default build)
#     --rate RATE     the link rate in tc's units (200mbit, 1gbit, ...); default: what bench/link_rate.py
#                     derives for the reference configuration from two runs of the same shape here
#     --local         run the "2-node" rows with mpiexec -n 2 on this host (no cluster, no shaping):
#                     checks the script and the table, measures nothing about links
#     --four          also a 4-node run (ZeRO-1, overlap on) against a one-host 4-rank run: a
#                     correctness check only (4 ranks on 2 cores are oversubscribed), the same losses
#     --dry-run       print the commands, run nothing
#     --out DIR       where the configs, logs and metrics go (default runs/scaling-DATE; on the
#                     cluster it must be on the file system the nodes share: under the repository is)
#
# Environment (optional): CONFIG=configs/llama100m.ini, SHAPE="model.vocab_size=256" (overrides that
# make the shape: with a small vocabulary the embedding and head stop dominating, so the blocks'
# traffic is a real share of the step), MICRO=4 (sequences per micro-batch: with 1, the transfers'
# own CPU time, on the cores that compute, is a 4x larger share of the step), ACCUM=2 (micro-batches
# per rank and step), WARMUP=1, MEASURE=3 (steps measured), BUCKET_MB=25 (overlap on: gradient buckets),
# PREFETCH=1 (overlap on, ZeRO-3), PROGRESS_US=1000 (overlap on: the MPI progress thread),
# DATA=token file (default: made from /usr/share/common-licenses with gtrain-prep), ONLY=z1_on,z3_on
# (the rows to run, by name: z1, z2s, z2m, z3 with _off or _on; default all eight).
# Overlap off is dist.bucket_mb = 0, dist.prefetch = 0, dist.progress_us = 0 and
# dist.overlap_param_gather = false: one reduction after the backward, one gather of the new weights
# before the next step, every ZeRO-3 gather when needed, started requests advanced between kernels only
# (a ZeRO-2/3 micro reduction still starts when its unit's backward ends; it has no blocking form).
# Overlap on: buckets, the weights' gather waited for per unit in the next forward (ZeRO-1/2),
# prefetch, the progress thread.
#
# The cluster (not with --local or --dry-run) needs root and what tests/cluster/cluster.sh needs; this
# script brings it up and takes it down again (also on an error).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

BUILD=build RATE= LOCAL=0 FOUR=0 DRY=0 OUT=
while (($#)); do
  case $1 in
    --build) BUILD=${2:?--build needs a directory}; shift 2 ;;
    --rate) RATE=${2:?--rate needs a rate such as 200mbit}; shift 2 ;;
    --local) LOCAL=1; shift ;;
    --four) FOUR=1; shift ;;
    --dry-run) DRY=1; shift ;;
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "scaling.sh: unknown argument '$1' (expected --build DIR, --rate RATE, --local, --four, --dry-run, --out DIR)" >&2
       exit 2 ;;
  esac
done
if [[ -n $RATE && ! $RATE =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]]; then
  echo "scaling.sh: --rate '$RATE': expected a number and a tc unit (kbit, mbit, gbit, mbps, ...)" >&2
  exit 2
fi
GTRAIN=$BUILD/gtrain PREP=$BUILD/gtrain-prep
if ((!DRY)); then
  [[ -x $GTRAIN && -x $PREP ]] || { echo "scaling.sh: $GTRAIN or $PREP not found (build first, or pass --build DIR)" >&2; exit 2; }
  GTRAIN=$(cd "$BUILD" && pwd)/gtrain PREP=$(cd "$BUILD" && pwd)/gtrain-prep # the nodes start it by this path
fi
CONFIG=${CONFIG:-configs/llama100m.ini}
SHAPE=${SHAPE:-model.vocab_size=256}
MICRO=${MICRO:-4} ACCUM=${ACCUM:-2} WARMUP=${WARMUP:-1} MEASURE=${MEASURE:-3}
BUCKET_MB=${BUCKET_MB:-25} PREFETCH=${PREFETCH:-1} PROGRESS_US=${PROGRESS_US:-1000} BASELINE=${BASELINE:-twin}
[[ $BASELINE == twin || $BASELINE == alone ]] || { echo "scaling.sh: BASELINE=$BASELINE: expected twin or alone" >&2; exit 2; }
for v in MICRO ACCUM WARMUP MEASURE PREFETCH PROGRESS_US; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "scaling.sh: $v=${!v}: expected a whole number" >&2; exit 2; }
done
((MICRO >= 1 && ACCUM >= 1 && MEASURE >= 1)) || { echo "scaling.sh: MICRO, ACCUM and MEASURE must be >= 1" >&2; exit 2; }
STEPS=$((WARMUP + MEASURE))
OUT=${OUT:-runs/scaling-$(date -u +%Y%m%d-%H%M%S)}
OUT=$(realpath -m "$OUT")
if ((!LOCAL)) && [[ $OUT == /tmp || $OUT == /tmp/* || $OUT == /dev/shm || $OUT == /dev/shm/* ]]; then
  # the cluster's nodes each mount their own /tmp and /dev/shm: they would not find the corpus
  echo "scaling.sh: --out $OUT: the test cluster's nodes cannot read /tmp or /dev/shm of this host (expected a directory elsewhere, such as runs/...)" >&2
  exit 2
fi
mkdir -p "$OUT"
MPIEXEC=${MPIEXEC:-mpiexec}

exec 3>&2 # the commands are echoed here, whatever their own output is redirected to
run_cmd() { # print, then run unless --dry-run
  echo "+ $*" >&3
  ((DRY)) || "$@"
}

DATA=${DATA:-}
if [[ -z $DATA ]]; then
  DATA=$OUT/corpus.train.bin
  if ((!DRY)); then
    cat /usr/share/common-licenses/* >"$OUT/corpus.txt"
    "$PREP" --val-fraction 0 -o "$OUT/corpus" "$OUT/corpus.txt" >/dev/null
  fi
fi

# the rows: NAME SHARD SYNC OVERLAP
ROWS=("z1_off optimizer step off" "z1_on optimizer step on"
      "z2s_off gradients step off" "z2s_on gradients step on"
      "z2m_off gradients micro off" "z2m_on gradients micro on"
      "z3_off parameters step off" "z3_on parameters step on")

if [[ -n ${ONLY:-} ]]; then
  kept=()
  for row in "${ROWS[@]}"; do [[ ,$ONLY, == *,${row%% *},* ]] && kept+=("$row"); done
  ((${#kept[@]})) || { echo "scaling.sh: ONLY=$ONLY names no row (expected z1_off, z1_on, z2s_off, ... z3_on)" >&2; exit 2; }
  ROWS=("${kept[@]}")
fi

args_of() { # NAME SHARD SYNC OVERLAP [ACCUM] -> the gtrain arguments (NAME empty: no metrics file)
  local name=$1 shard=$2 sync=$3 overlap=$4 accum=${5:-$ACCUM} b=0 p=0 u=0 g=false
  [[ $overlap == on ]] && b=$BUCKET_MB p=$PREFETCH u=$PROGRESS_US g=true
  echo "$CONFIG $SHAPE train.micro_batch=$MICRO train.grad_accum=$accum train.steps=$STEPS train.warmup_steps=1" \
       "dist.shard=$shard dist.grad_sync=$sync dist.bucket_mb=$b dist.prefetch=$p dist.progress_us=$u" \
       "dist.overlap_param_gather=$g dist.comm=mpi" \
       "data.train=$DATA data.val= data.val_every=0 checkpoint.dir= log.every=1" \
       "${name:+log.metrics=$OUT/$name.metrics.jsonl}"
}

# one rank alone, one thread, the same work per rank (the lone rank's global batch is half the pair's);
# with BASELINE=twin a second one beside it (.one.b), started at the same moment
for row in "${ROWS[@]}"; do
  set -- $row
  twin=
  if [[ $BASELINE == twin ]]; then
    # shellcheck disable=SC2046
    run_cmd env OMP_NUM_THREADS=1 "$GTRAIN" $(args_of "$1.one.b" "$2" "$3" "$4") >"$OUT/$1.one.b.log" 2>&1 &
    twin=$!
  fi
  # shellcheck disable=SC2046
  run_cmd env OMP_NUM_THREADS=1 "$GTRAIN" $(args_of "$1.one" "$2" "$3" "$4") >"$OUT/$1.one.log" 2>&1 ||
    { echo "scaling.sh: the one-rank run $1 failed, see $OUT/$1.one.log" >&2; exit 1; }
  [[ -z $twin ]] || wait "$twin" || { echo "scaling.sh: the twin one-rank run $1 failed, see $OUT/$1.one.b.log" >&2; exit 1; }
done

if ((!LOCAL)) && [[ -z $RATE ]]; then
  # link_rate.py's arithmetic: the reference's communication-to-compute ratio for this step
  set -- ${ROWS[0]}
  # shellcheck disable=SC2046
  run_cmd python3 bench/link_rate.py --build "$BUILD" --world 2 --steps "$STEPS" --run $(args_of "" "$2" "$3" on) \
    | tee "$OUT/link_rate.txt" >&2
  ((DRY)) && RATE=200mbit || RATE=$(sed -n 's/^shape: .* --link //p' "$OUT/link_rate.txt")
  [[ -n $RATE ]] || { echo "scaling.sh: bench/link_rate.py printed no rate (see $OUT/link_rate.txt)" >&2; exit 1; }
fi

if ((LOCAL)); then
  launch2() { run_cmd env OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1 "$MPIEXEC" --allow-run-as-root -n 2 "$GTRAIN" "$@"; }
  WHERE="2 ranks on this host (--local: no cluster, no shaping)"
else
  run_cmd bash tests/cluster/cluster.sh up "$((FOUR ? 4 : 2))" --link "$RATE" >"$OUT/cluster.env"
  ((DRY)) || trap 'bash tests/cluster/cluster.sh down >/dev/null 2>&1' EXIT
  ((DRY)) || eval "$(cat "$OUT/cluster.env")"
  launch2() { run_cmd srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --mpi=pmix --export=ALL,OMP_NUM_THREADS=1 \
                "$GTRAIN" "$@"; }
  WHERE="2 nodes of the test cluster, one rank each, links shaped to $RATE (tc tbf)"
fi
for row in "${ROWS[@]}"; do
  set -- $row
  # shellcheck disable=SC2046
  launch2 $(args_of "$1.two" "$2" "$3" "$4") >"$OUT/$1.two.log" 2>&1 ||
    { echo "scaling.sh: the 2-rank run $1 failed, see $OUT/$1.two.log" >&2; exit 1; }
done

if ((FOUR && !LOCAL)); then # correctness only: 4 nodes against 4 ranks on one host, the same losses
  set -- z1_on optimizer step on # ZeRO-1, overlap on (whatever ONLY= ran)
  # shellcheck disable=SC2046
  run_cmd srun --nodes=4 --ntasks-per-node=1 --cpus-per-task=1 --mpi=pmix --export=ALL,OMP_NUM_THREADS=1 \
    "$GTRAIN" $(args_of four.nodes "$2" "$3" "$4" 1) >"$OUT/four.nodes.log" 2>&1 ||
    { echo "scaling.sh: the 4-node run failed, see $OUT/four.nodes.log" >&2; exit 1; }
  # shellcheck disable=SC2046
  # the one-host run: without the cluster's interface choice (its subnet is not in this namespace)
  run_cmd env -u OMPI_MCA_btl -u OMPI_MCA_btl_tcp_if_include -u OMPI_MCA_oob_tcp_if_include OMP_NUM_THREADS=1 \
    OMPI_MCA_rmaps_base_oversubscribe=1 "$MPIEXEC" --allow-run-as-root -n 4 "$GTRAIN" \
    $(args_of four.host "$2" "$3" "$4" 1) >"$OUT/four.host.log" 2>&1 ||
    { echo "scaling.sh: the 4-rank one-host run failed, see $OUT/four.host.log" >&2; exit 1; }
fi
((DRY)) && exit 0

python3 - "$OUT" "$WARMUP" "$WHERE" "$FOUR" "$LOCAL" "$BASELINE" "${ROWS[@]}" <<'PY'
import json, sys
out, warmup, where, four, local = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5] == "1"
twin = sys.argv[6] == "twin"
rows = [r.split() for r in sys.argv[7:]]

def steps(path):
    lines = [json.loads(l) for l in open(path) if l.strip()]
    return [l for l in lines if "loss" in l]

def mean(xs):
    return sum(xs) / len(xs)

def figures(path, ranks):
    lines = steps(path)
    meas = [l for l in lines if l["step"] > warmup] or lines
    ms = mean([l["step_ms"] for l in meas])
    per_step = lines[-1]["tokens"] / len(lines)  # tokens of the global batch per step
    return dict(tok_rank=per_step / ranks / (ms / 1e3), step_ms=ms, exposed=mean([l["comm_exposed_ms"] for l in meas]),
                comm=mean([l["comm_ms"] for l in meas]), total=mean([l["comm_total_ms"] for l in meas]),
                bytes=meas[-1]["comm_bytes"], loss=lines[-1]["loss"])

lone = "one rank with its twin beside it (the mean of the two)" if twin else "one rank alone"
print(f"\n{where}; {lone} for comparison; means over the steps after {warmup}\n")
print("| shard / grad_sync | overlap | tokens/s per rank (1 rank) | tokens/s per rank (2) | efficiency "
      "| comm_exposed share | comm_exposed_ms | comm_ms | comm_total_ms | step ms | MiB sent per rank per step | last loss |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for name, shard, sync, overlap in rows:
    one, two = figures(f"{out}/{name}.one.metrics.jsonl", 1), figures(f"{out}/{name}.two.metrics.jsonl", 2)
    if twin:
        one["tok_rank"] = (one["tok_rank"] + figures(f"{out}/{name}.one.b.metrics.jsonl", 1)["tok_rank"]) / 2
    label = {"optimizer": "ZeRO-1", "gradients": "ZeRO-2", "parameters": "ZeRO-3"}[shard]
    label += "" if shard == "optimizer" else f" / {sync}"
    print(f"| {label} | {overlap} | {one['tok_rank']:.1f} | {two['tok_rank']:.1f} | {two['tok_rank'] / one['tok_rank']:.0%} "
          f"| {two['exposed'] / two['step_ms']:.1%} | {two['exposed']:.0f} | {two['comm']:.0f} | {two['total']:.0f} "
          f"| {two['step_ms']:.0f} | {two['bytes'] / 2**20:.1f} | {two['loss']:.4f} |")
if four and not local:
    a, b = steps(f"{out}/four.nodes.metrics.jsonl"), steps(f"{out}/four.host.metrics.jsonl")
    same = [x["loss"] for x in a] == [x["loss"] for x in b]
    print(f"\n4 nodes vs 4 ranks on one host (ZeRO-1, overlap on): losses {'EQUAL' if same else 'DIFFER'} over {len(a)} steps")
    if not same:
        sys.exit(1)
PY
