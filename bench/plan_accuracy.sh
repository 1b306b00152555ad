#!/usr/bin/env bash
# plan_accuracy.sh — the time model against the trainer: for each configuration of a grid, the step
# time `gtrain --plan` predicts (from the calibration file, docs/planner.md) and the median step_ms
# the trainer measures. Not a test: it prints a markdown table and never fails on the numbers.
#
#   bench/plan_accuracy.sh [BUILD_DIR]            (default: build)
#
# Each row: a model shape, a ZeRO stage, a recompute policy, micro-batch x grad_accum (the global
# batch held at ACC_GLOBAL sequences per rank), ranks, precision. Each row is trained ACC_REPEAT (2)
# times, in passes over the grid (the second in reverse order), ACC_STEPS steps each; the first
# ACC_WARMUP (2) steps of each run are left out of the median. The table gives each run's median and
# the repeat spread between them (what the machine gives the same plan twice: an error below it is
# not resolved), and a last line the median and worst |error| beside the median and largest spread. Calibrate first, on a quiet machine, with the
# same ranks the rows use (mpirun -np 2 build/gtrain --calibrate CONFIG for the 2-rank rows: both ranks
# measure each kernel at once): the calibration is keyed by threads per rank and ranks per node, so
# each rank count reads its own file. Rows whose rates came from the defaults, or from the file of
# another count of ranks per node, are marked.
#
# Knobs (environment): ACC_GRID: rows "shape:stage:policy:micro_batch:ranks:precision" separated by
# spaces (shape: s (dim 128, 4 blocks) or m (dim 256, 6 blocks)); default: a 24-row grid over both
# shapes, ZeRO-1/2/3, recompute none/selective/full/auto, micro-batch 1 to 8, 1 and 2 ranks, fp32 and
# bf16. ACC_GLOBAL (8) ACC_STEPS (10) ACC_SEQ (128) ACC_CALIBRATE=1 runs --calibrate for each shape,
# precision and rank count first. ACC_WORK (scratch dir; default a new temporary one). Needs python3
# and, for 2-rank rows, mpirun.
#
# ACC_CLUSTER=RATE: the rows on the 2-node test cluster instead (tests/cluster/cluster.sh up 2 --link
# RATE: one rank per node, one thread each, every node's link shaped to RATE, in tc's units such as
# 1gbit), brought up and taken down by this script (root). The calibration runs there too (srun over
# both nodes: its collectives cross the shaped link; the file is keyed by the node's host name and kept
# in ACC_WORK/cache), and so does --plan (on the first node, --ranks-per-node 1). Its default grid: 10
# rows of both shapes, ZeRO-1/2/3, every recompute policy, fp32 and bf16, micro-batch 1 to 8; every row
# must have 2 ranks. ACC_WORK must be on the file system the nodes share (default:
# runs/plan-accuracy-cluster-DATE under the repository; not /tmp, of which each node has its own).
# auto's comparison at the end is one-rank, on this host: not run in this mode.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
gtrain="$build/gtrain"
prep="$build/gtrain-prep"
for exe in "$gtrain" "$prep"; do
    [[ -x "$exe" ]] || { echo "plan_accuracy: $exe not found (build first)" >&2; exit 2; }
done
GLOBAL="${ACC_GLOBAL:-8}"
STEPS="${ACC_STEPS:-10}"
SEQ="${ACC_SEQ:-128}"
DEFAULT_GRID="s:1:none:1:1:fp32 s:1:none:8:1:fp32 s:2:selective:2:1:fp32 s:3:full:4:1:fp32 s:1:auto:8:1:bf16 s:3:none:2:1:bf16
s:1:none:4:2:fp32 s:2:none:4:2:fp32 s:3:none:4:2:fp32 s:3:full:2:2:fp32 s:2:selective:8:2:bf16 s:1:auto:1:2:fp32
m:1:none:1:1:fp32 m:1:none:8:1:fp32 m:2:selective:4:1:fp32 m:3:full:2:1:fp32 m:1:auto:4:1:bf16 m:3:none:8:1:bf16
m:1:none:4:2:fp32 m:2:none:2:2:fp32 m:3:none:4:2:fp32 m:3:full:8:2:fp32 m:2:selective:1:2:bf16 m:1:full:2:2:fp32"
CLUSTER="${ACC_CLUSTER:-}"
if [[ -n "$CLUSTER" ]]; then
    [[ "$CLUSTER" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] ||
        { echo "plan_accuracy: ACC_CLUSTER=$CLUSTER: expected a link rate in tc's units (200mbit, 1gbit, ...)" >&2; exit 2; }
    [[ "$(id -u)" == 0 ]] || { echo "plan_accuracy: ACC_CLUSTER needs root (the test cluster's namespaces and daemons)" >&2; exit 2; }
    DEFAULT_GRID="m:1:none:4:2:fp32 m:2:none:4:2:fp32 m:3:none:4:2:fp32 m:3:full:2:2:fp32 m:2:selective:8:2:bf16
m:1:auto:1:2:fp32 m:3:sqrt:8:2:fp32 m:1:none:2:2:bf16 s:1:none:8:2:fp32 s:3:selective:2:2:fp32"
fi
GRID="${ACC_GRID:-$DEFAULT_GRID}"
if [[ -n "$CLUSTER" ]]; then
    for row in $GRID; do
        IFS=: read -r _ _ _ _ n _ <<<"$row"
        [[ "$n" == 2 ]] || { echo "plan_accuracy: ACC_CLUSTER: row $row has $n rank(s): every row runs on the 2 nodes" >&2; exit 2; }
    done
fi
TEXT="${ACC_TEXT:-/usr/share/common-licenses/GPL-3}"
[[ -r "$TEXT" ]] || TEXT="$root/docs/recompute.md"
if [[ -n "$CLUSTER" ]]; then
    work="${ACC_WORK:-$root/runs/plan-accuracy-cluster-$(date -u +%Y%m%d-%H%M%S)}"
    work="$(realpath -m "$work")"
    case "$work" in /tmp | /tmp/* | /dev/shm | /dev/shm/*)
        echo "plan_accuracy: ACC_WORK=$work: the test cluster's nodes have their own /tmp and /dev/shm (expected a directory elsewhere, such as runs/...)" >&2
        exit 2 ;;
    esac
else
    work="${ACC_WORK:-$(mktemp -d -t plan_accuracy.XXXXXX)}"
fi
mkdir -p "$work"
"$prep" --val-fraction 0 -o "$work/text" "$TEXT" >/dev/null
write_ini() { # shape -> ini
    local dim=128 layers=4 ffn=352 heads=4
    if [[ "$1" == m ]]; then dim=256 layers=6 ffn=704 heads=8; fi
    cat >"$work/$1.ini" <<EOF
[model]
dim = $dim
n_layers = $layers
n_heads = $heads
n_kv_heads = $((heads / 2))
vocab_size = 256
ffn_dim = $ffn
max_seq_len = $SEQ
dropout = 0
[train]
seq_len = $SEQ
micro_batch = 1
steps = $STEPS
warmup_steps = 1
seed = 1
device = cpu
[data]
train = $work/text.train.bin
val =
[checkpoint]
dir =
[log]
every = 1
EOF
}
write_ini s
write_ini m
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}"
RPN=0 # --plan's ranks per node: 0 for the row's ranks (one host)
if [[ -n "$CLUSTER" ]]; then
    export XDG_CACHE_HOME="$work/cache" # where the nodes (their own host names) keep their calibrations
    bash "$root/tests/cluster/cluster.sh" up 2 --link "$CLUSTER" >"$work/cluster.env"
    trap 'bash "$root/tests/cluster/cluster.sh" down >/dev/null 2>&1' EXIT
    eval "$(cat "$work/cluster.env")"
    RPN=1
fi
launch() { # ranks, command...
    local n="$1"; shift
    local root_flag=()
    [[ "$(id -u)" == 0 ]] && root_flag=(--allow-run-as-root)
    if [[ "$n" == 1 ]]; then "$@"
    elif [[ -n "$CLUSTER" ]]; then
        srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --mpi=pmix --export=ALL,OMP_NUM_THREADS=1 "$@"
    else mpirun "${root_flag[@]}" --oversubscribe -np "$n" "$@"; fi
}
plan() { # gtrain --plan ARGS...: here, or on the cluster's first node (whose host name keys its calibration)
    if [[ -n "$CLUSTER" ]]; then
        srun --nodes=1 --ntasks=1 --cpus-per-task=1 --export=ALL,OMP_NUM_THREADS=1 "$gtrain" --plan "$@"
    else "$gtrain" --plan "$@"; fi
}
budget_between() { # config, overrides... -> MiB half-way between the policy table's none and full totals
    plan "$@" memory.recompute=none memory.budget=0 2>/dev/null | python3 -c '
import re, sys
t = dict(re.findall(r"^  (none|full) +[0-9.]+ [KMG]?i?B +([0-9.]+) MiB", sys.stdin.read(), re.M))
print("%.2f" % ((float(t["none"]) + float(t["full"])) / 2))'
}
if [[ -n "${ACC_CALIBRATE:-}" ]]; then
    for key in $(for row in $GRID; do IFS=: read -r sh st pol mb n prec <<<"$row"; echo "$sh:$n:$prec"; done | sort -u); do
        IFS=: read -r sh n prec <<<"$key"
        echo "plan_accuracy: calibrating $sh, $n rank(s), $prec ..." >&2
        launch "$n" "$gtrain" --calibrate "$work/$sh.ini" "train.precision=$prec" >"$work/calib.$sh.$n.$prec.out" 2>&1 ||
            echo "plan_accuracy: calibration failed, see $work/calib.$sh.$n.$prec.out" >&2
        # how far its rounds were apart (about 1.04 on a quiet machine; --calibrate warns above 1.25)
        sed -n 's/^  each figure the fastest of \([0-9]*\) rounds\{0,1\} of the list (largest \/ smallest round: median \([0-9.]*\))$/plan_accuracy:   its \1 rounds: largest \/ smallest, median \2/p' \
            "$work/calib.$sh.$n.$prec.out" >&2
    done
fi
# Every row runs REPEAT times, in passes over the grid (the second pass in reverse order, so that a
# row's runs are minutes apart and a drift of the machine's speed does not favour one end of the grid);
# each run's first WARMUP steps are left out. measured: the median of every kept step of every run;
# repeat spread: the largest run's median over the smallest's, minus 1: what this machine gives the
# same plan twice, the floor under any error the table can show.
REPEAT="${ACC_REPEAT:-2}"
WARMUP="${ACC_WARMUP:-2}"
(( STEPS > WARMUP )) || { echo "plan_accuracy: ACC_STEPS ($STEPS) must be more than ACC_WARMUP ($WARMUP)" >&2; exit 2; }
read -r -d "" -a rows <<<"$GRID" || true # the rows, split at any white space (newlines too)
row_args() { # row -> args (in the array args), acc, and the row's fields
    IFS=: read -r sh st pol mb n prec <<<"$1"
    acc=$((GLOBAL / mb)); [[ $acc -ge 1 ]] || acc=1
    local shard=(none optimizer gradients parameters)
    args=("train.micro_batch=$mb" "train.grad_accum=$acc" "dist.shard=${shard[$st]}" "memory.recompute=$pol"
          "train.precision=$prec" "memory.budget=0")
    if [[ "$pol" == auto ]]; then # a budget half-way between recompute none's total and full's: none does not fit
        args[5]="memory.budget=$(budget_between --world "$n" "$work/$sh.ini" "${args[@]}")MiB"
    fi
}
for ((pass = 1; pass <= REPEAT; pass++)); do
    for ((k = 0; k < ${#rows[@]}; k++)); do
        i=$k; ((pass % 2 == 0)) && i=$((${#rows[@]} - 1 - k))
        row_args "${rows[$i]}"
        i=$((i + 1))
        ((pass == 1)) && { plan --world "$n" --ranks-per-node "$((RPN ? RPN : n))" "$work/$sh.ini" "${args[@]}" >"$work/$i.plan" 2>&1 || true; }
        launch "$n" "$gtrain" "$work/$sh.ini" "${args[@]}" "log.metrics=$work/$i.$pass.jsonl" >"$work/$i.$pass.out" 2>&1 ||
            rm -f "$work/$i.$pass.jsonl"
    done
done
echo "| shape | ZeRO | recompute | micro x accum | ranks | precision | predicted ms | measured ms | error | runs' medians (ms) | repeat spread | rates |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for ((i = 1; i <= ${#rows[@]}; i++)); do
    row_args "${rows[$((i - 1))]}"
    python3 - "$work" "$i" "$REPEAT" "$WARMUP" "$sh" "$st" "$pol" "$mb x $acc" "$n" "$prec" <<'PY'
import json, os, re, statistics, sys
work, i, repeat, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fields = sys.argv[5:11]
text = open(os.path.join(work, i + ".plan")).read()
m = re.search(r"predicted step( \(from defaults, not measured\))?: ([0-9.]+) ms", text)
pred = float(m.group(2)) if m else float("nan")
rates = "defaults" if (m and m.group(1)) else "calibrated"
other = re.search(r"calibrated with ([0-9]+) ranks? per node", text)
if other and rates == "calibrated":
    rates = "calibrated with %s per node" % other.group(1)
kept, medians = [], []
for p in range(1, repeat + 1):
    f = os.path.join(work, "%s.%d.jsonl" % (i, p))
    if not os.path.exists(f):
        continue
    ms = [json.loads(l)["step_ms"] for l in open(f) if '"step_ms"' in l][warmup:]
    if ms:
        kept += ms
        medians.append(statistics.median(ms))
if not kept:
    print("| %s | %s | %s | %s | %s | %s | %.1f | - | gtrain failed: %s/%s.1.out | | | |" % (*fields, pred, work, i))
    sys.exit(0)
meas = statistics.median(kept)
err = (pred - meas) / meas * 100
spread = (max(medians) / min(medians) - 1) * 100
print("| %s | %s | %s | %s | %s | %s | %.1f | %.1f | %+.0f%% | %s | %.0f%% | %s |" % (
    *fields, pred, meas, err, ", ".join("%.1f" % x for x in medians), spread, rates))
PY
done | tee "$work/table.md"
python3 - "$work/table.md" <<'PY'
import statistics, sys
errs, spreads = [], []
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) >= 11 and c[8].endswith("%") and c[10].endswith("%"):
        errs.append(abs(float(c[8][:-1])))
        spreads.append(float(c[10][:-1]))
if errs:
    print()
    print("%d rows: median |error| %.1f%%, worst %.0f%%; median repeat spread %.1f%%, largest %.0f%%; rows whose "
          "|error| exceeds their repeat spread: %d" % (len(errs), statistics.median(errs), max(errs),
                                                       statistics.median(spreads), max(spreads),
                                                       sum(e > s for e, s in zip(errs, spreads))))
PY
if [[ -n "$CLUSTER" ]]; then
    echo
    echo "on the 2-node test cluster, one rank per node and one thread each, links shaped to $CLUSTER (tc tbf)"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); work dir $work"
    exit 0
fi
# auto's choice under a budget that rules out the obvious plan (the largest micro-batch without
# recompute), against every plan of a small grid that fits the same budget, all measured. As the grid
# above: each plan (auto's own run among them) REPEAT times, in passes (the second in reverse order),
# its measured time the median of every kept step of its runs.
median_ms() { python3 - "$WARMUP" "$@" <<'PY'
import json, os, statistics, sys
warmup, ms = int(sys.argv[1]), []
for f in sys.argv[2:]:
    if os.path.exists(f):
        ms += [json.loads(l)["step_ms"] for l in open(f) if '"step_ms"' in l][warmup:]
print("%.1f" % statistics.median(ms) if ms else "nan")
PY
}
CH_PREC="${ACC_CHOICE_PRECISION:-fp32}"
base=("dist.shard=optimizer" "train.precision=$CH_PREC")
B=$(budget_between "$work/m.ini" "${base[@]}" train.micro_batch=8 train.grad_accum=1)
plans=() # "mb.pol" of every plan that fits, then auto
for mb in 1 2 4 8; do
    for pol in none selective sqrt full; do
        a=("${base[@]}" "train.micro_batch=$mb" "train.grad_accum=$((GLOBAL / mb))" "memory.recompute=$pol" "memory.budget=${B}MiB")
        "$gtrain" --plan "$work/m.ini" "${a[@]}" >"$work/c.$mb.$pol.plan" 2>&1 || true
        fits=$(awk -v p="$pol" '$1 == p && ($NF == "yes" || $NF == "no") {print $NF; exit}' "$work/c.$mb.$pol.plan")
        [[ "$fits" == yes ]] && plans+=("$mb.$pol")
    done
done
auto_args=("${base[@]}" "train.micro_batch=auto" "train.global_batch=$GLOBAL" "memory.recompute=auto" "memory.budget=${B}MiB")
"$gtrain" --plan "$work/m.ini" "${auto_args[@]}" >"$work/c.auto.plan" 2>&1 || true
plans+=(auto)
for ((pass = 1; pass <= REPEAT; pass++)); do
    for ((k = 0; k < ${#plans[@]}; k++)); do
        i=$k; ((pass % 2 == 0)) && i=$((${#plans[@]} - 1 - k))
        p="${plans[$i]}"
        if [[ "$p" == auto ]]; then a=("${auto_args[@]}"); else
            mb=${p%%.*} pol=${p#*.}
            a=("${base[@]}" "train.micro_batch=$mb" "train.grad_accum=$((GLOBAL / mb))" "memory.recompute=$pol" "memory.budget=${B}MiB")
        fi
        "$gtrain" "$work/m.ini" "${a[@]}" "log.metrics=$work/c.$p.$pass.jsonl" >"$work/c.$p.$pass.out" 2>&1 ||
            { echo "plan_accuracy: $p failed, see $work/c.$p.$pass.out" >&2; rm -f "$work/c.$p.$pass.jsonl"; }
    done
done
echo
echo "auto under memory.budget = $B MiB (shape m, 1 rank, ZeRO-1, $CH_PREC, global batch $GLOBAL; micro-batch 8 without recompute does not fit):"
echo
echo "| plan | fits | predicted ms | measured ms |"
echo "|---|---|---|---|"
best_ms= best=
for mb in 1 2 4 8; do
    for pol in none selective sqrt full; do
        pred=$(sed -n 's/^predicted step[^:]*: \([0-9.]*\) ms.*/\1/p' "$work/c.$mb.$pol.plan")
        if [[ " ${plans[*]} " != *" $mb.$pol "* ]]; then echo "| micro $mb, $pol | no | ${pred:--} | - |"; continue; fi
        ms=$(median_ms "$work/c.$mb.$pol".*.jsonl)
        echo "| micro $mb, $pol | yes | $pred | $ms |"
        [[ "$ms" == nan ]] && continue
        if [[ -z "$best_ms" ]] || (($(echo "$ms < $best_ms" | bc))); then best_ms=$ms best="micro $mb, $pol"; fi
    done
done
auto_ms=$(median_ms "$work"/c.auto.*.jsonl)
chose=$(grep -m1 '^micro-batch' "$work/c.auto.plan"; grep -m1 '^auto:' "$work/c.auto.plan")
echo "| auto: $(echo "$chose" | tr '\n' ' ') | yes | $(sed -n 's/^predicted step[^:]*: \([0-9.]*\) ms.*/\1/p' "$work/c.auto.plan") | $auto_ms |"
echo
echo "fastest measured that fits: $best ($best_ms ms); auto's plan measured $auto_ms ms: $(python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print('%+.1f%%' % ((a-b)/b*100))" "$auto_ms" "$best_ms")"
echo
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); work dir $work"
