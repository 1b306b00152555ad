#!/usr/bin/env bash
# A rank killed in the middle of a ZeRO-3 gather ends the job with an error, never a hang: two ranks
# train with dist.shard = parameters; GTRAIN_TEST_DIE_IN_GATHER makes rank 1 SIGKILL itself as it
# enters its 40th unit all-gather (step 3 or so), while rank 0 is already waiting inside the same
# collective. The launcher must return non-zero within 120 s.
#   rank_death_in_gather.sh GTRAIN GTRAIN_PREP WORKDIR MPIEXEC [MPIEXEC FLAGS...]
set -euo pipefail
gtrain=$1 prep=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$prep" --val-fraction 0 -o corpus /usr/share/common-licenses/* >/dev/null
cat >run.ini <<INI
[model]
dim = 32
n_layers = 2
n_heads = 2
n_kv_heads = 1
ffn_dim = 64
max_seq_len = 32
[train]
seq_len = 32
micro_batch = 2
steps = 10000
warmup_steps = 1
[memory]
recompute = full
[dist]
shard = parameters
[data]
train = corpus.train.bin
val =
[log]
metrics = metrics.jsonl
INI
export OMP_NUM_THREADS=1 GTRAIN_TEST_DIE_IN_GATHER=40
"$@" -np 2 "$gtrain" run.ini >run.log 2>&1 &
launcher=$!
start=$(date +%s)
for _ in $(seq 1200); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$launcher" 2>/dev/null; then
  echo "FAIL: the job still runs 120 s after it started (rank 1 dies within seconds): a hang"
  kill -9 "$launcher" || true
  exit 1
fi
rc=0
wait "$launcher" || rc=$?
echo "the launcher returned $rc after $(( $(date +%s) - start )) s"
tail -n 8 run.log
grep -q "DIE_IN_GATHER: dying in gather 40" run.log || { echo "FAIL: rank 1 did not die in a gather"; exit 1; }
((rc != 0)) || { echo "FAIL: exit status 0 after a rank died"; exit 1; }
echo PASS
