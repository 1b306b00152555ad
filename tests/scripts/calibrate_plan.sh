#!/usr/bin/env bash
# gtrain --calibrate writes the calibration file of this machine's key and gtrain --plan reads it
# (also where gtrain restarts itself with a better BLAS core than OpenBLAS chose):
# before it, --plan marks its predicted step as coming from the defaults; after it, as calibrated,
# naming the file (its key: 1 rank per node); a plan of 2 ranks per node reads it and says it was
# measured on 1; --calibration FILE reads another; a broken file is named and the defaults used.
#   calibrate_plan.sh GTRAIN SOURCE_DIR WORK_DIR
set -euo pipefail
gtrain="$1" src="$2" work="$3"
rm -rf "$work"
mkdir -p "$work"
export XDG_CACHE_HOME="$work/cache"
unset GTRAIN_CALIBRATION
export OMP_NUM_THREADS=1
# the BLAS core gtrain swaps in where OpenBLAS chose a generic one (any CPU here, by the hook): the
# calibration is keyed by the kernels training runs, and --plan must name the same to read it
export GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_BLAS_GENERIC=1
# one round of the list (the choice among rounds is calibrate_rounds.sh's): what the file holds and how
# --plan reads it do not depend on it
export GTRAIN_TEST_CALIB_ROUNDS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg="$src/configs/tiny.ini"
"$gtrain" --plan "$cfg" >"$work/before.out"
grep -q '^predicted step (from defaults, not measured): [0-9.]* ms' "$work/before.out" || fail "--plan before: $(tail -4 "$work/before.out")"
grep -q 'no calibration file .*cache/gtrain/calibration-.*-t1-r1.json' "$work/before.out" || fail "no file named: $(tail -2 "$work/before.out")"
"$gtrain" --calibrate "$cfg" train.micro_batch=2 >"$work/calibrate.out" 2>&1 || fail "--calibrate: $(cat "$work/calibrate.out")"
file="$(ls "$work"/cache/gtrain/calibration-*-t1-r1.json)"
[[ -f "$file" ]] || fail "no calibration file"
python3 - "$file" <<'PY' || fail "the file's content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["key"]["threads"] == 1 and d["key"]["ranks_per_node"] == 1 and d["key"]["backend"] == "cpu", d["key"]
assert d["rates"]["ranks_measured"] == 1 and d["rates"]["rank_spread"] == 1, d["rates"]
r = d["rates"]
assert len({(g["ic"], g["oc"]) for g in r["gemm"]}) == 5, r["gemm"]  # tiny: q/o, k/v, gate/up, down, head
assert all(r[k] > 0 for k in ("matmul_flops_per_s", "attention_forward_flops_per_s", "memory_bytes_per_s", "optimizer_bytes_per_s"))
# every memory-bound kernel of the step, each at several sizes (the rows of 1, 2, 4 and 8 sequences)
ks = r["kernels"]
ops = {k["op"] for k in ks}
want = {"embedding_forward", "embedding_backward", "rmsnorm_forward", "rmsnorm_backward", "rope_forward", "rope_backward",
        "swiglu_forward", "swiglu_backward", "residual_forward", "crossentropy_forward", "crossentropy_backward", "sumsq",
        "to_working"}
assert want <= ops, want - ops
assert all(k["amount"] > 0 and k["seconds"] > 0 for k in ks), ks
assert all(len({k["amount"] for k in ks if k["op"] == op}) >= 3 for op in want), ks
PY
# a second config's shapes join the file; the first's stay (another ffn_dim: gate/up and down differ)
"$gtrain" --calibrate "$cfg" model.ffn_dim=160 >"$work/calibrate2.out" 2>&1 || fail "--calibrate 2: $(cat "$work/calibrate2.out")"
grep -q '^gtrain: kept [0-9]* matrix shapes of the earlier calibration' "$work/calibrate2.out" ||
    fail "second calibration: $(grep kept "$work/calibrate2.out" || tail -2 "$work/calibrate2.out")"
python3 - "$file" <<'PY' || fail "the merged file's content"
import json, sys
g = json.load(open(sys.argv[1]))["rates"]["gemm"]
shapes = {(e["ic"], e["oc"]) for e in g}
assert len(shapes) == 7 and (128, 160) in shapes and (160, 128) in shapes and (128, 352) in shapes and (352, 128) in shapes, sorted(shapes)
assert len(g) == len({(e["n"], e["ic"], e["oc"]) for e in g}), "an entry twice"
PY
"$gtrain" --plan "$cfg" >"$work/after.out"
grep -q '^predicted step: [0-9.]* ms, [0-9]* tokens/s' "$work/after.out" || fail "--plan after: $(tail -4 "$work/after.out")"
grep -qF "calibrated: $file" "$work/after.out" || fail "the file not named: $(tail -1 "$work/after.out")"
grep -q "calibrated with" "$work/after.out" && fail "the run's own count of ranks per node called another: $(tail -1 "$work/after.out")"
# a plan of 2 ranks per node without their file reads the 1-rank file, and says so
"$gtrain" --plan --world 2 "$cfg" >"$work/two.out"
grep -qF "calibrated: $file" "$work/two.out" && grep -q "calibrated with 1 rank per node; this run has 2: compute rates may be optimistic" "$work/two.out" ||
    fail "--world 2 without a 2-rank file: $(tail -1 "$work/two.out")"
# --ranks-per-node, and the launcher's count, say how many of the world share a host
for how in "--ranks-per-node 1" "env OMPI_COMM_WORLD_LOCAL_SIZE=1"; do
    if [[ $how == env* ]]; then $how "$gtrain" --plan --world 2 "$cfg" >"$work/one.out"; else "$gtrain" --plan --world 2 $how "$cfg" >"$work/one.out"; fi
    grep -qF "calibrated: $file" "$work/one.out" && ! grep -q "calibrated with" "$work/one.out" ||
        fail "--world 2 with 1 rank per node ($how): $(tail -1 "$work/one.out")"
done
set +e
"$gtrain" --plan --ranks-per-node 0 "$cfg" >"$work/zero.out" 2>&1
rc=$?
set -e
[[ $rc == 2 ]] && grep -q "^gtrain: --ranks-per-node needs a positive number of ranks$" "$work/zero.out" ||
    fail "--ranks-per-node 0: exit $rc, $(cat "$work/zero.out")"
# every line before the time model's is what it was without a calibration
diff <(sed '/^predicted step/,$d' "$work/before.out") <(sed '/^predicted step/,$d' "$work/after.out") >/dev/null ||
    fail "the memory report changed"
cp "$file" "$work/mine.json"
rm "$file"
"$gtrain" --plan --calibration "$work/mine.json" "$cfg" | grep -qF "calibrated: $work/mine.json" || fail "--calibration FILE"
echo '{"key": 1}' >"$file"
"$gtrain" --plan "$cfg" >"$work/broken.out"
grep -q "from defaults, not measured" "$work/broken.out" && grep -q "not used: .*not a gtrain calibration file" "$work/broken.out" ||
    fail "a broken file: $(tail -1 "$work/broken.out")"
echo "calibrate_plan: ok"
