#!/usr/bin/env bash
# tests/gpu/run.sh — the one GPU check, sized for about 15 minutes on one H200 (the machine's start
# included, at most 8 result files). The whole run stays under 9 minutes (RUN_BUDGET).
#
# Phases, in order of value; each has its own time limit, cut further to what is left of the budget,
# and is skipped when too little is left:
#   1. ops          test_ops_cuda: every op of the CUDA backend against the CPU backend, fp32 and bf16,
#                   per-row errors, the 7B attention shape, the mma attention variant (and cudnn when
#                   libcudnn loads), bad token ids
#   2. comm         test_comm as a singleton: the MPI, local and NCCL communicators for real at world
#                   size 1 (NCCL: every collective on device buffers)
#   3. trainer      gtrain on configs/tiny.ini: cuda fp32 vs cpu losses, bf16 learns, bit-identical
#                   repeats and recompute policies, the local and the NCCL communicator give the same
#                   losses, GTRAIN_CUDA_SYNC=1 runs, the mma and cudnn attentions track the
#                   default, ZeRO-2 and ZeRO-3 (NCCL) give ZeRO-1's losses bit for bit
#   4. model        the time model against the device: gtrain --calibrate on the CUDA backend at the 1B
#                   shape (seq 2048, micro-batch 4, bf16), then 8 steps of that shape reading the file:
#                   predicted_step_ms (metrics) beside the median measured step_ms of steps 3..8, and
#                   the error. A large error is a measurement, not a failure; FAIL only when the
#                   calibration fails, the run does not read it, or the prediction is missing
#   5. bench-ops    bench_ops_cuda: per-op timings at the 1B and 7B shapes beside their rooflines
#                   (attention: default, mma, cudnn)
#   6. bench-train  gtrain at the 1B shape (seq 2048, micro-batch 4): recompute none, full, selective,
#                   and none with the mma and cudnn attentions: tokens/s, step ms, MFU, peak memory
#   7. bench-torch  PyTorch LlamaForCausalLM (sdpa, bf16 autocast) at the same shape, when torch is there
#   8. sanitize     compute-sanitizer (when the machine has it and it supports the device: on gVisor
#                   machines it refuses the device, which is a SKIP): memcheck over test_ops_cuda's small
#                   shapes, then racecheck over its attention checks (kernels that never ran before;
#                   gtrain's own: the cudnn checks are left out, GT_TEST_NO_CUDNN=1). Last, because the
#                   phases before it give the numbers the targets are about and it may take all it is given
# Each phase prints ONE line on stdout: "PHASE <name> PASS|FAIL|SKIP <key numbers> [<seconds> s]".
#
# cuDNN (train.cuda_attention = cudnn) is dlopen()ed, never bundled: when python3 can import PyTorch's
# nvidia.cudnn package, its lib/ folder (and the folder of a libnvrtc beside it, which cuDNN's
# runtime-compiled engines load) is appended to LD_LIBRARY_PATH; without it the cudnn checks skip.
#
# Files under $OUT (else ./gpu-out): summary.json (one object per phase: status, seconds, key numbers;
# and "model": the model phase's predicted and measured step, when it ran), log.txt (what was printed,
# with times) and results.tar.gz (every log, table and metrics file; the calibration file).
#
# Environment:
#   GTRAIN_BUNDLE  a runtime tarball made by tools/bundle-runtime.sh (default .bundle/gtrain-runtime.tar.gz
#                  when it exists): unpacked to a temporary folder, its env.sh sourced, its binaries used
#   BUILD_DIR      otherwise, a build folder holding gtrain, gtrain-prep and tests/ (default build)
#   RUN_BUDGET     seconds for the whole run (default 520)
#   PHASES         the phases to run, space separated (default: all eight)
#   GPU_RUN_FORCE  1: run the phases even when nvidia-smi sees no GPU (they then fail or skip on their own)
#   GPU_MODEL_SMALL 1: the model phase at a small shape (configs/tiny.ini, seq 32, micro-batch 1, 6 steps)
#                  instead of the 1B one: how its path is tested without a GPU, on the CUDA emulation
#                  (gtrain_emulated) or with GPU_MODEL_DEVICE=cpu
#   GPU_MODEL_DEVICE the model phase's train.device (default cuda; cpu runs it in fp32)
# Exit status: 0 when no phase failed (skips included), 1 otherwise.
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
T_START=$(date +%s)
RUN_BUDGET="${RUN_BUDGET:-520}"
PHASES="${PHASES:-ops comm trainer model bench-ops bench-train bench-torch sanitize}"
OUT_DIR="${OUT:-./gpu-out}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gtrain-gpu.XXXXXX")"
RES="$WORK/results"   # what goes into results.tar.gz
mkdir -p "$RES"
LOG="$OUT_DIR/log.txt"
: > "$LOG"
PHASE_LINES="$WORK/phases.tsv" # name, status, seconds, key numbers (tab separated)
: > "$PHASE_LINES"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >> "$LOG"; }
elapsed() { echo $(($(date +%s) - T_START)); }
left() { echo $((RUN_BUDGET - $(elapsed))); }

# phase_line NAME STATUS SECONDS TEXT: the one stdout line of a phase, and its summary entry
phase_line() {
    local line
    line=$(printf 'PHASE %-11s %s %s [%s s]' "$1" "$2" "$4" "$3")
    echo "$line"
    echo "$line" >> "$LOG"
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$PHASE_LINES"
}

# limit_for WANTED: the seconds a phase may use (its own limit, cut to what is left, 10 s kept for
# packing up); 0 when too little is left to start it
limit_for() {
    local want=$1 rest
    rest=$(($(left) - 10))
    if [ "$rest" -lt 15 ]; then echo 0; elif [ "$rest" -lt "$want" ]; then echo "$rest"; else echo "$want"; fi
}

# run_timed LIMIT LOGFILE CMD...: runs CMD with a time limit, output to LOGFILE; returns its status
# (124 when the limit stopped it)
run_timed() {
    local lim=$1 out=$2
    shift 2
    log "run (limit ${lim}s): $*"
    timeout --kill-after=5 "$lim" "$@" > "$out" 2>&1
    local rc=$?
    log "exit $rc: $*"
    return $rc
}

wants() { case " $PHASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# ---------------------------------------------------------------- setup: runtime, binaries, GPU

BUNDLE="${GTRAIN_BUNDLE:-}"
[ -z "$BUNDLE" ] && [ -f "$ROOT/.bundle/gtrain-runtime.tar.gz" ] && BUNDLE="$ROOT/.bundle/gtrain-runtime.tar.gz"
if [ -n "$BUNDLE" ]; then
    RT="$WORK/rt"
    mkdir -p "$RT"
    if tar -xzf "$BUNDLE" -C "$RT" >> "$LOG" 2>&1 && [ -f "$RT/env.sh" ]; then
        # shellcheck disable=SC1091
        . "$RT/env.sh"
        BUILD_DIR="$RT"
        log "runtime bundle $BUNDLE unpacked to $RT (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
    else
        log "could not unpack the runtime bundle $BUNDLE"
    fi
fi
BUILD_DIR="${BUILD_DIR:-build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
GTRAIN="$BUILD_DIR/gtrain"
PREP="$BUILD_DIR/gtrain-prep"
TESTS="$BUILD_DIR/tests"
if [ -x "$BUILD_DIR/bin/gtrain" ]; then # a bundle's layout: bin/, tests/, lib/
    GTRAIN="$BUILD_DIR/bin/gtrain"
    PREP="$BUILD_DIR/bin/gtrain-prep"
fi
log "root $ROOT, binaries from $BUILD_DIR, out $OUT_DIR, budget ${RUN_BUDGET}s, phases: $PHASES"

HAVE_GPU=0
if nvidia-smi -L > "$RES/nvidia-smi-L.txt" 2>&1 && grep -q "^GPU" "$RES/nvidia-smi-L.txt"; then HAVE_GPU=1; fi
[ "${GPU_RUN_FORCE:-0}" = 1 ] && HAVE_GPU=1
{ nvidia-smi 2>&1 || echo "nvidia-smi not available"; } > "$RES/nvidia-smi.txt"
cat "$RES/nvidia-smi-L.txt" >> "$LOG"
HAVE_PY=0
command -v python3 > /dev/null 2>&1 && HAVE_PY=1
# what the programs link against here: a library not found (libnccl, libcudart) is the first thing to read
for b in "$GTRAIN" "$PREP" "$TESTS/test_ops_cuda" "$TESTS/test_comm" "$TESTS/bench_ops_cuda"; do
    [ -e "$b" ] || { log "missing $b"; continue; }
    ldd "$b" > "$RES/ldd-$(basename "$b").txt" 2>&1
    grep "not found" "$RES/ldd-$(basename "$b").txt" | sed "s|^|$(basename "$b"): |" >> "$LOG"
done

# cuDNN from PyTorch's pip packages (nvidia.cudnn: a namespace package in recent wheels, so no __file__)
CUDNN_LIB=""
if [ "$HAVE_PY" = 1 ]; then
    CUDNN_LIB=$(python3 -c 'import os, nvidia.cudnn as m
d = os.path.dirname(m.__file__) if getattr(m, "__file__", None) else list(m.__path__)[0]
print(os.path.join(d, "lib"))' 2> /dev/null || true)
fi
if [ -n "$CUDNN_LIB" ] && [ -d "$CUDNN_LIB" ]; then
    # libnvrtc's folder there also holds libcudart, libcublasLt...: link only libnvrtc* into a folder of
    # its own, so that nothing else the programs load changes
    NVRTC_LIB=$(find "$(dirname "$(dirname "$CUDNN_LIB")")" -maxdepth 3 -name 'libnvrtc.so.*' 2> /dev/null | head -n 1)
    if [ -n "$NVRTC_LIB" ]; then
        mkdir -p "$WORK/nvrtc"
        ln -sf "$(dirname "$NVRTC_LIB")"/libnvrtc* "$WORK/nvrtc/" 2> /dev/null || true
        NVRTC_LIB="$WORK/nvrtc"
    fi
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDNN_LIB${NVRTC_LIB:+:$NVRTC_LIB}"
    log "cuDNN for train.cuda_attention = cudnn: $CUDNN_LIB (nvrtc: ${NVRTC_LIB:-none found}) appended to LD_LIBRARY_PATH"
else
    log "no cuDNN from python3's nvidia.cudnn package: the train.cuda_attention = cudnn checks will skip"
fi

skip_all_reason=""
[ "$HAVE_GPU" = 1 ] || skip_all_reason="no GPU visible (nvidia-smi -L)"

# ---------------------------------------------------------------- 1. ops

phase_ops() {
    local t0 lim rc key status
    t0=$(date +%s)
    lim=$(limit_for 150)
    [ "$lim" -gt 0 ] || { phase_line ops SKIP 0 "out of time"; return; }
    [ -x "$TESTS/test_ops_cuda" ] || { phase_line ops FAIL 0 "missing $TESTS/test_ops_cuda"; return; }
    (cd "$WORK" && run_timed "$lim" "$RES/ops.log" "$TESTS/test_ops_cuda")
    rc=$?
    key=$(grep -E "checks failed" "$RES/ops.log" | tail -n 1)
    # the 7B attention shape's errors, per variant (tensor-relative, then worst row)
    local a7
    a7=$(grep -E "^(ok|FAIL) +bf16 +attention (out|dq) B1 T2048" "$RES/ops.log" | grep -v "per row" |
        sed -E 's/.*attention (out|dq) .*rel err ([0-9.e+-]+).*/\1 \2/' | tr '\n' ' ')
    local m7 c7 cu
    m7=$(grep -E "^(ok|FAIL) +bf16 +attention (out|dq) mma B1 T2048" "$RES/ops.log" | grep -v "per row" |
        sed -E 's/.*attention (out|dq) mma .*rel err ([0-9.e+-]+).*/\1 \2/' | tr '\n' ' ')
    c7=$(grep -E "^(ok|FAIL) +bf16 +attention (out|dq) cudnn B1 T2048" "$RES/ops.log" | grep -v "per row" |
        sed -E 's/.*attention (out|dq) cudnn .*rel err ([0-9.e+-]+).*/\1 \2/' | tr '\n' ' ')
    # cudnn: the calls it took, or why it was skipped, or its one fallback line
    cu=$(grep -m1 -E "^(ok|FAIL|SKIP) +bf16 +attention cudnn" "$RES/ops.log" | sed -E 's/^[A-Z]+ +bf16 +attention //')
    grep -m1 "train.cuda_attention = cudnn:" "$RES/ops.log" >> "$LOG"
    grep -E "^FAIL" "$RES/ops.log" | head -n 5 >> "$LOG"
    if [ $rc -eq 0 ]; then status=PASS; elif [ $rc -eq 77 ]; then status=SKIP; else status=FAIL; fi
    [ $rc -eq 124 ] && key="stopped at the ${lim}s limit; $key"
    phase_line ops "$status" $(($(date +%s) - t0)) "${key:-exit $rc}; 7B attention rel err: default ${a7:-?}, mma ${m7:-?}, cudnn ${c7:-?} (${cu:-cudnn: ?})"
}

# ---------------------------------------------------------------- 2. comm

phase_comm() {
    local t0 lim rc status key
    t0=$(date +%s)
    lim=$(limit_for 40)
    [ "$lim" -gt 0 ] || { phase_line comm SKIP 0 "out of time"; return; }
    [ -x "$TESTS/test_comm" ] || { phase_line comm FAIL 0 "missing $TESTS/test_comm"; return; }
    # a singleton MPI_Init: world size 1, no launcher needed
    (cd "$WORK" && run_timed "$lim" "$RES/comm.log" "$TESTS/test_comm")
    rc=$?
    local nccl local_dev
    nccl=$(grep -E "nccl:" "$RES/comm.log" | head -n 2 | tr -s ' ' | tr '\n' ';')
    local_dev=$(grep -cE "^ok +local: every collective on device" "$RES/comm.log")
    if [ $rc -eq 0 ] && grep -qE "^ok +nccl: every collective" "$RES/comm.log"; then
        status=PASS
    else
        status=FAIL
    fi
    key="exit $rc; $(grep -cE '^ok ' "$RES/comm.log") ok, $(grep -cE '^FAIL ' "$RES/comm.log") FAIL; local on device: $local_dev; $nccl"
    phase_line comm "$status" $(($(date +%s) - t0)) "$key"
}

# ---------------------------------------------------------------- 3. trainer checks

prepare_corpus() {
    [ -f "$WORK/data/corpus.train.bin" ] && return 0
    mkdir -p "$WORK/data"
    local texts=() f
    for f in /usr/share/common-licenses/* "$ROOT"/docs/*.md "$ROOT"/README.md "$ROOT"/configs/*.md; do
        [ -f "$f" ] && texts+=("$f") # a checkout whose path has a space keeps its file names whole
    done
    "$PREP" --val-fraction 0.05 -o "$WORK/data/corpus" "${texts[@]}" > "$RES/prep.log" 2>&1
}

# gt LIMIT LABEL ARGS...: one gtrain run, metrics in $RES/LABEL.jsonl, output in $RES/LABEL.log;
# GT_ENV may hold VAR=VALUE words for its environment
gt() {
    local lim=$1 label=$2
    shift 2
    local config=$1
    shift
    # checkpoint.dir= before the run's own overrides, so that a run may set one
    # shellcheck disable=SC2086
    (cd "$WORK" && run_timed "$lim" "$RES/$label.log" env ${GT_ENV:-} "$GTRAIN" "$config" checkpoint.dir= "$@" \
        data.train="$WORK/data/corpus.train.bin" data.val="$WORK/data/corpus.val.bin" \
        log.metrics="$RES/$label.jsonl" log.every=10)
}

phase_trainer() {
    local t0 lim status key
    t0=$(date +%s)
    lim=$(limit_for 120)
    [ "$lim" -gt 0 ] || { phase_line trainer SKIP 0 "out of time"; return; }
    if [ ! -x "$GTRAIN" ] || [ ! -x "$PREP" ]; then phase_line trainer FAIL 0 "missing $GTRAIN or $PREP"; return; fi
    [ "$HAVE_PY" = 1 ] || { phase_line trainer SKIP 0 "no python3 to compare the runs"; return; }
    prepare_corpus || { phase_line trainer FAIL $(($(date +%s) - t0)) "gtrain-prep failed (prep.log)"; return; }
    local deadline=$(($(date +%s) + lim)) T="train.steps=40 train.warmup_steps=4" runs label args
    # label | environment | overrides
    runs=(
        "tiny-cpu||train.device=cpu train.precision=fp32"
        "tiny-cuda-fp32||train.device=cuda train.precision=fp32"
        "tiny-cuda-bf16||train.device=cuda train.precision=bf16"
        "tiny-cuda-bf16-again||train.device=cuda train.precision=bf16"
        "tiny-cuda-bf16-full||train.device=cuda train.precision=bf16 memory.recompute=full"
        "tiny-cuda-bf16-selective||train.device=cuda train.precision=bf16 memory.recompute=selective"
        "tiny-cuda-bf16-nccl||train.device=cuda train.precision=bf16 dist.comm=nccl"
        "tiny-cuda-bf16-zero2||train.device=cuda train.precision=bf16 dist.shard=gradients dist.grad_sync=micro"
        "tiny-cuda-bf16-zero3-nccl||train.device=cuda train.precision=bf16 dist.shard=parameters dist.grad_sync=micro memory.recompute=full dist.comm=nccl"
        "tiny-cuda-bf16-sync|GTRAIN_CUDA_SYNC=1|train.device=cuda train.precision=bf16"
        "tiny-cuda-bf16-mma||train.device=cuda train.precision=bf16 train.cuda_attention=mma"
        "tiny-cuda-bf16-cudnn||train.device=cuda train.precision=bf16 train.cuda_attention=cudnn"
        "tiny-cpu-bf16||train.device=cpu train.precision=bf16"
        "tiny-cuda-bf16-save||train.device=cuda train.precision=bf16 checkpoint.dir=ck-save checkpoint.every=10"
    )
    local r rest envs
    for r in "${runs[@]}"; do
        IFS='|' read -r label envs args <<< "$r"
        rest=$((deadline - $(date +%s)))
        [ "$rest" -ge 5 ] || { log "trainer: no time left for $label"; break; }
        # shellcheck disable=SC2086
        GT_ENV="$envs" gt "$rest" "$label" "$ROOT/configs/tiny.ini" $T $args
    done
    python3 - "$RES" > "$RES/trainer-checks.txt" 2>&1 <<'PY'
import json, os, sys
res = sys.argv[1]
def losses(label):
    try:
        rows = [json.loads(l) for l in open(os.path.join(res, label + ".jsonl")) if l.strip()]
    except OSError:
        return []
    return [r["loss"] for r in rows if "loss" in r]
def said(label, text):
    try:
        return text in open(os.path.join(res, label + ".log")).read()
    except OSError:
        return False
ok, lines = True, []
def check(name, cond, detail):
    global ok
    ok &= bool(cond)
    lines.append(("PASS " if cond else "FAIL ") + name + ": " + detail)
cpu, f32, b16 = losses("tiny-cpu"), losses("tiny-cuda-fp32"), losses("tiny-cuda-bf16")
n = min(len(cpu), len(f32), len(b16))
check("runs finished", n == 40, f"{len(cpu)}/{len(f32)}/{len(b16)} of 40 steps (cpu/fp32/bf16)")
d32 = max((abs(a - b) for a, b in zip(cpu, f32)), default=float("nan"))
check("fp32 cuda matches cpu", n and d32 < 1e-2, f"max |loss diff| {d32:.3g} (40 steps; ~1e-4 expected)")
d16 = max((abs(a - b) for a, b in zip(cpu, b16)), default=float("nan"))
check("bf16 cuda tracks cpu", n and d16 < 0.1, f"max |loss diff| {d16:.3g}")
check("bf16 learns", n and b16[-1] < b16[0] - 1.0, f"{b16[0]:.3f} -> {b16[-1]:.3f}" if n else "no losses")
check("deterministic", n and b16 == losses("tiny-cuda-bf16-again"), "the same run twice: identical losses")
for pol in ("full", "selective"):
    check(f"recompute {pol} bit-identical", n and losses("tiny-cuda-bf16-" + pol) == b16, "losses vs none")
check("one GPU uses the local communicator", said("tiny-cuda-bf16", "(local)"), "startup line names it")
check("NCCL communicator at world 1", said("tiny-cuda-bf16-nccl", "(nccl)") and losses("tiny-cuda-bf16-nccl") == b16,
      "dist.comm=nccl: same losses as local")
check("GTRAIN_CUDA_SYNC=1", losses("tiny-cuda-bf16-sync") == b16, "same losses, synchronised")
# ZeRO-2 (per-unit reduce-scatters, local communicator) and ZeRO-3 (unit gathers with prefetch, NCCL's
# grouped v-collectives) at one rank: the collectives are copies, so the losses equal ZeRO-1's bit for bit
check("ZeRO-2 micro bit-identical", n and losses("tiny-cuda-bf16-zero2") == b16, "losses vs dist.shard=optimizer")
check("ZeRO-3 over NCCL bit-identical", n and losses("tiny-cuda-bf16-zero3-nccl") == b16,
      "losses vs dist.shard=optimizer")
def tracks(variant):
    v = losses("tiny-cuda-bf16-" + variant)
    d = max((abs(a - b) for a, b in zip(v, b16)), default=float("nan"))
    check(f"{variant} attention tracks default", len(v) == 40 and d < 0.1, f"max |loss diff| {d:.3g}")
    return d
dm = tracks("mma")
# cudnn: its one stderr line when it fell back (no libcudnn here, or cuDNN declined): then the run is the
# default kernels' and only has to finish; otherwise its losses must track the default's
c = losses("tiny-cuda-bf16-cudnn")
dc = max((abs(a - b) for a, b in zip(c, b16)), default=float("nan"))
try:
    fell = [l.strip() for l in open(os.path.join(res, "tiny-cuda-bf16-cudnn.log")) if "train.cuda_attention = cudnn:" in l]
except OSError:
    fell = []
cudnn_how = "fell back: " + fell[0].split("cudnn: ", 1)[-1] if fell else "cuDNN ran" if c else "no steps"
check("cudnn attention tracks default", len(c) == 40 and dc < 0.1, f"max |loss diff| {dc:.3g} ({cudnn_how})")
# asynchronous saves every 10 steps (the snapshot copied from the GPU into pinned host memory): the same
# losses, four saves, and no line saying the host copy could not be pinned
sv = losses("tiny-cuda-bf16-save")
try:
    svlog = open(os.path.join(res, "tiny-cuda-bf16-save.log")).read()
except OSError:
    svlog = ""
check("async saves from the GPU", sv == b16 and svlog.count("written in the background") == 4
      and "could not be pinned" not in svlog, f"{svlog.count('written in the background')} saves, "
      f"losses {'equal' if sv == b16 else 'differ'}, pinned {'no' if 'could not be pinned' in svlog else 'yes'}")
# the CPU's bf16 backend (oneDNN) against the GPU's: both round in the same places but attention's P~ and
# dS (docs/precision.md), so they track as closely as bf16 and fp32 do; a host CPU without bf16
# instructions refuses the run with one line (exit 2): then there is nothing to compare
c16 = losses("tiny-cpu-bf16")
if c16 or not said("tiny-cpu-bf16", "no bf16 instructions"):
    dcb = max((abs(a - b) for a, b in zip(c16, b16)), default=float("nan"))
    check("bf16 cpu tracks bf16 cuda", len(c16) == 40 and dcb < 0.1, f"max |loss diff| {dcb:.3g}")
else:
    lines.append("SKIP bf16 cpu tracks bf16 cuda: the host CPU has no bf16 instructions")
print("\n".join(lines))
print("SUMMARY", "ok" if ok else "failed", f"fp32-vs-cpu {d32:.2g}; bf16-vs-cpu {d16:.2g};"
      f" mma-vs-default {dm:.2g}; cudnn-vs-default {dc:.2g} ({cudnn_how})")
sys.exit(0 if ok else 1)
PY
    local rc=$?
    cat "$RES/trainer-checks.txt" >> "$LOG"
    status=PASS
    [ $rc -eq 0 ] || status=FAIL
    key="$(grep -c '^PASS' "$RES/trainer-checks.txt") checks passed, $(grep -c '^FAIL' "$RES/trainer-checks.txt") failed"
    key="$key; $(grep '^SUMMARY' "$RES/trainer-checks.txt" | cut -d' ' -f3-)"
    [ $rc -eq 0 ] || key="$key; first failure: $(grep -m1 '^FAIL' "$RES/trainer-checks.txt")"
    phase_line trainer "$status" $(($(date +%s) - t0)) "$key"
}

# ---------------------------------------------------------------- 4. the time model against the device

phase_model() {
    local t0 lim rc status key
    t0=$(date +%s)
    lim=$(limit_for 120)
    [ "$lim" -gt 0 ] || { phase_line model SKIP 0 "out of time"; return; }
    if [ ! -x "$GTRAIN" ] || [ ! -x "$PREP" ]; then phase_line model FAIL 0 "missing $GTRAIN or $PREP"; return; fi
    [ "$HAVE_PY" = 1 ] || { phase_line model SKIP 0 "no python3 to read the metrics"; return; }
    prepare_corpus || { phase_line model FAIL $(($(date +%s) - t0)) "gtrain-prep failed (prep.log)"; return; }
    local deadline=$((t0 + lim)) cal="$WORK/calibration.json" config args
    if [ "${GPU_MODEL_SMALL:-0}" = 1 ]; then
        config="$ROOT/configs/tiny.ini"
        args="train.seq_len=32 train.micro_batch=1 train.steps=6"
    else
        config="$ROOT/configs/llama1b.ini"
        args="train.seq_len=2048 train.micro_batch=4 train.steps=8"
    fi
    local device=${GPU_MODEL_DEVICE:-cuda} precision=bf16
    [ "$device" = cuda ] || precision=fp32 # a CPU without bf16 instructions runs it too
    args="$args train.grad_accum=1 train.warmup_steps=1 data.val_every=0 train.device=$device train.precision=$precision"
    # the rates at the run's own shapes, on one rank (its collectives keep their defaults: a one-rank
    # step has none); at most half the phase's time
    # shellcheck disable=SC2086
    (cd "$WORK" && run_timed $((lim / 2)) "$RES/calibrate.log" "$GTRAIN" --calibrate --out "$cal" "$config" $args)
    rc=$?
    if [ $rc -ne 0 ] || [ ! -s "$cal" ]; then
        phase_line model FAIL $(($(date +%s) - t0)) "gtrain --calibrate: exit $rc ($(tail -n 1 "$RES/calibrate.log"))"
        return
    fi
    cp "$cal" "$RES/calibration.json"
    local rest=$((deadline - $(date +%s)))
    [ "$rest" -ge 10 ] || { phase_line model SKIP $(($(date +%s) - t0)) "calibrated, no time left for the run"; return; }
    # shellcheck disable=SC2086
    GT_ENV="GTRAIN_CALIBRATION=$cal" gt "$rest" model-run "$config" $args
    rc=$?
    key=$(python3 - "$RES" "$cal" "$rc" <<'PY'
import json, os, statistics, sys
res, cal, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    rows = [json.loads(l) for l in open(os.path.join(res, "model-run.jsonl")) if '"loss"' in l]
except OSError:
    rows = []
try:
    log = open(os.path.join(res, "model-run.log")).read()
except OSError:
    log = ""
rates = [l for l in log.splitlines() if l.startswith("gtrain: predicted step")]
read_it = bool(rates) and ("calibrated: " + cal) in rates[0]
pred = [r.get("predicted_step_ms") for r in rows]
measured = [r["step_ms"] for r in rows[2:]] or [r["step_ms"] for r in rows[1:]]  # first steps: warm-up
out = {"predicted_step_ms": pred[0] if pred else None, "measured_step_ms": None, "error": None,
       "steps_measured": len(measured), "calibrated": read_it, "exit": rc}
bad = []
if rc != 0:
    bad.append(f"the run exited {rc} (model-run.log)")
if not rows:
    bad.append("no steps in the metrics")
elif not all(isinstance(p, (int, float)) and p > 0 for p in pred):
    bad.append(f"predicted_step_ms missing from the metrics ({pred[0]!r} at step 1)")
if not read_it:
    bad.append("the run did not read the calibration: " + (rates[0] if rates else "no 'predicted step' line"))
if measured and out["predicted_step_ms"]:
    m = statistics.median(measured)
    out["measured_step_ms"] = m
    out["error"] = (out["predicted_step_ms"] - m) / m
json.dump(out, open(os.path.join(res, "model.json"), "w"))
text = "predicted {} ms, measured {} ms (median of {} steps), error {}".format(
    f"{out['predicted_step_ms']:.1f}" if out["predicted_step_ms"] else "?",
    f"{out['measured_step_ms']:.1f}" if out["measured_step_ms"] else "?", len(measured),
    f"{100 * out['error']:+.1f}%" if out["error"] is not None else "?")
text += "; rates " + ("calibrated on this device" if read_it else "NOT the calibration's")
print(("BAD " + "; ".join(bad) + "; " if bad else "OK ") + text)
PY
)
    [ -f "$RES/model.json" ] && cp "$RES/model.json" "$WORK/model.json"
    grep -E "^  |^gtrain: calibrating" "$RES/calibrate.log" >> "$LOG"
    status=FAIL
    case "$key" in OK*) status=PASS ;; esac
    phase_line model "$status" $(($(date +%s) - t0)) "${key#* }"
}

# ---------------------------------------------------------------- 5. per-op benchmark

phase_bench_ops() {
    local t0 lim rc status key
    t0=$(date +%s)
    lim=$(limit_for 100)
    [ "$lim" -gt 0 ] || { phase_line bench-ops SKIP 0 "out of time"; return; }
    [ -x "$TESTS/bench_ops_cuda" ] || { phase_line bench-ops FAIL 0 "missing $TESTS/bench_ops_cuda"; return; }
    (cd "$WORK" && run_timed "$lim" "$RES/bench-ops.txt" "$TESTS/bench_ops_cuda" "$RES/bench-ops.jsonl")
    rc=$?
    if [ $rc -eq 0 ]; then status=PASS; elif [ $rc -eq 77 ]; then status=SKIP; else status=FAIL; fi
    key="exit $rc"
    if [ "$HAVE_PY" = 1 ] && [ -s "$RES/bench-ops.jsonl" ]; then
        key=$(python3 - "$RES/bench-ops.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["shape"], r["op"]): r for r in rows}
out = []
def g(shape, op, field, fmt):
    r = by.get((shape, op))
    return fmt.format(r[field]) if r and field in r else "?"
out.append("copy " + g("-", "copy (device to device)", "gbps", "{:.0f} GB/s"))
out.append("matmul " + g("-", "matmul 8192^3 (cuBLASLt)", "tflops", "{:.0f} TFLOP/s"))
for s in ("1b", "7b"):
    out.append(f"{s}: attn fwd/bwd " + g(s, "attention_forward default", "ms", "{:.2f}") + "/" +
               g(s, "attention_backward default", "ms", "{:.2f}") + " ms (mma " +
               g(s, "attention_forward mma", "ms", "{:.2f}") + "/" +
               g(s, "attention_backward mma", "ms", "{:.2f}") +
               ", cudnn " + g(s, "attention_forward cudnn", "ms", "{:.2f}") + "/" +
               g(s, "attention_backward cudnn", "ms", "{:.2f}") +
               "), est. MFU " + g(s, "step_estimate", "mfu", "{:.0%}"))
print("; ".join(out))
PY
)
    fi
    [ $rc -eq 124 ] && key="stopped at the ${lim}s limit; $key"
    phase_line bench-ops "$status" $(($(date +%s) - t0)) "$key"
}

# ---------------------------------------------------------------- 6. trainer benchmark, 1B shape

phase_bench_train() {
    local t0 lim status key
    t0=$(date +%s)
    lim=$(limit_for 200)
    [ "$lim" -gt 0 ] || { phase_line bench-train SKIP 0 "out of time"; return; }
    if [ ! -x "$GTRAIN" ] || [ ! -x "$PREP" ]; then phase_line bench-train FAIL 0 "missing $GTRAIN or $PREP"; return; fi
    prepare_corpus || { phase_line bench-train FAIL 0 "gtrain-prep failed"; return; }
    local deadline=$(($(date +%s) + lim))
    local B1="train.seq_len=2048 train.micro_batch=4 train.grad_accum=1 train.steps=6 train.warmup_steps=1
              data.val_every=0 train.device=cuda train.precision=bf16"
    "$GTRAIN" --plan "$ROOT/configs/llama1b.ini" train.micro_batch=4 train.device=cuda > "$RES/1b-plan.txt" 2>&1
    local pol rest
    for pol in none full selective none-mma none-cudnn; do
        rest=$((deadline - $(date +%s)))
        [ "$rest" -ge 20 ] || { log "bench-train: no time left for $pol"; break; }
        local attention=default policy=$pol
        [ "$pol" = none-mma ] && attention=mma policy=none
        [ "$pol" = none-cudnn ] && attention=cudnn policy=none
        # shellcheck disable=SC2086
        GT_ENV="" gt "$(((rest < 60) ? rest : 60))" "1b-$pol" "$ROOT/configs/llama1b.ini" $B1 memory.recompute="$policy" \
            train.cuda_attention="$attention"
    done
    if [ "$HAVE_PY" != 1 ]; then phase_line bench-train SKIP $(($(date +%s) - t0)) "no python3 to read the metrics"; return; fi
    key=$(python3 - "$RES" <<'PY'
import json, os, statistics, sys
res, out, ok = sys.argv[1], [], True
for pol in ("none", "full", "selective", "none-mma", "none-cudnn"):
    try:
        rows = [json.loads(l) for l in open(os.path.join(res, f"1b-{pol}.jsonl")) if '"loss"' in l]
    except OSError:
        rows = []
    rows = rows[2:]  # warm-up steps
    if not rows and not os.path.exists(os.path.join(res, f"1b-{pol}.log")):
        out.append(f"{pol}: not run (out of time)")
        continue
    if not rows:
        out.append(f"{pol}: no steps (1b-{pol}.log)")
        ok = False
        continue
    tps = statistics.median(r["tok_per_s"] for r in rows)
    mfu = statistics.median(r["mfu"] for r in rows if r.get("mfu") is not None)
    ms = statistics.median(r["step_ms"] for r in rows)
    mem = max(r["mem_peak_bytes"] for r in rows) / 2**30
    res_b = max((r.get("mem_reserved_bytes") or 0) for r in rows) / 2**30
    out.append(f"{pol}: {tps:.0f} tok/s, {ms:.0f} ms, MFU {mfu:.1%}, peak {mem:.1f} GiB (reserved {res_b:.1f})")
    with open(os.path.join(res, "bench-train.jsonl"), "a") as f:
        f.write(json.dumps({"impl": "gtrain", "label": "1b-s2048-b4-" + pol, "tokens_per_s": tps, "step_ms": ms,
                            "mfu": mfu, "peak_mem_bytes": mem * 2**30}) + "\n")
print(("OK " if ok else "BAD ") + "; ".join(out))
PY
)
    status=FAIL
    case "$key" in OK*) status=PASS ;; esac
    phase_line bench-train "$status" $(($(date +%s) - t0)) "${key#* }"
}

# ---------------------------------------------------------------- 7. PyTorch at the same shape

phase_bench_torch() {
    local t0 lim rc key
    t0=$(date +%s)
    lim=$(limit_for 90)
    [ "$lim" -gt 0 ] || { phase_line bench-torch SKIP 0 "out of time"; return; }
    if [ "$HAVE_PY" != 1 ] || ! python3 -c 'import torch, transformers' > /dev/null 2>&1; then
        phase_line bench-torch SKIP 0 "python3 with torch and transformers not found"
        return
    fi
    run_timed "$lim" "$RES/torch-1b.txt" python3 "$ROOT/bench/torch_llama_bench.py" --dim 2048 --layers 16 \
        --heads 32 --kv-heads 8 --ffn 8192 --vocab 32000 --seq 2048 --batch 4 --steps 6 --warmup 2
    rc=$?
    if [ $rc -ne 0 ]; then
        phase_line bench-torch FAIL $(($(date +%s) - t0)) "exit $rc (torch-1b.txt)"
        return
    fi
    grep '^{' "$RES/torch-1b.txt" | tail -n 1 >> "$RES/bench-train.jsonl"
    key=$(python3 - "$RES" <<'PY' 2>&1
import json, os, sys
res = sys.argv[1]
d = json.loads([l for l in open(os.path.join(res, "torch-1b.txt")) if l.startswith("{")][-1])
tps = d.get("tokens_per_s", 0)
line = f"torch sdpa amp: {tps:.0f} tok/s, {d.get('step_ms', 0):.0f} ms, peak {d.get('peak_mem_bytes', 0) / 2**30:.1f} GiB"
try:
    rows = [json.loads(l) for l in open(os.path.join(res, "bench-train.jsonl")) if '"gtrain"' in l]
    mine = {r["label"]: r["tokens_per_s"] for r in rows}
    g = mine.get("1b-s2048-b4-none")
    if g and tps:
        line += f"; gtrain none / torch = {g / tps:.2f}x"
except OSError:
    pass
print(line)
PY
)
    phase_line bench-torch PASS $(($(date +%s) - t0)) "$key"
}

# ---------------------------------------------------------------- 8. compute-sanitizer (run last)

phase_sanitize() {
    local t0 lim san rc1 rc2 key status
    t0=$(date +%s)
    lim=$(limit_for 100)
    [ "$lim" -gt 0 ] || { phase_line sanitize SKIP 0 "out of time"; return; }
    san=$(command -v compute-sanitizer || true)
    [ -n "$san" ] || [ ! -x /usr/local/cuda/bin/compute-sanitizer ] || san=/usr/local/cuda/bin/compute-sanitizer
    [ -n "$san" ] || { phase_line sanitize SKIP 0 "compute-sanitizer not found"; return; }
    [ -x "$TESTS/test_ops_cuda" ] || { phase_line sanitize FAIL 0 "missing $TESTS/test_ops_cuda"; return; }
    local half=$((lim * 6 / 10))
    (cd "$WORK" && run_timed "$half" "$RES/sanitize-memcheck.log" "$san" --tool memcheck --error-exitcode 3 \
        --print-limit 20 env GT_TEST_QUICK=1 GT_TEST_NO_CUDNN=1 "$TESTS/test_ops_cuda")
    rc1=$?
    local rest=$((lim - ($(date +%s) - t0)))
    rc2=124
    grep -q "Device not supported" "$RES/sanitize-memcheck.log" 2> /dev/null && rest=0
    if [ "$rest" -ge 10 ]; then
        (cd "$WORK" && run_timed "$rest" "$RES/sanitize-racecheck.log" "$san" --tool racecheck --racecheck-report hazard \
            --error-exitcode 3 --print-limit 20 env GT_TEST_QUICK=1 GT_TEST_ONLY=attention GT_TEST_NO_CUDNN=1 \
            "$TESTS/test_ops_cuda")
        rc2=$?
    fi
    summary() { # LOG: the sanitizer's own summary line, or what stopped it
        grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|Program hit|Invalid" "$1" 2> /dev/null | head -n 2 | tr '\n' ' '
    }
    key="memcheck exit $rc1: $(summary "$RES/sanitize-memcheck.log")| racecheck exit $rc2: $(summary "$RES/sanitize-racecheck.log")"
    if grep -q "Device not supported" "$RES/sanitize-memcheck.log" 2> /dev/null; then
        # gVisor machines: compute-sanitizer refuses the device, then the first allocation fails (999)
        status=SKIP
        key="compute-sanitizer does not support this device (its words: Device not supported)"
    elif [ $rc1 -eq 3 ] || [ $rc2 -eq 3 ]; then
        status=FAIL
    elif [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]; then
        status=PASS
    elif [ $rc1 -eq 77 ]; then
        status=SKIP
    elif [ $rc1 -eq 124 ] || [ $rc2 -eq 124 ]; then
        status=SKIP
        key="stopped at its limit before finishing (no finding so far); $key"
    else
        status=FAIL
    fi
    phase_line sanitize "$status" $(($(date +%s) - t0)) "$key"
}

# ---------------------------------------------------------------- run, then pack up

for p in ops comm trainer model bench-ops bench-train bench-torch sanitize; do
    wants "$p" || continue
    if [ -n "$skip_all_reason" ]; then
        phase_line "$p" SKIP 0 "$skip_all_reason"
        continue
    fi
    case "$p" in
    ops) phase_ops ;;
    comm) phase_comm ;;
    trainer) phase_trainer ;;
    model) phase_model ;;
    sanitize) phase_sanitize ;;
    bench-ops) phase_bench_ops ;;
    bench-train) phase_bench_train ;;
    bench-torch) phase_bench_torch ;;
    esac
done

# summary.json, in plain shell (no python3 needed): one object per phase
json_str() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr -d '\000-\037'; }
{
    printf '{"elapsed_s": %s, "budget_s": %s, "gpu": "%s", "phases": [' "$(elapsed)" "$RUN_BUDGET" \
        "$(json_str "$(grep -m1 "^GPU" "$RES/nvidia-smi-L.txt" 2>/dev/null || echo none)")"
    first=1
    while IFS=$'\t' read -r name status secs text; do
        [ $first = 1 ] || printf ', '
        first=0
        printf '{"phase": "%s", "status": "%s", "seconds": %s, "key": "%s"}' "$name" "$status" "${secs:-0}" \
            "$(json_str "$text")"
    done < "$PHASE_LINES"
    printf ']'
    # the model phase's numbers (one JSON object python3 wrote), when it ran
    if [ -s "$WORK/model.json" ]; then printf ', "model": %s' "$(tr -d '\n' < "$WORK/model.json")"; fi
    printf '}\n'
} > "$OUT_DIR/summary.json"

cp "$PHASE_LINES" "$RES/phases.tsv"
tar -C "$WORK" -czf "$OUT_DIR/results.tar.gz" results 2>> "$LOG" || log "could not pack results.tar.gz"
rm -rf "$WORK"
failed=$(grep -o '"status": "FAIL"' "$OUT_DIR/summary.json" | wc -l)
log "done in $(elapsed) s; $failed phase(s) failed"
echo "gpu run: $(elapsed) s, $failed phase(s) failed; summary.json, log.txt, results.tar.gz in $OUT_DIR"
[ "$failed" -eq 0 ]
