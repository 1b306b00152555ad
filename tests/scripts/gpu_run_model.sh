#!/usr/bin/env bash
# tests/gpu/run.sh's model phase without a GPU (GPU_RUN_FORCE=1 PHASES=model GPU_MODEL_SMALL=1): on
# DEVICE cpu with gtrain itself, on DEVICE cuda with gtrain_emulated (the CUDA backend on the CPU
# emulation). The phase calibrates, runs 6 steps reading the file, and must print one PASS line with
# the predicted and the measured step and their error (whatever the error: on this CPU it is large),
# and record them: summary.json's "model" (predicted_step_ms and measured_step_ms > 0, calibrated),
# results.tar.gz holding calibration.json and model.json. Then the same with a gtrain whose metrics
# lose predicted_step_ms (a wrapper deletes it; its --calibrate copies the first file): the phase must
# FAIL and say that it is missing (left out with ONLY_PASS: that part is the script's own logic, the
# same on every backend).
#   gpu_run_model.sh SOURCE_DIR GTRAIN GTRAIN_PREP WORKDIR DEVICE [ONLY_PASS]
set -uo pipefail
src=$1 gtrain=$2 prep=$3 work=$4 device=$5 only_pass=${6:-}
rm -rf "$work" && mkdir -p "$work/bin" "$work/strip" || exit 1
ln -s "$gtrain" "$work/bin/gtrain" && ln -s "$prep" "$work/bin/gtrain-prep" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
phase() { # BUILD_DIR OUT: the model phase alone
    env OUT="$2" BUILD_DIR="$1" GPU_RUN_FORCE=1 PHASES=model GPU_MODEL_SMALL=1 GPU_MODEL_DEVICE="$device" \
        OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 bash "$src/tests/gpu/run.sh" > "$2.stdout" 2>&1
}

phase "$work/bin" "$work/out"
rc=$?
cat "$work/out.stdout"
[[ $rc == 0 ]] || { tail -n 30 "$work/out/log.txt"; fail "exit $rc, expected 0"; }
grep -qE '^PHASE model +PASS predicted [0-9.]+ ms, measured [0-9.]+ ms \(median of [0-9]+ steps\), error [+-][0-9.]+%; rates calibrated on this device' \
    "$work/out.stdout" || fail "no PASS line with the predicted and measured step"
python3 - "$work/out/summary.json" << 'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
m = d.get("model")
assert m, f"no model in summary.json: {d}"
assert m["predicted_step_ms"] > 0 and m["measured_step_ms"] > 0 and m["calibrated"], m
assert abs(m["error"] - (m["predicted_step_ms"] - m["measured_step_ms"]) / m["measured_step_ms"]) < 1e-9, m
print(f"PASS: summary.json model: predicted {m['predicted_step_ms']:.2f} ms, measured {m['measured_step_ms']:.2f} ms")
PY
files=$(tar -tzf "$work/out/results.tar.gz") || fail "results.tar.gz does not list"
for f in results/calibration.json results/model.json results/model-run.jsonl results/calibrate.log; do
    grep -qx "$f" <<<"$files" || fail "results.tar.gz lacks $f"
done
[[ -z $only_pass ]] || { echo PASS; exit 0; }

# a gtrain whose metrics have no predicted_step_ms (its --calibrate hands back the first run's file:
# the same key, without measuring again)
tar -xzf "$work/out/results.tar.gz" -C "$work" results/calibration.json || fail "no calibration.json to reuse"
cat > "$work/strip/gtrain" << SH
#!/usr/bin/env bash
if [ "\$1" = --calibrate ]; then cp "$work/results/calibration.json" "\$3"; exit; fi
"$gtrain" "\$@"
rc=\$?
for a in "\$@"; do
    case "\$a" in log.metrics=*) f=\${a#log.metrics=}; [ -f "\$f" ] && sed -i 's/"predicted_step_ms":[^,}]*,\?//' "\$f" ;; esac
done
exit \$rc
SH
chmod +x "$work/strip/gtrain"
ln -s "$prep" "$work/strip/gtrain-prep"
phase "$work/strip" "$work/out2"
rc=$?
cat "$work/out2.stdout"
[[ $rc == 1 ]] || fail "without predicted_step_ms: exit $rc, expected 1"
grep -qE '^PHASE model +FAIL .*predicted_step_ms missing from the metrics' "$work/out2.stdout" ||
    fail "without predicted_step_ms: expected a FAIL line saying it is missing"
echo PASS
