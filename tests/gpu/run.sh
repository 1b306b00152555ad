#!/usr/bin/env bash
# tests/gpu/run.sh — the one GPU check script, for a machine with a GPU (an H200 when one is lent).
#
# Runs, in order, writing logs and tables under $OUT (else ./gpu-out):
#   1. the GPU tests: `ctest -L gpu` in the prepared build (or the test binary itself when the machine
#      has no ctest) -> ctest-gpu.log
#   2. the PyTorch benchmark (bench/torch_llama_bench.py), one JSON line per configuration
#      -> torch-bench.jsonl, and a markdown table of everything -> bench-table.md
#   3. trainer-level checks (gtrain with train.device=cuda): cuda vs cpu losses, bf16 learning,
#      recompute bit-identity, ZeRO-2/3 through NCCL (bit-identical to ZeRO-1 at one rank) and
#      determinism on the GPU, and the ~1B benchmark -> trainer-checks.txt
#
# Environment:
#   BUILD_DIR    the prepared build carried over (default: build); holds tests/test_ops_cuda, gtrain
#   OUT          output folder (default: ./gpu-out)
#   BENCH_SHAPES which torch benchmark set to run: quick (default) | full | none
#   STEP_TIMEOUT seconds allowed per benchmark command (default 300)
#   GTRAIN_ENV   optional env.sh of a runtime bundle to source first
#
# Exit status: 0 when the GPU tests passed (or were skipped for lack of a device), 1 otherwise.
# Benchmarks never fail the script: their errors are logged and the table says so.
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
OUT_DIR="${OUT:-./gpu-out}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
BENCH_SHAPES="${BENCH_SHAPES:-quick}"
STEP_TIMEOUT="${STEP_TIMEOUT:-300}"

log() { printf '[gpu-run %s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$OUT_DIR/run.log"; }

log "root $ROOT, build $BUILD_DIR, out $OUT_DIR"
# a runtime bundle made by ../shared/tools/bundle-runtime.sh (OpenBLAS, Open MPI, HDF5 for a bare
# machine): source its env.sh first when given
if [ -n "${GTRAIN_ENV:-}" ]; then
    # shellcheck disable=SC1090
    . "$GTRAIN_ENV"
fi
{ nvidia-smi 2>&1 || echo "nvidia-smi not available"; } > "$OUT_DIR/nvidia-smi.txt"

# ---------------------------------------------------------------- 1. GPU tests
GPU_TESTS="test_ops_cuda" # the binaries labelled gpu in tests/gpu.cmake
tests_rc=0
ran_ctest=0
if command -v ctest >/dev/null 2>&1 && [ -f "$BUILD_DIR/CTestTestfile.cmake" ]; then
    log "ctest -L gpu"
    (cd "$BUILD_DIR" && ctest -L gpu --output-on-failure) > "$OUT_DIR/ctest-gpu.log" 2>&1 || tests_rc=$?
    ran_ctest=1
    # a build made under another path: ctest cannot find its binaries; run them directly instead
    if grep -q -e "Could not find executable" -e "Not Run" "$OUT_DIR/ctest-gpu.log"; then
        log "ctest could not run the binaries (build made elsewhere?): running them directly"
        ran_ctest=0
        tests_rc=0
    fi
fi
if [ $ran_ctest = 0 ]; then
    # no ctest here (a bare GPU machine): run the GPU test binaries directly; 77 means skipped
    log "running the gpu test binaries directly"
    for name in $GPU_TESTS; do
        t="$BUILD_DIR/tests/$name"
        if [ ! -x "$t" ]; then echo "missing $t" >> "$OUT_DIR/ctest-gpu.log"; tests_rc=1; continue; fi
        (cd "$BUILD_DIR/tests" && "$t") >> "$OUT_DIR/ctest-gpu.log" 2>&1
        rc=$?
        echo "$(basename "$t") exit status $rc (77 = skipped)" >> "$OUT_DIR/ctest-gpu.log"
        if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then tests_rc=$rc; fi
    done
fi
log "gpu tests exit status $tests_rc (details in ctest-gpu.log)"
tail -n 5 "$OUT_DIR/ctest-gpu.log" | tee -a "$OUT_DIR/run.log"

# ---------------------------------------------------------------- 2. PyTorch benchmark
BENCH_JSONL="$OUT_DIR/torch-bench.jsonl"
: > "$BENCH_JSONL"
run_torch() { # args: label, then torch_llama_bench.py arguments
    local label="$1"; shift
    log "torch bench $label: $*"
    if ! timeout "$STEP_TIMEOUT" python3 "$ROOT/bench/torch_llama_bench.py" "$@" \
            > "$OUT_DIR/torch-$label.out" 2> "$OUT_DIR/torch-$label.err"; then
        log "torch bench $label failed (see torch-$label.err)"
        printf '{"impl": "torch", "label": "%s", "error": "failed, see torch-%s.err"}\n' "$label" "$label" >> "$BENCH_JSONL"
        return 0
    fi
    tail -n 1 "$OUT_DIR/torch-$label.out" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["label"]=sys.argv[1]; print(json.dumps(d))' "$label" >> "$BENCH_JSONL"
}

if python3 -c 'import torch, transformers' >/dev/null 2>&1; then
    # 1B-class LLaMA (dim 2048, 16 layers, 16 heads, MHA); the same shapes are gtrain's bench configs
    LLAMA1B=(--dim 2048 --layers 16 --heads 16 --kv-heads 16 --ffn 5632 --vocab 32000)
    case "$BENCH_SHAPES" in
    none) log "torch bench skipped (BENCH_SHAPES=none)" ;;
    quick)
        run_torch 1b-s2048-b4 "${LLAMA1B[@]}" --seq 2048 --batch 4 --steps 8 --warmup 3
        run_torch 1b-s2048-b4-ckpt "${LLAMA1B[@]}" --seq 2048 --batch 4 --steps 8 --warmup 3 --checkpoint
        ;;
    full)
        for b in 4 8; do
            run_torch "1b-s2048-b$b" "${LLAMA1B[@]}" --seq 2048 --batch $b --steps 10
            run_torch "1b-s2048-b$b-ckpt" "${LLAMA1B[@]}" --seq 2048 --batch $b --steps 10 --checkpoint
        done
        run_torch 1b-gqa4-s4096-b2 --dim 2048 --layers 16 --heads 16 --kv-heads 4 --ffn 5632 --vocab 32000 \
            --seq 4096 --batch 2 --steps 10
        run_torch 1b-s2048-b4-purebf16 "${LLAMA1B[@]}" --seq 2048 --batch 4 --steps 10 --precision bf16
        ;;
    esac
else
    log "python3 with torch and transformers not found: torch bench skipped"
fi

# ---------------------------------------------------------------- 3. trainer-level checks
# The same core on the CUDA backend: a) tiny config fp32 on cuda vs cpu (losses within 1e-2, the
# issue's bar; fp32 should in fact agree to ~1e-4), b) bf16 learns, c) recompute policies give
# bit-identical losses on the GPU, d) determinism, e) the 1B-class benchmark with recompute none /
# full / selective. Each run leaves its metrics JSONL here; e) appends summary lines to the table.
GTRAIN_JSONL="$OUT_DIR/gtrain-bench.jsonl"
: > "$GTRAIN_JSONL"
GTRAIN="$BUILD_DIR/gtrain"
trainer_rc=0
if ! nvidia-smi -L >/dev/null 2>&1; then
    log "trainer-level checks skipped: no GPU visible (nvidia-smi -L fails)"
elif [ -x "$GTRAIN" ] && [ -x "$BUILD_DIR/gtrain-prep" ] && [ "${GTRAIN_TRAINER_CHECKS:-1}" = 1 ]; then
    DATA="$OUT_DIR/data"; mkdir -p "$DATA"
    texts=$(ls /usr/share/common-licenses/* 2>/dev/null; ls "$ROOT"/docs/*.md "$ROOT"/README.md "$ROOT"/configs/*.md 2>/dev/null)
    # shellcheck disable=SC2086
    "$BUILD_DIR/gtrain-prep" --val-fraction 0.05 -o "$DATA/corpus" $texts > "$OUT_DIR/prep.log" 2>&1
    D="data.train=$DATA/corpus.train.bin data.val=$DATA/corpus.val.bin"
    gt() { # label, then gtrain arguments; metrics land in $OUT_DIR/<label>.jsonl
        local label="$1"; shift
        log "gtrain $label: $*"
        # shellcheck disable=SC2086
        timeout "$STEP_TIMEOUT" "$GTRAIN" "$@" $D log.metrics="$OUT_DIR/$label.jsonl" log.every=10 \
            > "$OUT_DIR/$label.log" 2>&1 || { log "gtrain $label failed: exit $?"; trainer_rc=1; }
    }
    summarize() { # metrics label, table label: one summary line of a benchmark run for the table
        python3 - "$OUT_DIR/$1.jsonl" "$2" >> "$GTRAIN_JSONL" <<'PY' || true
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][2:]  # skip warm-up steps
print(json.dumps({"impl": "gtrain", "label": "1b-s2048-b4-" + sys.argv[2],
                  "tokens_per_s": statistics.median(r["tok_per_s"] for r in rows),
                  "step_ms": statistics.median(r["step_ms"] for r in rows),
                  "mfu": statistics.median(r["mfu"] for r in rows),
                  "act_peak_bytes": max(r["act_peak_bytes"] for r in rows),
                  "peak_mem_bytes": max(r["mem_peak_bytes"] for r in rows)}))
PY
    }
    T="train.steps=40 train.warmup_steps=4"
    gt tiny-cpu configs/tiny.ini $T train.device=cpu
    gt tiny-cuda-fp32 configs/tiny.ini $T train.device=cuda train.precision=fp32
    gt tiny-cuda-bf16 configs/tiny.ini $T train.device=cuda train.precision=bf16
    gt tiny-cuda-bf16-again configs/tiny.ini $T train.device=cuda train.precision=bf16
    for pol in full selective uniform:2; do
        gt "tiny-cuda-bf16-${pol/:/}" configs/tiny.ini $T train.device=cuda train.precision=bf16 memory.recompute=$pol
    done
    # ZeRO-2 (per-unit reduce-scatters) and ZeRO-3 (unit gathers, prefetch) on one GPU through NCCL: the
    # collectives are copies at one rank, so the losses must equal ZeRO-1's bit for bit
    gt tiny-cuda-bf16-zero2 configs/tiny.ini $T train.device=cuda train.precision=bf16 dist.shard=gradients dist.grad_sync=micro
    gt tiny-cuda-bf16-zero3 configs/tiny.ini $T train.device=cuda train.precision=bf16 dist.shard=parameters dist.grad_sync=micro memory.recompute=full
    python3 - "$OUT_DIR" > "$OUT_DIR/trainer-checks.txt" 2>&1 <<'PY' || trainer_rc=1
import json, sys, os
out = sys.argv[1]
def losses(label):
    rows = [json.loads(l) for l in open(os.path.join(out, label + ".jsonl"))]
    return [r["loss"] for r in rows if "loss" in r]
ok = True
def check(name, cond, detail):
    global ok
    ok &= bool(cond)
    print(("PASS " if cond else "FAIL ") + name + ": " + detail)
cpu, f32, b16 = losses("tiny-cpu"), losses("tiny-cuda-fp32"), losses("tiny-cuda-bf16")
d = max(abs(a - b) for a, b in zip(cpu, f32))
check("fp32 cuda matches cpu", d < 1e-2, f"max |loss diff| over {len(cpu)} steps = {d:.3g}")
d = max(abs(a - b) for a, b in zip(cpu, b16))
check("bf16 cuda tracks cpu", d < 5e-2, f"max |loss diff| = {d:.3g} (bf16)")
check("bf16 learns", b16[-1] < b16[0] - 1.0, f"{b16[0]:.3f} -> {b16[-1]:.3f}")
check("deterministic", b16 == losses("tiny-cuda-bf16-again"), "same run twice, identical losses")
for pol in ("full", "selective", "uniform2"):
    check(f"recompute {pol} bit-identical", losses("tiny-cuda-bf16-" + pol) == b16, "losses vs none")
for z in ("zero2", "zero3"):
    check(f"{z} bit-identical at one rank", losses("tiny-cuda-bf16-" + z) == b16, "losses vs dist.shard=optimizer")
sys.exit(0 if ok else 1)
PY
    cat "$OUT_DIR/trainer-checks.txt" | tee -a "$OUT_DIR/run.log"
    # e) the ~1B benchmark (dim 2048, 16 blocks, seq 2048, bf16, one GPU)
    if [ "$BENCH_SHAPES" != none ]; then
        B1="model.dim=2048 model.n_layers=16 model.n_heads=16 model.n_kv_heads=16 model.ffn_dim=5632
            model.vocab_size=32000 model.max_seq_len=2048 train.seq_len=2048 train.micro_batch=4
            train.grad_accum=1 train.steps=8 train.warmup_steps=1 data.val= checkpoint.dir="
        for pol in none full selective; do
            # shellcheck disable=SC2086
            gt "1b-$pol" configs/llama1b.ini $B1 train.device=cuda train.precision=bf16 memory.recompute=$pol
            summarize "1b-$pol" "$pol"
        done
        # the opt-in tensor-core attention (src/kernels/cuda/cuda_attention_wmma.cu): the same losses
        # within bf16 noise, hopefully faster
        export GTRAIN_CUDA_ATTENTION=wmma
        gt tiny-cuda-bf16-wmma configs/tiny.ini $T train.device=cuda train.precision=bf16
        # shellcheck disable=SC2086
        gt "1b-none-wmma" configs/llama1b.ini $B1 train.device=cuda train.precision=bf16 memory.recompute=none
        unset GTRAIN_CUDA_ATTENTION
        summarize "1b-none-wmma" "none-wmma"
        "$GTRAIN" --plan configs/llama1b.ini $B1 train.device=cuda > "$OUT_DIR/1b-plan.txt" 2>&1 || true
    fi
else
    log "trainer-level checks skipped (no $GTRAIN or GTRAIN_TRAINER_CHECKS=0)"
fi
[ $trainer_rc -ne 0 ] && tests_rc=1

# ---------------------------------------------------------------- table
python3 - "$BENCH_JSONL" "$GTRAIN_JSONL" > "$OUT_DIR/bench-table.md" <<'PY' || log "could not build bench-table.md"
import json, sys
rows = []
for path in sys.argv[1:]:
    try:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    except OSError:
        pass
print("| impl | label | precision | recompute | tokens/s | step ms | peak mem GiB | model TFLOP/s |")
print("|---|---|---|---|---:|---:|---:|---:|")
for r in rows:
    if "error" in r:
        print(f"| {r.get('impl','?')} | {r.get('label','?')} | | | error: {r['error']} | | | |")
        continue
    gib = r.get("peak_mem_bytes", 0) / 2**30
    print(f"| {r.get('impl')} | {r.get('label')} | {r.get('precision')} | {'full' if r.get('checkpoint') else 'none'} "
          f"| {r.get('tokens_per_s')} | {r.get('step_ms')} | {gib:.2f} | {r.get('model_tflops')} |")
PY
tee -a "$OUT_DIR/run.log" < "$OUT_DIR/bench-table.md"

log "done; gpu tests status $tests_rc"
[ "$tests_rc" -eq 0 ]
