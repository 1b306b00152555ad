#!/usr/bin/env bash
# run.sh — builds the libFuzzer fuzzers (build-fuzz/, clang, ASan+UBSan) and runs them, one after the
# other, each for SECONDS (default 600); new inputs collect in a work corpus outside the repository
# and crashes in WORK/artifacts. With --merge, the inputs of the work corpus that add coverage are
# merged (-merge=1) into tests/fuzz/corpus/<name>/ (the replay tests' inputs). docs/fuzzing.md has
# the details.
#
#   bash tests/fuzz/run.sh [--merge] [--work DIR] [SECONDS] [NAME ...]      NAME: config data state
set -euo pipefail
cd "$(dirname "$0")/../.."
merge=0 work=/tmp/gtrain-fuzz
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --merge) merge=1; shift ;;
    --work) work=$2; shift 2 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
seconds=${1:-600}; shift || true
names=("$@")
((${#names[@]})) || names=(config data state)

if [[ ! -f build-fuzz/CMakeCache.txt ]]; then
  CC=${CC:-clang} cmake -S . -B build-fuzz -DGTRAIN_FUZZ=ON -DGTRAIN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build build-fuzz -j "$(nproc)" --target "${names[@]/#/fuzz_}" >/dev/null

mkdir -p "$work/artifacts"
for name in "${names[@]}"; do
  mkdir -p "$work/$name"
  echo "== fuzz_$name for ${seconds}s (work corpus $work/$name)"
  # Debian 12's HDF5 1.10.8 itself leaks on damaged files (metadata cache entries when the close
  # fails; 64 bytes of a layout message on files from newer writers): no leak checks for the
  # state reader, whose allocations are all HDF5's. One process (-jobs would fork workers).
  leaks=1
  [[ $name == state ]] && leaks=0
  export ASAN_OPTIONS=detect_leaks=$leaks
  nice -n 10 build-fuzz/tests/fuzz_"$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/$name-" "$work/$name" "tests/fuzz/corpus/$name" \
    >"$work/$name.log" 2>&1 || echo "fuzz_$name stopped: see $work/$name.log and $work/artifacts/" >&2
  grep -E "^stat::|^Done|SUMMARY|ERROR" "$work/$name.log" | sed "s/^/  /" || true
  if ((merge)); then
    # the committed files stay (named seeds and crash inputs); new inputs are added only when they
    # reach an edge the corpus does not (-use_counters=0 keeps the corpus small)
    before=$(ls "tests/fuzz/corpus/$name" | wc -l)
    build-fuzz/tests/fuzz_"$name" -merge=1 -use_counters=0 "tests/fuzz/corpus/$name" "$work/$name" >"$work/$name.merge.log" 2>&1
    echo "  merge added $(($(ls "tests/fuzz/corpus/$name" | wc -l) - before)) inputs"
    echo "  merged: $(ls "tests/fuzz/corpus/$name" | wc -l) files, $(du -sh "tests/fuzz/corpus/$name" | cut -f1)"
  fi
done
