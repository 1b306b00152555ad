#!/usr/bin/env bash
# gtrain --calibrate runs its list of measurements in rounds and keeps each figure's fastest round:
# rounds in which every timed call is 10 ms slower (GTRAIN_TEST_CALIB_SLOW_ROUND, as a burst of another
# process's load, or a virtual machine's host taking its second core away for seconds), here three of
# the five (the first, third and last), set none of the file's figures: each stays within 2x + 4 ms of
# a clean calibration's, where the first or last round's figure, or the median over the rounds, would
# be 10 ms longer and their mean 6 ms; and the output warns that the machine was busy.
#   calibrate_rounds.sh GTRAIN SOURCE_DIR WORK_DIR
set -euo pipefail
gtrain="$1" src="$2" work="$3"
rm -rf "$work"
mkdir -p "$work"
unset GTRAIN_CALIBRATION
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg="$src/configs/tiny.ini"
# the clean figures, of one round (GTRAIN_TEST_CALIB_ROUNDS=1): a burst of load in it only raises the
# bound the slowed calibration is held to
GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_CALIB_ROUNDS=1 "$gtrain" --calibrate --out "$work/clean.json" "$cfg" >"$work/clean.out" 2>&1 ||
  fail "--calibrate: $(tail -3 "$work/clean.out")"
for slow in 1,3,5; do
  GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_CALIB_SLOW_ROUND=$slow:10 "$gtrain" --calibrate --out "$work/r$slow.json" "$cfg" \
    >"$work/r$slow.out" 2>&1 || fail "--calibrate with rounds $slow slowed: $(tail -3 "$work/r$slow.out")"
  grep -q "^  each figure the fastest of 5 rounds of the list (largest / smallest round: median [0-9.]*)$" "$work/r$slow.out" ||
    fail "not 5 rounds: $(grep rounds "$work/r$slow.out" || tail -3 "$work/r$slow.out")"
  # the slowed rounds differ from the others by far more than a quiet machine's: the user is told
  grep -q "^  warning: the rounds differed by [0-9.]*x: the machine was busy while it measured" "$work/r$slow.out" ||
    fail "no warning of a busy machine with rounds $slow slowed"
  python3 - "$work/r$slow.json" "$work/clean.json" <<'PY' || fail "rounds $slow's slowed calls set a figure of the file"
import json, sys
def calls(path):  # seconds per call of every kernel size and GEMM of the file
    c = json.load(open(path))["rates"]
    out = {(k["op"], k["amount"]): k["seconds"] for k in c["kernels"]}
    for g in c["gemm"]:
        for what, flops in (("forward_flops_per_s", 2.0), ("backward_flops_per_s", 4.0)):
            out[("matmul " + what, g["n"], g["ic"], g["oc"])] = flops * g["n"] * g["ic"] * g["oc"] / g[what]
    return out
slowed, clean = calls(sys.argv[1]), calls(sys.argv[2])
# a figure a slowed round set is 10 ms longer, a mean over the rounds 6 ms; two clean calibrations
# differ by far less than a figure plus 4 ms
bad = [f"{k}: {slowed[k] * 1e3:.3f} ms, clean {clean[k] * 1e3:.3f} ms" for k in clean
       if k in slowed and slowed[k] > 2 * clean[k] + 4e-3]
if len(clean) < 60 or set(clean) != set(slowed):
    bad.append(f"{len(clean)} figures clean, {len(slowed)} slowed, not the same list")
if bad:
    print("\n".join(bad[:10]), file=sys.stderr)
    sys.exit(1)
PY
done
echo "PASS: three slowed rounds of five (the first, the third, the last) set no figure (each the fastest of 5 rounds)"
