#!/usr/bin/env bash
# tests/gpu/run.sh without a GPU: every phase prints one SKIP line, the script exits 0, and $OUT holds
# summary.json (valid JSON, the eight phases in order of value, all SKIP, no "model" numbers), log.txt and results.tar.gz,
# nothing else. Where a GPU is visible an nvidia-smi that sees none stands in front of the real one
# on PATH, so the test runs (and never skips) on every machine.
#   gpu_run_dry.sh SOURCE_DIR WORKDIR
set -uo pipefail
src=$1 work=$2
rm -rf "$work" && mkdir -p "$work/bin" || exit 1
printf '#!/bin/sh\necho "NVIDIA-SMI has failed (a stand-in: no GPU for this test)" >&2\nexit 9\n' > "$work/bin/nvidia-smi"
chmod +x "$work/bin/nvidia-smi"
export PATH="$work/bin:$PATH" CUDA_VISIBLE_DEVICES=
OUT="$work/out" bash "$src/tests/gpu/run.sh" > "$work/stdout.txt" 2>&1
rc=$?
cat "$work/stdout.txt"
[[ $rc == 0 ]] || { echo "FAIL: exit $rc, expected 0"; exit 1; }
[[ $(grep -c '^PHASE .* SKIP ' "$work/stdout.txt") == 8 ]] || { echo "FAIL: expected 8 SKIP phase lines"; exit 1; }
files=$(cd "$work/out" && ls | tr '\n' ' ')
[[ $files == "log.txt results.tar.gz summary.json " ]] || { echo "FAIL: files in OUT: $files"; exit 1; }
python3 - "$work/out/summary.json" << 'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
names = [p["phase"] for p in d["phases"]]
want = ["ops", "comm", "trainer", "model", "bench-ops", "bench-train", "bench-torch", "sanitize"]
assert names == want, f"phases {names}, expected {want}"
assert all(p["status"] == "SKIP" for p in d["phases"]), d["phases"]
assert "model" not in d, d
assert d["budget_s"] <= 540, d["budget_s"]
print("PASS: summary.json has the eight phases in order, all SKIP")
PY
tar -tzf "$work/out/results.tar.gz" > /dev/null || { echo "FAIL: results.tar.gz does not list"; exit 1; }
echo PASS
