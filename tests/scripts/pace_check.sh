#!/usr/bin/env bash
# The trainer's pace line: after the start's first step (its warm-up) and the next five, rank 0 prints
# their median against the time model's predicted step, once. A calibration whose rates are 20x too
# fast (as one of other hardware) gives a prediction the steps miss by far: the line says slower than
# the time model said; one 20x too slow says faster; the run's own calibration gives the line without
# either word (its figure is not asserted: this machine is shared). A run of 3 steps says it at its
# last, over steps 2-3; a resumed start counts from its own first step.
#   pace_check.sh GTRAIN GTRAIN_PREP "MPIEXEC;FLAGS..." WORKDIR
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
steps = 8
warmup_steps = 1
[data]
train = corpus.train.bin
val =
[checkpoint]
dir =
INI
export OMP_NUM_THREADS=1
unset GTRAIN_CALIBRATION
fail() { echo "FAIL: $*" >&2; exit 1; }
"$gtrain" --calibrate --out clean.json run.ini >cal.out 2>&1 || fail "--calibrate: $(tail -3 cal.out)"
python3 - <<'PY'
import json
def scale(v, k):  # every rate times k, every time over k
    if isinstance(v, dict):
        return {n: (x * k if n.endswith("_per_s") and isinstance(x, (int, float)) else
                    x / k if (n == "seconds" or n.endswith("_latency_s")) and isinstance(x, (int, float)) else
                    scale(x, k)) for n, x in v.items()}
    if isinstance(v, list):
        return [scale(x, k) for x in v]
    return v
d = json.load(open("clean.json"))
for name, k in (("fast", 20.0), ("slow", 1 / 20.0)):
    e = dict(d)
    e["rates"] = scale(d["rates"], k)
    json.dump(e, open(name + ".json", "w"))
PY
num='[0-9][0-9.]*'
for cal in fast slow clean; do
    GTRAIN_CALIBRATION=$PWD/$cal.json "$gtrain" run.ini >"$cal.out" 2>&1 || fail "run with $cal.json: $(tail -3 "$cal.out")"
    grep -q "^gtrain: predicted step $num ms, $num tokens/s; rates: calibrated: $PWD/$cal.json" "$cal.out" ||
        fail "the run with $cal.json did not price with it: $(grep 'predicted step' "$cal.out")"
    [[ $(grep -c '^gtrain: pace: ' "$cal.out") == 1 ]] || fail "not one pace line with $cal.json: $(grep -c '^gtrain: pace: ' "$cal.out")"
    line=$(grep '^gtrain: pace: ' "$cal.out")
    [[ $line == "gtrain: pace: steps 2-6 took a median "* ]] || fail "not steps 2-6: $line"
    # after step 6's line and before step 7's (the progress lines go to stdout as well)
    grep -A1 '^gtrain: pace: ' "$cal.out" | grep -Eq '^step +7/8 ' || fail "the pace line not right after step 6: $(cat "$cal.out")"
done
grep -q "^gtrain: pace: steps 2-6 took a median $num ms, $num""x the $num ms predicted: slower than the time model said" fast.out ||
    fail "a 20x too fast calibration not said slower: $(grep pace: fast.out)"
grep -q "^gtrain: pace: steps 2-6 took a median $num ms, ${num}x the $num ms predicted: faster than the time model said" slow.out ||
    fail "a 20x too slow calibration not said faster: $(grep pace: slow.out)"
grep 'pace:' clean.out
# a run shorter than the window says it at its last step
GTRAIN_CALIBRATION=$PWD/fast.json "$gtrain" run.ini train.steps=3 >short.out 2>&1 || fail "3 steps: $(tail -3 short.out)"
grep -q "^gtrain: pace: steps 2-3 took a median $num ms, ${num}x the $num ms predicted: slower" short.out ||
    fail "a 3-step run's pace line: $(grep pace: short.out || echo none)"
# a resumed start counts from its own first step: steps 6-8 of a run saved at 5
mkdir -p ck
GTRAIN_CALIBRATION=$PWD/fast.json "$gtrain" run.ini train.steps=5 checkpoint.dir=ck checkpoint.every=5 >first.out 2>&1 ||
    fail "the first 5 steps: $(tail -3 first.out)"
GTRAIN_CALIBRATION=$PWD/fast.json "$gtrain" run.ini checkpoint.dir=ck checkpoint.every=5 >resumed.out 2>&1 ||
    fail "the resumed run: $(tail -3 resumed.out)"
grep -q "^gtrain: pace: steps 7-8 took a median $num ms" resumed.out || fail "the resumed start's pace line: $(grep pace: resumed.out || echo none)"
echo "pace_check: ok"
