#!/usr/bin/env bash
# gtrain --calibrate runs its list of measurements in rounds and keeps each figure's median over them:
# a round in which every timed call is 15 ms slower (GTRAIN_TEST_CALIB_SLOW_ROUND, as a burst of
# another process's load) sets none of the file's figures. Every call of the tiny model's kernels and
# GEMMs takes well under 4 ms here; the slowed round's take over 15 ms, and a mean of three rounds
# with one of them slowed over 5 ms.
#   calibrate_rounds.sh GTRAIN SOURCE_DIR WORK_DIR
set -euo pipefail
gtrain="$1" src="$2" work="$3"
rm -rf "$work"
mkdir -p "$work"
unset GTRAIN_CALIBRATION
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg="$src/configs/tiny.ini"
for slow in 1 3; do
  GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_CALIB_SLOW_ROUND=$slow:15 "$gtrain" --calibrate --out "$work/r$slow.json" "$cfg" \
    >"$work/r$slow.out" 2>&1 || fail "--calibrate with round $slow slowed: $(tail -3 "$work/r$slow.out")"
  grep -q "^  each figure the median of 3 rounds of the list (largest / smallest round: median [0-9.]*)$" "$work/r$slow.out" ||
    fail "not 3 rounds: $(grep rounds "$work/r$slow.out" || tail -3 "$work/r$slow.out")"
  python3 - "$work/r$slow.json" <<'PY' || fail "round $slow's slowed calls set a figure of the file"
import json, sys
c = json.load(open(sys.argv[1]))["rates"]
limit = 4e-3
bad = [f"{k['op']} {k['amount']:.0f}: {k['seconds'] * 1e3:.2f} ms" for k in c["kernels"] if k["seconds"] > limit]
for g in c["gemm"]:
    for what, flops in (("forward_flops_per_s", 2.0), ("backward_flops_per_s", 4.0)):
        s = flops * g["n"] * g["ic"] * g["oc"] / g[what]
        if s > limit:
            bad.append(f"matmul {g['n']}x{g['ic']}->{g['oc']} {what}: {s * 1e3:.2f} ms")
if len(c["kernels"]) < 40 or len(c["gemm"]) < 10:
    bad.append(f"only {len(c['kernels'])} kernels and {len(c['gemm'])} GEMMs")
if bad:
    print("\n".join(bad[:10]), file=sys.stderr)
    sys.exit(1)
PY
done
echo "PASS: a slowed first or last round sets no figure (each the median of 3 rounds)"
