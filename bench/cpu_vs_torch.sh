#!/usr/bin/env bash
# cpu_vs_torch.sh — gtrain against PyTorch eager (transformers' LlamaForCausalLM, sdpa, AdamW) on the
# CPU, same shapes, same cores, same number of threads, runs alternating; prints one markdown table
# per config: step time, tokens/s, their ratio, peak memory of each, and each side's share of the
# GEMM ceiling (an sgemm loop at the step's shapes through the OpenBLAS gtrain links, measured by the
# same run). bench/cpu_vs_torch.py does the work; this script finds the pieces. Not a test: numbers
# depend on the machine and on whatever else runs on it (the table gives the load average).
#
#   bench/cpu_vs_torch.sh [BUILD_DIR]          (default: build)
#
# Environment (all optional):
#   CONFIGS="configs/llama100m.ini configs/tiny.ini"   the shapes (micro_batch x seq_len of each)
#   THREADS=2        OpenMP threads of gtrain and torch.set_num_threads of PyTorch
#   STEPS=3 WARMUP=1 timed steps per run and untimed ones before them
#   ROUNDS=2         alternations gtrain, torch, gtrain, torch, ...
#   POLICIES="none full"   recompute policies (torch: gradient_checkpointing_enable for full)
#   PYTHON=/opt/gtrain-venv/bin/python   with torch, transformers and numpy
#   TORCH_MALLOC=auto  a malloc library to preload into a second PyTorch run (auto: tcmalloc's
#                    libtcmalloc_minimal.so.4 when installed, `apt-get install libtcmalloc-minimal4`;
#                    none: PyTorch as installed only)
#   DATA=...         gtrain token file (default: made from /usr/share/common-licenses into OUT)
#   OUT=runs/cpu_vs_torch-DATE   the data file and a JSON of every number
#   CONFIG_DIR=...   read CONFIGS' basenames from here instead (an older binary's own configs)
#   PRECISIONS="fp32"  fp32 and/or bf16: bf16 runs gtrain with train.precision = bf16 against PyTorch
#                    under torch.autocast("cpu", dtype=torch.bfloat16), the ceiling through oneDNN in bf16
#                    ($BUILD/bf16_gemm, bench/bf16_gemm.c), and prints the instruction set oneDNN used
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
GTRAIN=$BUILD/gtrain
[[ -x $GTRAIN ]] || { echo "cpu_vs_torch: $GTRAIN not found (build first, or pass the build dir)" >&2; exit 2; }
PYTHON=${PYTHON:-/opt/gtrain-venv/bin/python}
CONFIGS=${CONFIGS:-configs/llama100m.ini configs/tiny.ini}
THREADS=${THREADS:-2}
STEPS=${STEPS:-3}
WARMUP=${WARMUP:-1}
ROUNDS=${ROUNDS:-2}
POLICIES=${POLICIES:-none full}
STAMP=$(date -u +%Y%m%d-%H%M%S)
OUT=${OUT:-runs/cpu_vs_torch-$STAMP}
mkdir -p "$OUT"

# One OpenMP wait policy for all three (gtrain, torch, the sgemm loop; all use libgomp): gtrain sets
# GOMP_SPINCOUNT=1000 for itself when neither variable is set (src/core/gtrain_main.c), and under
# load libgomp's default spinning would slow the other two by several times, so they get the same.
if [[ -z ${OMP_WAIT_POLICY:-} && -z ${GOMP_SPINCOUNT:-} ]]; then export GOMP_SPINCOUNT=1000; fi

TORCH_MALLOC=${TORCH_MALLOC:-auto}
if [[ $TORCH_MALLOC == auto ]]; then
  TORCH_MALLOC=$(ldconfig -p | awk '/libtcmalloc_minimal\.so\.4 / && !n++ {print $NF}')
elif [[ $TORCH_MALLOC == none ]]; then
  TORCH_MALLOC=
fi
MALLOC_ARGS=()
[[ -n $TORCH_MALLOC ]] && MALLOC_ARGS=(--torch-malloc "$TORCH_MALLOC")

BLAS=$(ldd "$GTRAIN" | awk '/libopenblas/ && !n++ {print $3}')   # no early exit: pipefail would see ldd's SIGPIPE
[[ -n $BLAS ]] || { echo "cpu_vs_torch: $GTRAIN does not link OpenBLAS" >&2; exit 2; }

DATA=${DATA:-}
if [[ -z $DATA ]]; then
  cat /usr/share/common-licenses/* >"$OUT/corpus.txt"
  "$BUILD/gtrain-prep" --val-fraction 0 -o "$OUT/corpus" "$OUT/corpus.txt" >/dev/null
  DATA=$OUT/corpus.train.bin
fi

echo "# gtrain $GTRAIN at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')), BLAS $BLAS, OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-}"
for cfg in $CONFIGS; do
  [[ -n ${CONFIG_DIR:-} ]] && cfg=$CONFIG_DIR/$(basename "$cfg")
  for prec in ${PRECISIONS:-fp32}; do
    # shellcheck disable=SC2086
    "$PYTHON" bench/cpu_vs_torch.py compare --config "$cfg" --gtrain "$GTRAIN" \
      --data "$DATA" --blas "$BLAS" --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" --rounds "$ROUNDS" \
      --policies $POLICIES "${MALLOC_ARGS[@]}" --precision "$prec" --bf16-gemm "$BUILD/bf16_gemm" \
      --json "$OUT/$(basename "$cfg" .ini)-$prec.json"
    echo
  done
done
