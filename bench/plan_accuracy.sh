#!/usr/bin/env bash
# plan_accuracy.sh — the time model against the trainer: for each configuration of a grid, the step
# time `gtrain --plan` predicts (from the calibration file, docs/planner.md) and the median step_ms
# the trainer measures. Not a test: it prints a markdown table and never fails on the numbers.
#
#   bench/plan_accuracy.sh [BUILD_DIR]            (default: build)
#
# Each row: a model shape, a ZeRO stage, a recompute policy, micro-batch x grad_accum (the global
# batch held at ACC_GLOBAL sequences per rank), ranks, precision. The trainer runs ACC_STEPS steps;
# the first is a warm-up and is left out of the median. Calibrate first, on a quiet machine, with the
# same ranks the rows use (mpirun -np 2 build/gtrain --calibrate CONFIG for the 2-rank rows): the
# calibration is keyed by threads per rank, so each rank count reads its own file. Rows whose rates
# came from the defaults are marked.
#
# Knobs (environment): ACC_GRID: rows "shape:stage:policy:micro_batch:ranks:precision" separated by
# spaces (shape: s (dim 128, 4 blocks) or m (dim 256, 6 blocks)); default: a 24-row grid over both
# shapes, ZeRO-1/2/3, recompute none/selective/full/auto, micro-batch 1 to 8, 1 and 2 ranks, fp32 and
# bf16. ACC_GLOBAL (8) ACC_STEPS (6) ACC_SEQ (128) ACC_CALIBRATE=1 runs --calibrate for each shape,
# precision and rank count first. ACC_WORK (scratch dir; default a new temporary one). Needs python3
# and, for 2-rank rows, mpirun.
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
STEPS="${ACC_STEPS:-6}"
SEQ="${ACC_SEQ:-128}"
DEFAULT_GRID="s:1:none:1:1:fp32 s:1:none:8:1:fp32 s:2:selective:2:1:fp32 s:3:full:4:1:fp32 s:1:auto:8:1:bf16 s:3:none:2:1:bf16
s:1:none:4:2:fp32 s:2:none:4:2:fp32 s:3:none:4:2:fp32 s:3:full:2:2:fp32 s:2:selective:8:2:bf16 s:1:auto:1:2:fp32
m:1:none:1:1:fp32 m:1:none:8:1:fp32 m:2:selective:4:1:fp32 m:3:full:2:1:fp32 m:1:auto:4:1:bf16 m:3:none:8:1:bf16
m:1:none:4:2:fp32 m:2:none:2:2:fp32 m:3:none:4:2:fp32 m:3:full:8:2:fp32 m:2:selective:1:2:bf16 m:1:full:2:2:fp32"
GRID="${ACC_GRID:-$DEFAULT_GRID}"
TEXT="${ACC_TEXT:-/usr/share/common-licenses/GPL-3}"
[[ -r "$TEXT" ]] || TEXT="$root/docs/recompute.md"
work="${ACC_WORK:-$(mktemp -d -t plan_accuracy.XXXXXX)}"
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
grad_accum = 1
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
launch() { # ranks, command...
    local n="$1"; shift
    local root_flag=()
    [[ "$(id -u)" == 0 ]] && root_flag=(--allow-run-as-root)
    if [[ "$n" == 1 ]]; then "$@"; else mpirun "${root_flag[@]}" --oversubscribe -np "$n" "$@"; fi
}
if [[ -n "${ACC_CALIBRATE:-}" ]]; then
    for key in $(for row in $GRID; do IFS=: read -r sh st pol mb n prec <<<"$row"; echo "$sh:$n:$prec"; done | sort -u); do
        IFS=: read -r sh n prec <<<"$key"
        echo "plan_accuracy: calibrating $sh, $n rank(s), $prec ..." >&2
        launch "$n" "$gtrain" --calibrate "$work/$sh.ini" "train.precision=$prec" >"$work/calib.$sh.$n.$prec.out" 2>&1 ||
            echo "plan_accuracy: calibration failed, see $work/calib.$sh.$n.$prec.out" >&2
    done
fi
echo "| shape | ZeRO | recompute | micro x accum | ranks | precision | predicted ms | measured ms | error | rates |"
echo "|---|---|---|---|---|---|---|---|---|---|"
i=0
for row in $GRID; do
    IFS=: read -r sh st pol mb n prec <<<"$row"
    i=$((i + 1))
    acc=$((GLOBAL / mb)); [[ $acc -ge 1 ]] || acc=1
    shard=(none optimizer gradients parameters)
    args=("train.micro_batch=$mb" "train.grad_accum=$acc" "dist.shard=${shard[$st]}" "memory.recompute=$pol"
          "train.precision=$prec" "memory.budget=0")
    [[ "$pol" == auto ]] && args[5]="memory.budget=64MiB"
    "$gtrain" --plan --world "$n" "$work/$sh.ini" "${args[@]}" >"$work/$i.plan" 2>&1 || true
    launch "$n" "$gtrain" "$work/$sh.ini" "${args[@]}" "log.metrics=$work/$i.jsonl" >"$work/$i.out" 2>&1 || {
        echo "| $sh | $st | $pol | $mb x $acc | $n | $prec | - | - | gtrain failed: $work/$i.out | |"; continue; }
    python3 - "$work/$i.plan" "$work/$i.jsonl" "$sh" "$st" "$pol" "$mb x $acc" "$n" "$prec" <<'PY'
import json, re, statistics, sys
plan, jsonl = sys.argv[1], sys.argv[2]
text = open(plan).read()
m = re.search(r"predicted step( \(from defaults, not measured\))?: ([0-9.]+) ms", text)
pred = float(m.group(2)) if m else float("nan")
rates = "defaults" if (m and m.group(1)) else "calibrated"
steps = [json.loads(l) for l in open(jsonl) if l.strip()]
ms = [s["step_ms"] for s in steps if "step_ms" in s][1:]
meas = statistics.median(ms) if ms else float("nan")
err = (pred - meas) / meas * 100 if ms and m else float("nan")
print("| %s | %s | %s | %s | %s | %s | %.1f | %.1f | %+.0f%% | %s |" % (*sys.argv[3:9], pred, meas, err, rates))
PY
done
echo
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); work dir $work"
