#!/usr/bin/env bash
# gtrain --calibrate on two ranks of one host: both ranks measure the compute at once (the file says
# 2 ranks reported each figure) and the collectives beside compute (their bandwidth and the compute's
# loss per byte), the key and the file's name say 2 ranks per node, a plan and a run of
# 2 ranks read that file as their own, and a plan of 1 rank reads it only as the nearest, saying so.
# The collectives per link kind: that calibration measures them within a node only, and a plan of 2
# ranks on 2 nodes says it prices between nodes at the defaults; a second calibration with each rank
# a node of its own (GTRAIN_TEST_RANK_IS_NODE) measures them between nodes only, and the file keeps
# both kinds, so that plan then prices between nodes as calibrated.
#   calibrate_ranks.sh GTRAIN GTRAIN_PREP "MPIEXEC;FLAGS..." WORKDIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/work_and_corpus.sh"
cat >run.ini <<INI
[model]
dim = 64
n_layers = 2
n_heads = 2
n_kv_heads = 1
ffn_dim = 128
vocab_size = 256
max_seq_len = 32
[train]
seq_len = 32
micro_batch = 2
steps = 1
warmup_steps = 1
[data]
train = corpus.train.bin
val =
[checkpoint]
dir =
INI
export XDG_CACHE_HOME=$work/cache OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
# one round of the list (the choice among rounds is calibrate_rounds.sh's)
export GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_CALIB_ROUNDS=1
unset GTRAIN_CALIBRATION
fail() { echo "FAIL: $*" >&2; echo "--- output:" >&2; cat out.txt >&2; exit 1; }
"${mpi[@]}" -np 2 "$gtrain" --calibrate run.ini >out.txt 2>&1 || fail "calibrate: exit $?"
grep -q '^  compute measured on 2 ranks at once, each figure the slowest rank' out.txt || fail "no line of the ranks' measurement"
ls cache/gtrain/calibration-*-t1-r1.json >/dev/null 2>&1 && fail "a 1-rank file written"
file="$(ls "$work"/cache/gtrain/calibration-*-t1-r2.json)" || fail "no file of 2 ranks per node"
python3 - "$file" <<'PY' || fail "the file's content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["key"]["ranks_per_node"] == 2 and d["key"]["threads"] == 1, d["key"]
r = d["rates"]
assert r["ranks_measured"] == 2 and r["rank_spread"] >= 1, (r["ranks_measured"], r["rank_spread"])
assert "on 2 ranks, 2 per node" in d["source"], d["source"]
# the collectives beside compute were measured: a bandwidth, and a cost to the compute (>= 0)
assert r["overlap_bytes_per_s"] > 0 and r["overlap_compute_s_per_byte"] >= 0, (r["overlap_bytes_per_s"], r["overlap_compute_s_per_byte"])
# one node: the collectives within it, none between nodes; the pair priced is the node's
assert r["within_node_bytes_per_s"] > 0 and r["within_node_latency_s"] > 0, r
assert r["between_nodes_bytes_per_s"] == 0 and r["overlap_between_nodes"] == 0, r
assert r["collective_bytes_per_s"] == r["within_node_bytes_per_s"], r
PY
grep -q '^  collectives within a node (up to 2 ranks, mpi): latency [0-9.]* us, bandwidth [0-9.]* GB/s$' out.txt ||
    fail "no line of the collectives within a node"
grep -q 'collectives between nodes' out.txt && fail "collectives between nodes measured on one node"
grep -q '^  collectives over 2 ranks (mpi): .*; beside compute [0-9.]* GB/s, the compute losing [0-9.]* ms per MB moved$' out.txt ||
    fail "no line of the collectives beside compute"
"$gtrain" --plan --world 2 run.ini >out.txt 2>&1 || fail "--plan --world 2"
grep -qF "rates: calibrated: $file" out.txt || fail "--plan --world 2 did not read $file"
grep -q "calibrated with" out.txt && fail "--plan --world 2 calls its own file another count's"
grep -q "; collectives within a node: calibrated" out.txt || fail "--plan --world 2: not priced within a node"
"$gtrain" --plan --world 2 --ranks-per-node 1 run.ini >out.txt 2>&1 || fail "--plan --world 2 --ranks-per-node 1"
grep -q "; collectives between nodes (1 rank per node): not calibrated, the defaults' 50 us and 1.25 GB/s" out.txt ||
    fail "--plan of 2 nodes: not priced between nodes at the defaults, or not said"
"$gtrain" --plan run.ini >out.txt 2>&1 || fail "--plan"
grep -qF "rates: calibrated: $file" out.txt && grep -q "calibrated with 2 ranks per node; this run has 1: compute rates may be pessimistic" out.txt ||
    fail "--plan on 1 rank: the 2-rank file not read as the nearest, or not said"
"${mpi[@]}" -np 2 "$gtrain" run.ini >out.txt 2>&1 || fail "run: exit $?"
grep -q "^gtrain: predicted step.*calibrated: $file" out.txt || fail "the run of 2 ranks did not read $file"
grep -q "calibrated with" out.txt && fail "the run of 2 ranks calls its own file another count's"
GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_RANK_IS_NODE=1 "${mpi[@]}" -np 2 "$gtrain" --calibrate run.ini >out.txt 2>&1 ||
    fail "calibrate, each rank a node: exit $?"
grep -q '^  collectives between nodes (2 nodes, one rank each, mpi): latency [0-9.]* us, bandwidth [0-9.]* GB/s$' out.txt ||
    fail "no line of the collectives between nodes"
grep -q 'collectives within a node' out.txt && fail "collectives within a node measured with one rank per node"
python3 - "$file" <<'PY' || fail "the file after both calibrations"
import json, sys
r = json.load(open(sys.argv[1]))["rates"]
# both kinds kept (the second measured between nodes only); the widest kind's pair priced
assert r["within_node_bytes_per_s"] > 0 and r["between_nodes_bytes_per_s"] > 0, r
assert r["collective_bytes_per_s"] == r["between_nodes_bytes_per_s"] and r["overlap_between_nodes"] == 1, r
PY
"$gtrain" --plan --world 2 --ranks-per-node 1 run.ini >out.txt 2>&1 || fail "--plan --world 2 --ranks-per-node 1"
grep -q "; collectives between nodes (1 rank per node): calibrated$" out.txt ||
    grep -q "; collectives between nodes (1 rank per node): calibrated[; ]" out.txt ||
    fail "--plan of 2 nodes after the calibration between nodes: not priced as calibrated"
"$gtrain" --plan --world 2 run.ini >out.txt 2>&1 || fail "--plan --world 2"
grep -q "; collectives within a node: calibrated (beside compute: scaled from between nodes)" out.txt ||
    fail "--plan --world 2 after it: not within a node, or the bandwidth beside compute not scaled"
echo "calibrate_ranks: ok"
