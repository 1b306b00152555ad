#!/usr/bin/env bash
# gtrain --calibrate measures a micro-batch of the model run whole against the sum of its kernels'
# calibrated seconds and keeps the ratio (in_step_factor) in the file; the time model multiplies the
# compute kernels' seconds by it: the same file with the factor set to 1 and to 2 gives --plan a
# compute time (the step less its optimizer) twice as long, and a file of an older gtrain, without
# the key, prices as 1.
#   calibrate_in_step.sh GTRAIN SOURCE_DIR WORK_DIR
set -euo pipefail
gtrain="$1" src="$2" work="$3"
rm -rf "$work"
mkdir -p "$work"
unset GTRAIN_CALIBRATION
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg="$src/configs/tiny.ini"
"$gtrain" --calibrate --out "$work/c.json" "$cfg" >"$work/calibrate.out" 2>&1 || fail "--calibrate: $(tail -3 "$work/calibrate.out")"
line=$(grep "^  in-step factor: a micro-batch (8 x 128 tokens, 2 blocks) run whole [0-9.]* ms, its kernels one by one [0-9.]* ms: [0-9.]*$" \
  "$work/calibrate.out") || fail "no in-step line: $(grep in-step "$work/calibrate.out" || tail -3 "$work/calibrate.out")"
python3 - "$work" "$line" <<'PY' || fail "the file's in_step_factor"
import json, re, sys
work, line = sys.argv[1], sys.argv[2]
c = json.load(open(f"{work}/c.json"))
f = c["rates"]["in_step_factor"]
whole, alone, printed = map(float, re.findall(r"[0-9]+\.[0-9]+", line))  # the decimals: ms, ms, factor
assert abs(f - printed) < 1e-3 and abs(whole / alone - f) < 0.01 * f, (f, whole, alone, printed)
assert 0.3 < f < 5, f  # kernels in sequence are not 5x slower or 3x faster than alone
for k, v in (("one", 1.0), ("two", 2.0), ("old", None)):
    d = json.loads(json.dumps(c))
    if v is None: del d["rates"]["in_step_factor"]
    else: d["rates"]["in_step_factor"] = v
    json.dump(d, open(f"{work}/{k}.json", "w"))
PY
predict() { # file -> "step_ms optimizer_ms" from --plan's trace (the optimizer's spans)
  "$gtrain" --plan --calibration "$work/$1.json" --trace "$work/$1.trace.json" "$cfg" >"$work/$1.plan" 2>&1 ||
    fail "--plan with $1.json: $(tail -2 "$work/$1.plan")"
  sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p' "$work/$1.plan"
}
one=$(predict one) two=$(predict two) old=$(predict old)
[[ -n $one && -n $two && -n $old ]] || fail "no predicted step: '$one' '$two' '$old'"
python3 - "$work" "$one" "$two" "$old" <<'PY' || fail "--plan did not scale the compute by in_step_factor (1: $one ms, 2: $two ms, absent: $old ms)"
import json, sys
work, one, two, old = sys.argv[1], *map(float, sys.argv[2:])
def optimizer_ms(k):
    ev = json.load(open(f"{work}/{k}.trace.json"))["traceEvents"]
    return sum(e["dur"] for e in ev if e.get("ph") == "X" and e.get("name") == "adamw") / 1e3
o1, o2 = optimizer_ms("one"), optimizer_ms("two")
assert abs(o1 - o2) < 1e-6 * max(o1, 1), (o1, o2)          # the optimizer is not scaled
assert abs((two - o2) - 2 * (one - o1)) < 0.05 * (one - o1) + 0.2, (one, o1, two, o2)
assert abs(old - one) <= 0.1, (old, one)
PY
echo "PASS: in_step_factor $(python3 -c "import json;print(json.load(open('$work/c.json'))['rates']['in_step_factor'])"); --plan's compute: $one ms at 1, $two ms at 2"
