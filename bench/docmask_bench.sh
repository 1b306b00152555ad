#!/usr/bin/env bash
# docmask_bench.sh — what document masking costs on the CPU: tokens/s of the same model trained on
# windows of T tokens packed with documents of L tokens, with data.document_mask off (plain causal
# attention across the documents) and on (block-causal: the attention skips the key blocks a query
# block cannot see, docs/data-format.md "Cost"). Not a test: it prints one markdown table and never
# fails on the numbers, which depend on the machine and whatever else runs on it (the table gives the
# load average). One rank, the real `gtrain` binary.
#
#   bench/docmask_bench.sh [BUILD_DIR]            (default: build)
#
# The data: one gtrain shard per document length, byte-level random tokens 1..255 with the separator
# 0 after every L-1 of them (separator_role = eos), so every window holds documents of L tokens (the
# first and last cut by the window's edges). With document_mask = true, reset_positions is on too.
# tokens/s is the median over the timed steps (steps 2..n) of every round; rounds alternate off and on.
#
# Knobs (environment): BENCH_DOC_LENS ("64 256 1024 2048") BENCH_SEQ (2048) BENCH_DIM (256)
# BENCH_LAYERS (4) BENCH_HEADS (4) BENCH_FFN (704) BENCH_MB (1) BENCH_STEPS (4) BENCH_ROUNDS (2)
# BENCH_WORK (scratch dir; default a new temporary one) OMP_NUM_THREADS (2). Needs python3.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${1:-$root/build}"
build="$(cd "$build" && pwd)"
gtrain="$build/gtrain"
[[ -x $gtrain ]] || { echo "docmask_bench: $gtrain not found (build first, or pass the build dir)" >&2; exit 2; }

lens=${BENCH_DOC_LENS:-64 256 1024 2048}
seq=${BENCH_SEQ:-2048}
dim=${BENCH_DIM:-256}
layers=${BENCH_LAYERS:-4}
heads=${BENCH_HEADS:-4}
ffn=${BENCH_FFN:-704}
mb=${BENCH_MB:-1}
steps=${BENCH_STEPS:-4}
rounds=${BENCH_ROUNDS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
work=${BENCH_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/docmask_bench.XXXXXX")}
mkdir -p "$work"
(( steps >= 2 )) || { echo "docmask_bench: BENCH_STEPS must be at least 2 (the first is a warm-up)" >&2; exit 2; }

# one shard per document length: enough tokens for every window the runs draw
for L in $lens; do
  python3 - "$work/docs$L.bin" "$L" "$(( (seq + 1) * mb * steps * 4 + seq * 4 ))" <<'EOF'
import random, struct, sys
path, L, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(L)
toks = [0 if (i + 1) % L == 0 else rng.randrange(1, 256) for i in range(n)]
with open(path, "wb") as f:
    f.write(struct.pack("<8sIIQII", b"GTRNTOK\0", 1, 2, n, 256, 0) + struct.pack("<%dH" % n, *toks))
EOF
done

cat >"$work/model.ini" <<EOF
[model]
dim = $dim
n_layers = $layers
n_heads = $heads
n_kv_heads = $heads
vocab_size = 256
ffn_dim = $ffn
max_seq_len = $seq
[train]
seq_len = $seq
micro_batch = $mb
steps = $steps
warmup_steps = 1
precision = fp32
device = cpu
[data]
val =
val_every = 0
separator = 0
separator_role = eos
[log]
every = 1000
EOF

# runs: round-robin over rounds, lengths, off/on
for ((r = 0; r < rounds; r++)); do
  for L in $lens; do
    for mask in false true; do
      name="L${L}_${mask}_r$r"
      "$gtrain" "$work/model.ini" "data.train=$work/docs$L.bin" "data.document_mask=$mask" \
        "data.reset_positions=$mask" "log.metrics=$work/$name.jsonl" >"$work/$name.log" 2>&1 ||
        { echo "docmask_bench: the run $name failed, see $work/$name.log" >&2; exit 1; }
    done
  done
done

python3 - "$work" "$rounds" "$seq" "$lens" <<'EOF'
import json, os, statistics, sys
work, rounds, seq, lens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
def rate(L, mask):
    xs = []
    for r in range(rounds):
        recs = [json.loads(l) for l in open(os.path.join(work, "L%s_%s_r%d.jsonl" % (L, mask, r))) if '"loss"' in l]
        xs += [x["tok_per_s"] for x in recs[1:]]  # step 1 is the warm-up
    return statistics.median(xs)
print("document masking on the CPU, T = %d, load average %.2f (%s)" % (seq, os.getloadavg()[0], work))
print()
print("| document tokens | tokens/s, document_mask off | tokens/s, document_mask on | on / off |")
print("|---:|---:|---:|---:|")
for L in lens:
    off, on = rate(L, "false"), rate(L, "true")
    print("| %s | %.0f | %.0f | %.2f |" % (L, off, on, on / off))
EOF
