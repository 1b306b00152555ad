#!/usr/bin/env bash
# Threads per rank: with OMP_NUM_THREADS unset each rank runs (cores of the node) / (ranks on the
# node) OpenMP threads, at least 1, also under a plain mpirun; OpenBLAS gets the same number; when
# ranks x threads exceed the cores, rank 0 prints one warning line. Also a short run: steps below
# warmup_steps trains, with a note that the warm-up was shortened.
#   threads_per_rank.sh GTRAIN GTRAIN_PREP "MPIEXEC;FLAGS..." WORKDIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/work_and_corpus.sh"
cat >run.ini <<INI
[model]
dim = 16
n_layers = 1
n_heads = 2
n_kv_heads = 1
ffn_dim = 32
max_seq_len = 16
[train]
seq_len = 16
micro_batch = 2
steps = 2
warmup_steps = 20
[data]
train = corpus.train.bin
val =
INI
cores=$(nproc)
fail() { echo "FAIL: $*" >&2; echo "--- output:" >&2; cat out.txt >&2; exit 1; }
run() { env -u OMP_NUM_THREADS "$@" >out.txt 2>&1 || fail "exit code $? from $*"; }
threads_line() { grep -E '^gtrain: threads: ' out.txt || fail "no threads line"; }
warnings() { grep -c 'oversubscribed' out.txt || true; }

# 1. one plain process: every core, no warning; the short run trains with a note
run "$gtrain" run.ini
threads_line | grep -qE "^gtrain: threads: $cores per rank \(OpenMP $cores, OpenBLAS $cores\), 1 rank on the $cores cores? of this node; OMP_NUM_THREADS unset" ||
  fail "1 rank on $cores cores: expected $cores threads"
(($(warnings) == 0)) || fail "warned without oversubscription"
grep -q "warmup_steps 20 is more than steps 2: the warm-up is shortened to 2 steps" out.txt || fail "no warm-up note"
grep -qE "^step 2/2 " out.txt || fail "the short run did not train"
echo "ok: 1 rank: $(threads_line)"

# 2. two ranks, unbound: cores / 2 each (at least 1)
want=$((cores / 2)); ((want >= 1)) || want=1
run "${mpi[@]}" -np 2 --bind-to none "$gtrain" run.ini
threads_line | grep -qE "^gtrain: threads: $want per rank \(OpenMP $want, OpenBLAS $want\), 2 ranks on the $cores cores? " ||
  fail "2 unbound ranks on $cores cores: expected $want threads each"
(($(warnings) == (cores < 2 ? 1 : 0))) || fail "wrong warning count for 2 ranks on $cores cores"
echo "ok: 2 ranks, --bind-to none: $(threads_line)"

# 3. two ranks under mpirun's default binding: never more than cores / 2 each
run "${mpi[@]}" -np 2 "$gtrain" run.ini
t=$(threads_line | sed -E 's/^gtrain: threads: ([0-9]+) per rank.*/\1/')
((t >= 1 && t <= want)) || fail "2 ranks with default binding: $t threads each, expected 1..$want"
echo "ok: 2 ranks, default binding: $(threads_line)"

# 4. OMP_NUM_THREADS above the cores is honoured, with one warning
OMP_NUM_THREADS=$((cores + 1)) "$gtrain" run.ini >out.txt 2>&1 || fail "exit code $?"
threads_line | grep -qE "^gtrain: threads: $((cores + 1)) per rank \(OpenMP $((cores + 1)), OpenBLAS $((cores + 1))\).*OMP_NUM_THREADS=$((cores + 1))$" ||
  fail "OMP_NUM_THREADS=$((cores + 1)) not honoured"
(($(warnings) == 1)) || fail "expected one oversubscription warning"
grep -qE "^gtrain: warning: 1 rank x $((cores + 1)) threads on a node with $cores cores?: oversubscribed" out.txt ||
  fail "warning text"
echo "ok: OMP_NUM_THREADS=$((cores + 1)): $(grep warning: out.txt)"

# 5. more ranks than cores (small machines only): 1 thread each and one warning from rank 0
if ((cores <= 4)); then
  run "${mpi[@]}" -np $((cores + 1)) --bind-to none "$gtrain" run.ini
  threads_line | grep -qE "^gtrain: threads: 1 per rank \(OpenMP 1, OpenBLAS 1\), $((cores + 1)) ranks" ||
    fail "$((cores + 1)) ranks: expected 1 thread each"
  (($(warnings) == 1)) || fail "expected exactly one warning for $((cores + 1)) ranks on $cores cores"
  echo "ok: $((cores + 1)) ranks: $(grep warning: out.txt)"
fi
