#!/usr/bin/env bash
# test-cpu.sh — how much of the machine each test keeps busy: the list of light tests.
#
#   tools/test-cpu.sh [BUILD] [ctest selection ...]      e.g. tools/test-cpu.sh build -L mpi
#
# Runs the selected tests of BUILD (default build) one at a time and prints, for each, its wall
# seconds, the CPU seconds of everything it started (user + system of its reaped children:
# mpirun's ranks, python, gtrain) and their ratio, the cores it kept busy on average. A test under
# 0.6 of a core (waits on timers, a stopped rank, a watchdog, a Slurm requeue, a cold disk) is
# light: tests/CMakeLists.txt's GTRAIN_LIGHT_TESTS lists them, and ctest -j 2 runs two light tests
# side by side while every other test runs alone (tools/run-tests.sh). Run it on an otherwise idle
# machine after adding a slow test, and move the test into the list when it is light. The last line
# prints the light tests of this run in the list's form.
set -uo pipefail
build=${1:-build}
shift || true
[[ -x /usr/bin/time ]] || { echo "test-cpu.sh: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }
[[ -f $build/CTestTestfile.cmake ]] || { echo "test-cpu.sh: $build is not a build directory" >&2; exit 2; }
mapfile -t names < <(cd "$build" && ctest -N "$@" | sed -nE 's/^ *Test +#[0-9]+: (.+)$/\1/p')
((${#names[@]})) || { echo "test-cpu.sh: no test selected" >&2; exit 2; }
out=$(mktemp) times=$(mktemp)
trap 'rm -f "$out" "$times"' EXIT
light=()
printf '%-55s %8s %8s %6s %s\n' test wall_s cpu_s cores result
for t in "${names[@]}"; do
  # stdin from /dev/null: mpirun reads its stdin and would eat the rest of the list
  (cd "$build" && /usr/bin/time -f '%e %U %S' -o "$times" ctest -R "^${t}\$" --timeout 1500 >"$out" 2>&1 </dev/null)
  rc=$?
  read -r wall user sys <"$times"
  cores=$(awk -v w="$wall" -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", w > 0 ? (u + s) / w : 0 }')
  cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.1f", u + s }')
  printf '%-55s %8.1f %8s %6s %s\n' "$t" "$wall" "$cpu" "$cores" "$( ((rc == 0)) && echo passed || echo "FAILED (rc $rc)")"
  awk -v c="$cores" 'BEGIN { exit !(c < 0.6) }' && light+=("$t")
done
echo "light (under 0.6 of a core): ${light[*]}"
