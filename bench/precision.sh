#!/usr/bin/env bash
# precision.sh — gtrain fp32 against gtrain bf16 on the CPU of this machine: the measurement behind
# what train.precision = auto takes (docs/precision.md). For each shape, ROUNDS rounds alternate the two
# precisions (fp32 then bf16, so both see the same minutes of a shared machine); each run trains STEPS
# steps and its tok/s is the median of the step lines after the first (the first step builds oneDNN's
# kernels and touches the memory). Prints one table: per shape and precision the median and best of
# the runs' tok/s, bf16's speed-up over fp32, and oneDNN's instruction set.
#
#   bench/precision.sh [BUILD_DIR]          (default build; ROUNDS=3, SHAPES="tiny-1x2 tiny-2x1 100m-1x2")
#
# Shapes: tiny-1x2 = configs/tiny.ini on 1 rank x 2 threads; tiny-2x1 = the same on 2 ranks x 1 thread
# (the quickstart's launch); 100m-1x2 = configs/llama100m.ini (micro_batch 4 x 512 tokens) on 1 rank x
# 2 threads, fewer steps. Needs data/fortunes.* (tools/prepare-corpus.sh).
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GTRAIN=$BUILD/gtrain
ROUNDS=${ROUNDS:-3}
SHAPES=${SHAPES:-tiny-1x2 tiny-2x1 100m-1x2}
[ -x "$GTRAIN" ] || { echo "precision.sh: $GTRAIN not found (build first)" >&2; exit 2; }
[ -f "$ROOT/data/fortunes.train.bin" ] || { echo "precision.sh: run tools/prepare-corpus.sh first" >&2; exit 2; }
cd "$ROOT"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

run() { # shape precision -> the run's median tok/s on stdout
  local shape=$1 prec=$2 log="$out/$1-$2.log"
  case $shape in
    tiny-1x2) "$GTRAIN" configs/tiny.ini train.steps=60 data.val_every=0 train.precision="$prec" >"$log" 2>&1 ;;
    tiny-2x1) OMP_NUM_THREADS=1 "${mpi[@]}" -np 2 "$GTRAIN" configs/tiny.ini train.steps=60 data.val_every=0 \
                train.precision="$prec" >"$log" 2>&1 ;;
    100m-1x2) "$GTRAIN" configs/llama100m.ini data.train=data/fortunes.train.bin data.val= model.vocab_size=256 \
                train.steps=4 train.micro_batch=4 train.precision="$prec" >"$log" 2>&1 ;;
    *) echo "precision.sh: unknown shape $shape" >&2; exit 2 ;;
  esac
  grep -o '| [0-9]* tok/s' "$log" | awk 'NR > 1 { print $2 }' | sort -n |
    awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

isa=$("$GTRAIN" configs/tiny.ini train.steps=1 train.precision=bf16 2>&1 | grep -o 'oneDNN on .*' || echo "no bf16 here")
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; bf16: $isa"
echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), $ROUNDS rounds"
declare -A all
for r in $(seq 1 "$ROUNDS"); do
  for shape in $SHAPES; do
    for prec in fp32 bf16; do
      t=$(run "$shape" "$prec") || { echo "precision.sh: $shape $prec failed:" >&2; tail -5 "$out/$shape-$prec.log" >&2; exit 1; }
      all[$shape-$prec]+="$t "
    done
  done
done
stat() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { printf "%.0f %.0f", v[int((NR + 1) / 2)], v[NR] }'; }
printf '%-10s %-5s %16s %14s %s\n' shape prec "tok/s median" "best" "bf16 / fp32 (median)"
for shape in $SHAPES; do
  read -r f32m f32b <<<"$(stat <<<"${all[$shape-fp32]}")"
  read -r b16m b16b <<<"$(stat <<<"${all[$shape-bf16]}")"
  printf '%-10s %-5s %16s %14s\n' "$shape" fp32 "$f32m" "$f32b"
  printf '%-10s %-5s %16s %14s %.2fx\n' "$shape" bf16 "$b16m" "$b16b" "$(awk -v a="$b16m" -v b="$f32m" 'BEGIN { print a / b }')"
done
echo "ended $(date -u '+%H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
