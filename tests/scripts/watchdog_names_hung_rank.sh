#!/usr/bin/env bash
# A hung rank ends the job within dist.timeout plus a margin, with exit 76 and one line naming it.
# Two ranks train with dist.timeout = 10 and a state file every 4 steps; GTRAIN_TEST_HANG_AT makes
# rank 1 hang as step 8 begins, before its first collective of the step:
#   stop  it stops itself with SIGSTOP (a frozen process: its watchdog thread is frozen too);
#   spin  it loops forever (compute that never ends; its threads still run);
#   slowstop  as stop, after a step 3 of 3 s more (`slow`), which raises the limit by the step
#         clock to 30 s: the stopped rank's stale record must still end the job within 25 s;
# or GTRAIN_TEST_HANG_IN_SAVE makes it hang inside the save of step 8 (state.c):
#   save  it enters a write that never returns between two of the save's HDF5 calls
#         (checkpoint.async = false: the collective writer);
#   asyncsave  the same in its background writer thread (checkpoint.async = true): training goes
#         on until the next save (step 12) waits for that writer, and rank 1 is named there;
#   savestop  every write of a save slowed (GTRAIN_TEST_SLOW_SAVE=0:50), and it stops itself with
#         SIGSTOP in the middle of the save of step 8 (checkpoint.async = false): named as stopped.
# With dist.timeout = 600, which cannot explain a verdict within the test's minute, dist.liveness_timeout
# (5 s by default) names the rank (src/dist/watchdog.h, "Liveness"):
#   livestop  as stop: its neighbour sees no new record for the liveness limit, and /proc shows the
#         process stopped; the line must say so, with a silence of at most the limit + 5 s;
#   livespin  as spin: its watchdog thread still writes, but its training thread computes with no
#         kernel or collective beginning or ending: named as wedged;
#   stopcycles  nothing hangs: rank 1 is stopped (SIGSTOP) for 2 s and let go (SIGCONT) for 1 s, again
#         and again from step 4 to the end (train.steps = 24): slow but alive, it must finish (exit 0,
#         no watchdog line).
# Or no rank hangs, and a save that is slow but writes takes longer than dist.timeout: it must finish
# (exit 0, no watchdog line, its save_write_s in the metrics over 10 s); train.steps = 4, one save:
#   slowsave  every write of the collective save takes 150 ms more (GTRAIN_TEST_SLOW_SAVE=0:150);
#   slowsave1rank  the same on 1 rank (no other rank whose progress the watchdog could see);
#   slowasyncsave  every write of the background writers takes 400 ms more, and the run's end waits
#         for them;
#   slowrankasyncsave  the same for rank 1's writer only: rank 0's finishes at once, and rank 0 then
#         waits in the save's agreement for longer than dist.timeout while rank 1 writes.
# Rank 0 then waits in a collective. The launcher must return 76 within 60 s of the hang, the
# output must hold exactly one "gtrain: watchdog:" line naming rank 1 (and not rank 0) as not
# arrived (in save mode: naming the save), ckpt/.watchdog/blamed_hosts must name this host, the
# state file of step 4 must still be there (in save mode it must resume, and step 8's must not be),
# and tools/flight_recorder.py, reading the rings the ranks left in ckpt/.watchdog, must say that
# rank 1 is behind rank 0 (in save mode: that both are in the save).
#   watchdog_names_hung_rank.sh MODE GTRAIN GTRAIN_PREP WORKDIR MPIEXEC [MPIEXEC FLAGS...]
set -uo pipefail
mode=$1 gtrain=$2 prep=$3 work=$4
shift 4
tools=$(cd "$(dirname "$0")/../../tools" && pwd)
# shellcheck source=SCRIPTDIR/fault_run.sh
. "$(dirname "$0")/fault_run.sh"
fault_run_dir "$prep" "$work" || exit 1
cat >>run.ini <<INI
[dist]
timeout = 10
[checkpoint]
dir = ckpt
every = 4
[log]
metrics = metrics.jsonl
INI
# steps of 300 ms or more: the records (refreshed every second) then show a step or two before the hang
export OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_STEP_DELAY_MS=300
# in save mode the clock starts at step 8's line (the save follows it), else at step 7's
before=7
np=2
extra=()
case $mode in
  save) export GTRAIN_TEST_HANG_IN_SAVE=8:1; before=8; extra=(checkpoint.async=false) ;;
  asyncsave) export GTRAIN_TEST_HANG_IN_SAVE=8:1; before=8 ;;
  slowstop) export GTRAIN_TEST_HANG_AT=3:1:slow,8:1:stop; extra=(dist.liveness_timeout=0) ;; # the stale-record path, not liveness
  savestop) export GTRAIN_TEST_SLOW_SAVE=0:50 GTRAIN_TEST_HANG_IN_SAVE=8:1:stop; before=8
    extra=(checkpoint.async=false) ;;
  livestop) export GTRAIN_TEST_HANG_AT=8:1:stop; extra=(dist.timeout=600) ;;
  livespin) export GTRAIN_TEST_HANG_AT=8:1:spin; extra=(dist.timeout=600) ;;
  stopcycles) before=4; extra=(dist.timeout=600 train.steps=24) ;;
  slowsave) export GTRAIN_TEST_SLOW_SAVE=0:150; before=4; extra=(checkpoint.async=false train.steps=4) ;;
  slowsave1rank) export GTRAIN_TEST_SLOW_SAVE=0:150; before=4; np=1; extra=(checkpoint.async=false train.steps=4) ;;
  slowasyncsave) export GTRAIN_TEST_SLOW_SAVE=0:400; before=4; extra=(train.steps=4) ;;
  slowrankasyncsave) export GTRAIN_TEST_SLOW_SAVE=0:400:1; before=4; extra=(train.steps=4) ;;
  *) export GTRAIN_TEST_HANG_AT=8:1:$mode ;;
esac
"$@" -np "$np" "$gtrain" run.ini "${extra[@]}" >run.log 2>&1 &
launcher=$!
for _ in $(seq 2400); do
  [[ -s metrics.jsonl ]] && (($(wc -l <metrics.jsonl) >= before)) && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.05
done
(($(wc -l <metrics.jsonl 2>/dev/null || echo 0) >= before)) || { echo "FAIL: the run did not reach step $before"; cat run.log; exit 1; }
t0=$(date +%s.%N) # rank 0 wrote that line: rank 1 hangs at most a step from now
if [[ $mode == stopcycles ]]; then
  pid=$(awk '{print $6}' ckpt/.watchdog/rank_00001 2>/dev/null)
  [[ -n $pid ]] || { echo "FAIL: no record of rank 1"; kill -9 "$launcher"; exit 1; }
  trap 'kill -CONT "$pid" 2>/dev/null' EXIT
  cycles=0
  while kill -0 "$launcher" 2>/dev/null && ((cycles < 60)); do
    kill -STOP "$pid" 2>/dev/null || break
    sleep 2
    kill -CONT "$pid" 2>/dev/null
    cycles=$((cycles + 1))
    sleep 1
  done
  wait "$launcher"
  rc=$?
  verdict=$(grep '^gtrain: watchdog:' run.log)
  steps=$(wc -l <metrics.jsonl)
  printf 'mode %s: %d stops of 2 s; the launcher returned %d; %d metrics lines\n%s\n' "$mode" "$cycles" "$rc" "$steps" "$verdict"
  failed=0
  ((rc == 0)) || { echo "FAIL: exit $rc, expected 0: a slow rank was ended"; failed=1; }
  [[ -z $verdict ]] || { echo "FAIL: a watchdog line"; failed=1; }
  ((cycles >= 3)) || { echo "FAIL: only $cycles stops: the run was not slowed"; failed=1; }
  grep -q '"step": 24[,}]' metrics.jsonl || grep -q '"step":24[,}]' metrics.jsonl ||
    { echo "FAIL: step 24 is not in the metrics"; failed=1; }
  ((failed)) && { tail -n 20 run.log; exit 1; }
  echo PASS
  exit 0
fi
# live*: the liveness limit is 5 s and dist.timeout 600, so a verdict comes in about 10 s (livestop:
# the record's silence; livespin: the wedge clock counts the spinning thread's CPU time, which a loaded
# machine hands out more slowly); the wait allows 3x and 4x that, far from dist.timeout
# (a verdict later than `within` fails anyway, so the wait ends there: a bug that lets the job hang
# costs the test `within` seconds, not more)
within=60
[[ $mode == livestop ]] && within=30
[[ $mode == livespin ]] && within=45
wait_s=$within
[[ $mode == slow*save* ]] && wait_s=120 # these must finish: no verdict, no `within`
for _ in $(seq $((wait_s * 10))); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$launcher" 2>/dev/null; then
  echo "FAIL: the job still runs $wait_s s after rank 1 hung"
  # the ranks' pids are in the watchdog's records: stop exactly this job's processes
  for f in ckpt/.watchdog/rank_*; do
    pid=$(awk '{print $6}' "$f" 2>/dev/null)
    [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null
  done
  kill -9 "$launcher" 2>/dev/null
  tail -n 5 run.log
  exit 1
fi
wait "$launcher"
rc=$?
elapsed=$(echo "$(date +%s.%N) - $t0" | bc)
verdict=$(grep '^gtrain: watchdog:' run.log)
if [[ $mode == slow*save* ]]; then
  printf 'mode %s: the launcher returned %d %.1f s after step %d ended\n%s\n' "$mode" "$rc" "$elapsed" "$before" "$verdict"
  write_s=$(python3 -c 'import json,sys
print(max([json.loads(l).get("save_write_s", 0) for l in open(sys.argv[1])] + [0]))' metrics.jsonl)
  echo "the save of step 4 took $write_s s (dist.timeout = 10)"
  failed=0
  ((rc == 0)) || { echo "FAIL: exit $rc, expected 0: the slow save was ended"; failed=1; }
  [[ -z $verdict ]] || { echo "FAIL: a watchdog line"; failed=1; }
  (($(echo "$write_s > 10" | bc))) || { echo "FAIL: the save took $write_s s, not longer than dist.timeout"; failed=1; }
  [[ -f ckpt/step_00000004.h5 ]] || { echo "FAIL: the state file of step 4 is not there"; failed=1; }
  ((failed)) && { tail -n 20 run.log; exit 1; }
  echo PASS
  exit 0
fi
printf 'mode %s: the launcher returned %d %.1f s after step %d ended\n%s\n' "$mode" "$rc" "$elapsed" "$before" "$verdict"
failed=0
((rc == 76)) || { echo "FAIL: exit $rc, expected 76"; failed=1; }
(($(grep -c '^gtrain: watchdog:' run.log) == 1)) || { echo "FAIL: not exactly one watchdog line"; failed=1; }
arrived=${verdict#*not arrived: }
[[ $arrived == "rank 1 (pid "* ]] || { echo "FAIL: rank 1 is not named as not arrived"; failed=1; }
[[ $arrived != *"rank 0 (pid "* ]] || { echo "FAIL: rank 0 is named too"; failed=1; }
(($(echo "$elapsed < $within" | bc))) || { echo "FAIL: took $elapsed s (dist.timeout = 10, or 600 in live* modes)"; failed=1; }
if [[ $mode == livestop || $mode == livespin ]]; then
  [[ $verdict == *"dist.liveness_timeout)"* ]] || { echo "FAIL: not named by dist.liveness_timeout"; failed=1; }
fi
if [[ $mode == livestop ]]; then
  [[ $arrived == "rank 1 (pid "*"no sign of life for "*" s (its process is stopped), stopped or dead"* ]] ||
    { echo "FAIL: rank 1 not named as stopped"; failed=1; }
  silent=${arrived#*no sign of life for }
  silent=${silent%% s*}
  ((silent <= 10)) || { echo "FAIL: named after $silent s of silence (limit 5 s)"; failed=1; }
fi
if [[ $mode == livespin ]]; then
  [[ $verdict == "gtrain: watchdog: rank 1 is wedged: "* ]] || { echo "FAIL: rank 1 not named as wedged"; failed=1; }
fi
if [[ $mode == slowstop ]]; then
  (($(echo "$elapsed < 25" | bc))) || { echo "FAIL: took $elapsed s: the stale record did not end it"; failed=1; }
  [[ $arrived == "rank 1 (pid "*"stopped or dead"* ]] || { echo "FAIL: rank 1 not named as stopped"; failed=1; }
fi
[[ -f ckpt/step_00000004.h5 ]] || { echo "FAIL: the state file of step 4 is gone"; failed=1; }
[[ $(cat ckpt/.watchdog/blamed_hosts 2>/dev/null) == "$(hostname)" ]] ||
  { echo "FAIL: ckpt/.watchdog/blamed_hosts does not name $(hostname)"; failed=1; }
# the flight recorder (tools/flight_recorder.py) tells the same story from the rings left behind
flight=$(python3 "$tools/flight_recorder.py" ckpt/.watchdog)
echo "$flight" | tail -n 1
if [[ $mode == save || $mode == asyncsave || $mode == savestop ]]; then
  # synchronous: named in the hung call; asynchronous: the writer thread hangs, and rank 1 is named in
  # the wait for it (the save's agreement), when the next save is due at step 12; stopped: named as
  # stopped where it was last seen, in the save of step 8
  case $mode in
    save) want="in hung_write (call *of the save of step 8, #" ;;
    asyncsave) want="in the save of step 12 " ;;
    savestop) want="stopped or dead; last seen in *the save of step 8, #" ;;
  esac
  # shellcheck disable=SC2053
  [[ $arrived == *$want* ]] || { echo "FAIL: rank 1 is not named as stuck inside the save ($want)"; failed=1; }
  [[ ! -e ckpt/step_00000008.h5 ]] || { echo "FAIL: the save that hung was published"; failed=1; }
  [[ $(echo "$flight" | grep -c 'newest: save #.*in flight') == 2 ]] ||
    { echo "FAIL: the flight recorder does not show both ranks in the save"; echo "$flight"; failed=1; }
  # the file before the hang is whole: a one-rank run resumes from it and trains a step
  env -u GTRAIN_TEST_HANG_IN_SAVE -u GTRAIN_TEST_STEP_DELAY_MS -u GTRAIN_TEST_SLOW_SAVE "$gtrain" run.ini train.steps=5 dist.timeout=0 \
    >resume.log 2>&1 || { echo "FAIL: resuming after the hang failed"; cat resume.log; failed=1; }
  grep -q "resumed from ckpt/step_00000004.h5" resume.log || { echo "FAIL: did not resume from step 4"; failed=1; }
else
  [[ $(echo "$flight" | tail -n 1) == "rank 1 is behind: rank 0 started "* ]] ||
    { echo "FAIL: the flight recorder does not show rank 1 behind rank 0"; echo "$flight"; failed=1; }
fi
((failed)) && { tail -n 20 run.log; exit 1; }
echo PASS
