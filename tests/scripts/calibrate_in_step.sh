#!/usr/bin/env bash
# gtrain --calibrate measures a micro-batch of the model (every block of the tiny model) run whole against the sum of its kernels'
# calibrated seconds, at 1, 2, 4 and 8 sequences, and keeps the ratio in the file per model shape and
# size ("in_step": dim, ffn_dim, n_heads, vocab_size, seq_len, micro_batch, factor); a calibration of
# another model keeps it beside its own. The time model multiplies the compute kernels' seconds by the
# factor of the run's model at the plan's micro-batch size: with the tiny model's set to 1 and to 2
# (the other model's at 1), --plan's micro-batch kernels double and the step's own (sum of squares,
# AdamW, conversion to working weights) do not; with the factor set to the size (1, 2, 4, 8) a plan of
# 2 sequences scales by 2, one of 3 by the log2 interpolation between 2 and 4; a file without factors
# prices as 1; a model not calibrated takes the nearest dim's and says so.
#   calibrate_in_step.sh GTRAIN SOURCE_DIR WORK_DIR
set -euo pipefail
gtrain="$1" src="$2" work="$3"
rm -rf "$work"
mkdir -p "$work"
unset GTRAIN_CALIBRATION
export OMP_NUM_THREADS=1
# one round of the list (the choice among rounds is calibrate_rounds.sh's): the factors' sizes and how
# --plan prices them do not depend on it
export GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_CALIB_ROUNDS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg="$src/configs/tiny.ini"
# the config's size (2) is not the largest: the sizes after it are priced at factor 1 too
"$gtrain" --calibrate --out "$work/c.json" "$cfg" train.micro_batch=2 >"$work/calibrate.out" 2>&1 || fail "--calibrate: $(tail -3 "$work/calibrate.out")"
cp "$work/c.json" "$work/first.json"
# every block of the tiny model (4): its largest size takes far less than the cap
line=$(grep "^  in-step factor: a micro-batch (8 x 128 tokens, 4 blocks) run whole [0-9.]* ms, its kernels one by one [0-9.]* ms: [0-9.]*$" \
  "$work/calibrate.out") || fail "no in-step line: $(grep in-step "$work/calibrate.out" || tail -3 "$work/calibrate.out")"
"$gtrain" --calibrate --out "$work/c.json" "$cfg" model.dim=64 model.ffn_dim=160 >"$work/calibrate2.out" 2>&1 ||
  fail "--calibrate of dim 64: $(tail -3 "$work/calibrate2.out")"
python3 - "$work" "$line" <<'PY' || fail "the file's in_step factors"
import json, re, sys
work, line = sys.argv[1], sys.argv[2]
c = json.load(open(f"{work}/c.json"))
shapes = {(e["dim"], e["ffn_dim"], e["n_heads"], e["vocab_size"], e["seq_len"], e["micro_batch"]): e["factor"]
          for e in c["rates"]["in_step"]}
assert set(shapes) == {(d, f, 4, 256, 128, b) for d, f in ((128, 352), (64, 160)) for b in (1, 2, 4, 8)}, sorted(shapes)
f = shapes[(128, 352, 4, 256, 128, 8)]
whole, alone, printed = map(float, re.findall(r"[0-9]+\.[0-9]+", line))  # the decimals: ms, ms, factor
assert abs(f - printed) < 1e-3 and abs(whole / alone - f) < 0.01 * f, (f, whole, alone, printed)
assert 0.3 < f < 5, f  # kernels in sequence are not 5x slower or 3x faster than alone
for k, v in (("one", 1.0), ("two", 2.0), ("old", None), ("sized", "B"), ("inverse", "8/B")):
    d = json.loads(json.dumps(c))
    if v is None: del d["rates"]["in_step"]
    else:
        for e in d["rates"]["in_step"]:
            b = e["micro_batch"]
            e["factor"] = (b if v == "B" else 8.0 / b if v == "8/B" else v) if e["dim"] == 128 else 1.0
    json.dump(d, open(f"{work}/{k}.json", "w"))
PY
predict() { # file [overrides] -> the predicted step's ms (--plan, its trace in FILE.trace.json)
  "$gtrain" --plan --calibration "$work/$1.json" --trace "$work/$1.trace.json" "$cfg" "${@:2}" >"$work/$1.plan" 2>&1 ||
    fail "--plan with $1.json: $(tail -2 "$work/$1.plan")"
  sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p' "$work/$1.plan"
}
one=$(predict one) two=$(predict two) old=$(predict old)
[[ -n $one && -n $two && -n $old ]] || fail "no predicted step: '$one' '$two' '$old'"
grep -q "; in-step factor 2.000 (this model)" "$work/two.plan" || fail "the plan's note: $(grep rates "$work/two.plan")"
python3 - "$work" "$one" "$two" "$old" <<'PY' || fail "--plan did not scale the micro-batches' kernels, and only them, by the model's factor (1: $one ms, 2: $two ms, none: $old ms)"
import collections, json, sys
work, one, two, old = sys.argv[1], *map(float, sys.argv[2:])
STEP_OWN = {"sumsq", "adamw", "to_working"}  # the step's own kernels, priced at their rates alone
def spans(k):
    ev = json.load(open(f"{work}/{k}.trace.json"))["traceEvents"]
    t = collections.Counter()
    for e in ev:
        if e.get("ph") == "X" and e.get("name") not in ("step", "micro_batch"):
            t["own" if e["name"] in STEP_OWN else "micro"] += e["dur"] / 1e3
    return t
s1, s2 = spans("one"), spans("two")
assert s1["micro"] > 0 and s1["own"] > 0, s1
assert abs(s2["own"] - s1["own"]) < 1e-6 * s1["own"], (s1, s2)         # the step's own kernels: not scaled
assert abs(s2["micro"] - 2 * s1["micro"]) < 1e-3 * s1["micro"], (s1, s2)  # the micro-batches' kernels: 2x
assert two > one + 0.9 * s1["micro"], (one, two, s1)
assert abs(old - one) <= 0.1, (old, one)
PY
# each size's "kernels one by one" is what --plan prices for that micro-batch of the same 4 blocks at factor 1
python3 - "$work" <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + "/first.json"))
for e in d["rates"]["in_step"]: e["factor"] = 1.0
json.dump(d, open(sys.argv[1] + "/first1.json", "w"))
PY
for mb in 1 8; do
  alone=$(sed -n "s/^  in-step factor: a micro-batch ($mb x 128 tokens, 4 blocks) run whole [0-9.]* ms, its kernels one by one \([0-9.]*\) ms: .*/\1/p" "$work/calibrate.out")
  "$gtrain" --plan --calibration "$work/first1.json" --trace "$work/blocks.$mb.json" "$cfg" \
    train.micro_batch=$mb train.grad_accum=1 >"$work/blocks.$mb.plan" 2>&1 || fail "--plan of micro-batch $mb: $(tail -2 "$work/blocks.$mb.plan")"
  python3 - "$work/blocks.$mb.json" "$alone" <<'PY' || fail "micro-batch $mb: the calibration's kernels one by one ($alone ms) are not what --plan prices for them"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
priced = sum(e["dur"] for e in ev if e.get("ph") == "X" and e.get("name") not in {"step", "micro_batch", "sumsq", "adamw", "to_working"}) / 1e3
alone = float(sys.argv[2])
assert abs(priced - alone) <= 0.005 * alone + 0.01, (alone, priced)
PY
done
# the factor of the plan's micro-batch size, interpolated on log2 of the size between measured ones
for mb in 2 3; do
  predict one train.micro_batch=$mb >/dev/null && mv "$work/one.trace.json" "$work/one.$mb.trace.json"
  predict sized train.micro_batch=$mb >/dev/null && mv "$work/sized.trace.json" "$work/sized.$mb.trace.json"
done
python3 - "$work" <<'PY' || fail "--plan did not take the factor of the plan's micro-batch size"
import collections, json, math, sys
work = sys.argv[1]
STEP_OWN = {"sumsq", "adamw", "to_working"}
def micro(k):
    ev = json.load(open(f"{work}/{k}.trace.json"))["traceEvents"]
    return sum(e["dur"] for e in ev if e.get("ph") == "X" and e.get("name") not in {"step", "micro_batch"} | STEP_OWN)
for mb, want in ((2, 2.0), (3, 2.0 + (math.log2(3) - 1) * 2.0)):
    got = micro(f"sized.{mb}") / micro(f"one.{mb}")
    assert abs(got - want) < 2e-3 * want, (mb, got, want)
PY
# train.micro_batch = auto prices each size it tries at that size's factor: at 8/B the 8 sequences it
# picks cost what they cost at 1 (not the 8 of the size of 1, where the run's note starts)
inverse=$(predict inverse train.micro_batch=auto train.global_batch=8) one8=$(predict one train.micro_batch=8 train.global_batch=8)
grep -q "^micro-batch 8 x 128 tokens, grad_accum 1" "$work/inverse.plan" && [[ "$inverse" == "$one8" ]] ||
  fail "micro_batch = auto with factors 8/B: $inverse ms ($(grep '^micro-batch' "$work/inverse.plan")), against $one8 ms at 8 with factor 1"
"$gtrain" --plan --calibration "$work/sized.json" "$cfg" | grep -q "; in-step factor 8.000 (this model), 1.000-8.000 over micro-batches 1-8" ||
  fail "the plan's note with factors per size: $("$gtrain" --plan --calibration "$work/sized.json" "$cfg" | grep rates)"
predict two model.dim=96 model.n_heads=4 >/dev/null
grep -q "; in-step factor 2.000 (measured on dim 128, ffn 352)" "$work/two.plan" ||
  fail "a model of dim 96 did not take the nearest dim's factor: $(grep rates "$work/two.plan")"
# a model of 200 blocks, each a few milliseconds: every block would fit the memory cap, but a round's
# runs (3 calls of each size) would take far more than 3 s by the kernels' figures: the micro-batch has
# the most blocks whose 3 calls of each size take at most 3 s by them, and at least 2
"$gtrain" --calibrate --out "$work/deep.json" "$cfg" model.n_layers=200 >"$work/deep.out" 2>&1 ||
  fail "--calibrate of 200 blocks: $(tail -3 "$work/deep.out")"
python3 - "$work/deep.out" <<'PY' || fail "the in-step micro-batch of a 200-block model: $(grep in-step "$work/deep.out")"
import re, sys
runs = re.findall(r"^  in-step factor: a micro-batch \(([0-9]+) x 128 tokens, ([0-9]+) blocks\) run whole [0-9.]+ ms, "
                  r"its kernels one by one ([0-9.]+) ms", open(sys.argv[1]).read(), re.M)
assert sorted(int(b) for b, _, _ in runs) == [1, 2, 4, 8], runs
blocks = {int(k) for _, k, _ in runs}
assert len(blocks) == 1, blocks
k = blocks.pop()
priced = 3 * sum(float(ms) for _, _, ms in runs)
assert 2 < k < 200 and priced <= 3000, (k, priced)
# one block more would not fit (a block costs at most priced / k, the head and embedding being the rest)
assert priced * (1 + 1 / k) > 3000, (k, priced)
PY
echo "PASS: in-step factors $(python3 -c "import json;print([round(e['factor'],3) for e in json.load(open('$work/c.json'))['rates']['in_step']])"); --plan's compute: $one ms at 1, $two ms at 2"
