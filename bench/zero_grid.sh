#!/usr/bin/env bash
# zero_grid.sh — the full ZeRO equivalence grid (CI runs a subset: tests/dist_train.cmake):
# W = 1, 2, 4 x dist.shard = none, optimizer, gradients, parameters x memory.recompute = none, full,
# selective x grad_accum = 1, 3 (grad_sync auto, so both step and micro occur), each run checked by
# tests/dist/dist_train.py (per-step comm_bytes, call counts, unit gathers, params/grads peaks against
# the formulas and the planner), then its losses, grad norms and final weights against W = 1 ZeRO-1
# with the same global batch (W x grad_accum micro-batches of 4 sequences): within 1e-5.
#
#   bench/zero_grid.sh [BUILD_DIR]     (default build; OUT=runs/zero_grid-DATE; about 5 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "${1:-build}")
OUT=${OUT:-runs/zero_grid-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
DT=tests/dist/dist_train.py
MPI=(mpiexec --allow-run-as-root --oversubscribe)
export OMP_NUM_THREADS=1
python3 $DT prep --work "$OUT" --prep "$BUILD/gtrain-prep" --fallback-text configs/README.md >/dev/null
fails=0
for W in 1 2 4; do
  for A in 1 3; do
    export DT_GLOBAL_MICROS=$((W * A))
    ref=ref_gm$DT_GLOBAL_MICROS
    if [[ ! -f $OUT/$ref.metrics.jsonl ]]; then
      python3 $DT run --work "$OUT" --name $ref --world 1 --accum $DT_GLOBAL_MICROS --shard optimizer -- \
        "${MPI[@]}" -n 1 "$BUILD/gtrain" >"$OUT/$ref.out" 2>&1 || { echo "FAIL $ref"; fails=$((fails + 1)); }
    fi
    names=()
    for shard in none optimizer gradients parameters; do
      for rec in none full selective; do
        name=w${W}_a${A}_${shard}_${rec}
        if python3 $DT run --work "$OUT" --name $name --world $W --accum $A --shard $shard --recompute $rec -- \
             "${MPI[@]}" -n $W "$BUILD/gtrain" >"$OUT/$name.out" 2>&1; then
          names+=("$name")
        else
          echo "FAIL $name (see $OUT/$name.out)"; fails=$((fails + 1))
        fi
      done
    done
    python3 $DT compare --work "$OUT" --ref $ref "${names[@]}" | tee "$OUT/compare_w${W}_a${A}.txt" ||
      { echo "FAIL compare W=$W A=$A"; fails=$((fails + 1)); }
  done
done
echo "zero_grid: $fails failure(s); runs in $OUT"
((fails == 0))
