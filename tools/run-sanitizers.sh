#!/usr/bin/env bash
# The unit and mpi tests built with AddressSanitizer and UndefinedBehaviorSanitizer (CPU only, in
# build-asan/, -DGTRAIN_SANITIZE=ON); any finding fails the test it happens in. CI runs it after
# the README test command (.ci/run). Extra arguments go to ctest.
#
# Leak detection is off (detect_leaks=0): Open MPI keeps allocations until exit by design, and
# every gtrain process starts MPI, so LeakSanitizer would report Open MPI's, not gtrain's. The
# fuzzers (tests/fuzz/run.sh) check leaks in the parsers, which run without MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
hf_python=${GTRAIN_HF_PYTHON:-/opt/gtrain-venv/bin/python}
[[ -x "$hf_python" ]] || hf_python=$(bash tools/setup-venv.sh | tail -n 1)
start=$SECONDS
mkdir -p build-asan
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGTRAIN_SANITIZE=ON -DGTRAIN_CUDA=OFF \
  -DGTRAIN_HF_PYTHON="$hf_python" >build-asan/configure.log 2>&1 || { cat build-asan/configure.log >&2; exit 1; }
cmake --build build-asan -j "$(nproc)" >build-asan/build.log 2>&1 || { tail -n 50 build-asan/build.log >&2; exit 1; }
echo "run-sanitizers: built in $((SECONDS - start)) s"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
set +e
# Not here, each for a path that other tests here run:
# - the chat loss-mask test against transformers (about 140 s under the sanitizers, most of it the
#   reference's side): masked batches at 1, 2 and 4 ranks run in the dist_train_mask_* and
#   dist_train_sep_* tests;
# - plan_llama70b_fits and config_comments_match_plan (every config's quoted --plan lines, the 70B and
#   405B ones among them): 78 s under the sanitizers, the planner code that plan_llama13b_fits,
#   recompute_plan_llama7b and the other plan tests run here on fewer layers;
# - the watchdog's timing variants (slowstop, savestop, slowsave, slowsave1rank, slowasyncsave,
#   slowrankasyncsave, stopcycles: 159 s, nearly all of it waiting for the limits): the watchdog code
#   of its stop, spin, save, asyncsave, livestop and livespin modes, which run here, but for the checks
#   of a slow save's progress, which only the slow* modes reach (they run without the sanitizers in
#   tools/run-tests.sh);
# - calibrate_rounds_fastest and calibrate_in_step_factor (90 s under the sanitizers, nearly all of it
#   the calibration's timed calls): the same calibration code runs here in
#   cli_calibrate_then_plan_reads_it and calibrate_two_ranks (every round, the fastest-round choice,
#   the in-step factor and the file); only the slowed rounds' hook and the factor's use are theirs.
skip='^(data_chat_loss_mask_matches_transformers|plan_llama70b_fits|config_comments_match_plan'
skip+='|calibrate_rounds_fastest|calibrate_in_step_factor'
skip+='|watchdog_names_hung_rank_(slowstop|savestop|slowsave|slowsave1rank|slowasyncsave|slowrankasyncsave|stopcycles))$'
(cd build-asan && ctest --output-on-failure --timeout 1500 -L 'unit|mpi' -E "$skip" "$@") 2>&1 |
  tee build-asan/ctest-output.txt
rc=${PIPESTATUS[0]}
set -e
bash tools/ctest-skipped.sh build-asan/ctest-output.txt build-asan
echo "run-sanitizers: ASan+UBSan unit and mpi tests: exit $rc, $((SECONDS - start)) s in all"
exit "$rc"
