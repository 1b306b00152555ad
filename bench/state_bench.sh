#!/usr/bin/env bash
# state_bench.sh — save and load speed of training-state files (parallel HDF5, src/core/state.c).
#
#   bench/state_bench.sh [BUILD_DIR] [N_LAYERS] [RANKS...]      (defaults: build 4 "1 2")
#
# The model is configs/llama1b.ini's (dim 2048, 32 heads / 8 kv heads, ffn 8192, vocab 32000) with
# N_LAYERS of its 16 blocks: the full 1.1B model's state is 13.2 GB (fp32 master + two moments) and
# training it on the CPU needs ~22 GB of RAM besides; 4 layers (0.37B parameters, a 4.5 GB file)
# fit a 24 GB machine at 2 ranks. Per-tensor shapes, and so the HDF5 layout per tensor, are the
# real ones; the file has fewer of them.
#
# For each world size: one run of train.steps=1 with checkpoint.every=1 (one optimizer step on a
# 32-token batch, then the save), then a second identical run, which resumes from that file
# (nothing left to train) and so only loads. gtrain prints both timings on rank 0
# ("saved ...: X GB in Y s", "resumed from ...: X GB read in Y s"); save time includes the fsync of
# the file and of the directory. Loads are measured twice: right after the save (the file is in the
# page cache: "warm") and after dropping the file's pages with posix_fadvise(DONTNEED) ("cold";
# no root needed). Prints a table; the numbers depend on the disk and on what else runs.
set -euo pipefail

BUILD=${1:-build}
LAYERS=${2:-4}
shift $(( $# > 2 ? 2 : $# )) || true
RANKS=${*:-1 2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${GTRAIN_BENCH_DIR:-${TMPDIR:-/tmp}/gtrain-state-bench}
GTRAIN=$BUILD/gtrain
[ -x "$GTRAIN" ] || { echo "state_bench: $GTRAIN not found (build first; first argument = build dir)" >&2; exit 2; }

mkdir -p "$WORK"
# a small byte-level corpus: the data does not matter here
if [ ! -f "$WORK/corpus.train.bin" ]; then
    for i in $(seq 1 400); do echo "training-state benchmark line $i: parallel HDF5, Fletcher32, ZeRO-1"; done > "$WORK/corpus.txt"
    "$BUILD/gtrain-prep" --val-fraction 0 -o "$WORK/corpus" "$WORK/corpus.txt" > /dev/null
fi

drop_file_cache() {
    python3 - "$1" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.fdatasync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
EOF
}

run() { # ranks log overrides...
    local np=$1 log=$2
    shift 2
    local cmd=("$GTRAIN" "$ROOT/configs/llama1b.ini" "model.n_layers=$LAYERS" train.seq_len=32 train.micro_batch=1
               train.grad_accum=1 train.steps=1 train.warmup_steps=0 train.device=cpu train.precision=fp32
               memory.recompute=none "data.train=$WORK/corpus.train.bin" data.val= log.metrics= log.every=1
               checkpoint.every=1 checkpoint.keep=1 "$@")
    if [ "$np" -gt 1 ]; then
        OMP_NUM_THREADS=1 mpiexec -n "$np" --allow-run-as-root --oversubscribe "${cmd[@]}" > "$log" 2>&1
    else
        "${cmd[@]}" > "$log" 2>&1
    fi
}

# "saved PATH: 1.234 GB in 5.67 s (0.22 GB/s)" -> "1.234 5.67 0.22"
field() { sed -n "s/.*$1 .*: \([0-9.]*\) GB\( read\)\? in \([0-9.]*\) s (\([0-9.]*\) GB\/s).*/\1 \3 \4/p" "$2" | tail -1; }

printf '\nstate files of configs/llama1b.ini with %s of 16 layers, %s\n' "$LAYERS" "$(uname -n)"
printf '%-6s %-10s %-10s %-10s %-14s %-10s %-14s %-10s\n' ranks "file GB" "save s" "save GB/s" "load warm s" "GB/s" "load cold s" "GB/s"
for np in $RANKS; do
    dir="$WORK/ck_np$np"
    rm -rf "$dir"
    run "$np" "$WORK/save_np$np.log" "checkpoint.dir=$dir" || { cat "$WORK/save_np$np.log"; exit 1; }
    read -r gb save_s save_bw <<< "$(field saved "$WORK/save_np$np.log")"
    run "$np" "$WORK/load_warm_np$np.log" "checkpoint.dir=$dir" || { cat "$WORK/load_warm_np$np.log"; exit 1; }
    read -r _ warm_s warm_bw <<< "$(field 'resumed from' "$WORK/load_warm_np$np.log")"
    drop_file_cache "$dir/step_00000001.h5"
    run "$np" "$WORK/load_cold_np$np.log" "checkpoint.dir=$dir" || { cat "$WORK/load_cold_np$np.log"; exit 1; }
    read -r _ cold_s cold_bw <<< "$(field 'resumed from' "$WORK/load_cold_np$np.log")"
    printf '%-6s %-10s %-10s %-10s %-14s %-10s %-14s %-10s\n' "$np" "$gb" "$save_s" "$save_bw" "$warm_s" "$warm_bw" "$cold_s" "$cold_bw"
    rm -rf "$dir"
done
echo "(logs in $WORK)"
