#!/usr/bin/env bash
# Prints one summary line of the tests a ctest run skipped (exit 77, or not run for a missing
# requirement), read from that run's output, and a second line for any of them that is not
# gpu-labelled, and then exits 1: after tools/run-tests.sh's set-up only the gpu tests may skip
# (a test that needs root, a tool or the venv gets it from the set-up, or fails).
#   tools/ctest-skipped.sh CTEST_OUTPUT_FILE BUILD_DIR
set -euo pipefail
log=$1 build=$2
# ctest ends with "The following tests did not run:" and lines "\t 12 - name (Skipped)"
mapfile -t skipped < <(sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+) \((Skipped|Not Run|Disabled)\)$/\1/p' "$log")
if ((${#skipped[@]} == 0)); then
  echo "skipped tests: none"
  exit 0
fi
echo "skipped tests (${#skipped[@]}): ${skipped[*]}"
mapfile -t gpu < <(cd "$build" && ctest -N -L gpu | sed -nE 's/^ *Test +#[0-9]+: (.+)$/\1/p')
unexpected=()
for t in "${skipped[@]}"; do
  [[ " ${gpu[*]} " == *" $t "* ]] || unexpected+=("$t")
done
if ((${#unexpected[@]})); then
  echo "FAIL: skipped tests outside the gpu label (${#unexpected[@]}): ${unexpected[*]}"
  exit 1
fi
