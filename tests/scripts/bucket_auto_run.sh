#!/usr/bin/env bash
# dist.bucket_mb = auto in a run: two ranks of ZeRO-1 (grad_sync = step) calibrate, then train 2 steps
# with the calibration's collective latency set to 0 (buckets hide the reduction behind the backward:
# the search picks a size > 0, the run says so and reduces in buckets) and to a second (each bucket
# costs a second: the search picks 0, one reduction, and the run starts no bucket).
#   bucket_auto_run.sh GTRAIN GTRAIN_PREP "MPIEXEC;FLAGS..." WORKDIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/work_and_corpus.sh"
cat >run.ini <<INI
[model]
dim = 64
n_layers = 2
n_heads = 2
n_kv_heads = 1
ffn_dim = 128
max_seq_len = 32
[train]
seq_len = 32
micro_batch = 2
steps = 2
warmup_steps = 1
[dist]
shard = optimizer
bucket_mb = auto
[data]
train = corpus.train.bin
val =
[log]
metrics = metrics.jsonl
INI
export GTRAIN_CALIBRATION=$work/cal.json OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "FAIL: $*" >&2; echo "--- output:" >&2; cat out.txt >&2; exit 1; }
"${mpi[@]}" -np 2 "$gtrain" --calibrate run.ini >out.txt 2>&1 || fail "calibrate: exit $?"
latency() { python3 - "$1" <<'PY'
import json, sys
d = json.load(open("cal.json"))
# a run of 2 ranks on one node prices its collectives within a node (calib.h)
d["rates"]["within_node_latency_s"] = d["rates"]["collective_latency_s"] = float(sys.argv[1])
json.dump(d, open("cal.json", "w"), indent=1)
PY
}
run() { rm -f metrics.jsonl; "${mpi[@]}" -np 2 "$gtrain" run.ini >out.txt 2>&1 || fail "run: exit $?"; }
buckets() { python3 -c 'import json; print(json.loads(open("metrics.jsonl").read().splitlines()[-1])["buckets"])'; }

latency 0
run
mb=$(sed -n 's/^gtrain: dist.bucket_mb \([0-9.e+-]*\) (auto.*/\1/p' out.txt)
[[ -n $mb ]] || fail "no dist.bucket_mb line"
python3 -c "import sys; sys.exit(0 if float('$mb') > 0 else 1)" || fail "latency 0: bucket_mb $mb, expected > 0"
b=$(buckets)
((b > 0)) || fail "latency 0: bucket_mb $mb chosen, but the step reduced in $b buckets"
echo "latency 0: bucket_mb $mb, $b buckets per step"

latency 1
run
grep -q '^gtrain: dist.bucket_mb 0 (auto' out.txt || fail "a second per collective: expected dist.bucket_mb 0"
b=$(buckets)
((b == 0)) || fail "a second per collective: $b buckets, expected 0"
echo "latency 1 s: bucket_mb 0, no buckets"
