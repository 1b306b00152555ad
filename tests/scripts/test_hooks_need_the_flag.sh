#!/usr/bin/env bash
# The GTRAIN_TEST_* fault hooks (src/core/testhooks.h) act only in a run that also sets
# GTRAIN_TEST_HOOKS=1: without it gtrain refuses to start (exit 2, one line naming the variable, on
# one rank or two); with it, one line announces the hook and the hook acts (a NaN at step 2 stops
# the run with exit 1).
#   test_hooks_need_the_flag.sh GTRAIN GTRAIN_PREP CONFIG WORKDIR MPIEXEC [MPIEXEC FLAGS...]
set -uo pipefail
gtrain=$1 prep=$2 config=$3 work=$4
shift 4
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
"$prep" --val-fraction 0 -o corpus /usr/share/common-licenses/GPL-3 >/dev/null || exit 1
run=("$gtrain" "$config" data.train=corpus.train.bin data.val= train.steps=3 train.warmup_steps=1
     checkpoint.dir= log.metrics=)
export OMP_NUM_THREADS=1
unset GTRAIN_TEST_HOOKS
fail() { echo "FAIL: $*"; exit 1; }

for launcher in "" "$*"; do
  # shellcheck disable=SC2086 # the launcher's words are separate arguments
  env GTRAIN_TEST_NAN_AT=2:0 ${launcher:+$launcher -np 2} "${run[@]}" >out.txt 2>err.txt
  rc=$?
  cat err.txt
  [[ $rc == 2 ]] || fail "${launcher:+2 ranks: }a hook without GTRAIN_TEST_HOOKS=1: exit $rc, expected 2"
  [[ $(grep -c '^gtrain: ' err.txt) == 1 ]] || fail "expected one gtrain line"
  grep -q '^gtrain: GTRAIN_TEST_NAN_AT is set: a test hook, honoured only with GTRAIN_TEST_HOOKS=1' err.txt ||
    fail "the line does not name GTRAIN_TEST_NAN_AT and GTRAIN_TEST_HOOKS=1"
  ! grep -q '^step' out.txt || fail "it trained anyway"
done

GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_NAN_AT=2:0 "${run[@]}" >out.txt 2>err.txt
rc=$?
cat err.txt
[[ $rc == 1 ]] || fail "GTRAIN_TEST_HOOKS=1 with a NaN at step 2: exit $rc, expected 1 (the hook did not act)"
[[ $(grep -c '^gtrain: test hook active: GTRAIN_TEST_NAN_AT=2:0$' err.txt) == 1 ]] ||
  fail "no single line announces the active hook"
GTRAIN_TEST_HOOKS=1 "${run[@]}" >out.txt 2>err.txt || fail "GTRAIN_TEST_HOOKS=1 alone: exit $?"
! grep -q 'test hook' err.txt || fail "a hook announced where none is set"
echo PASS
