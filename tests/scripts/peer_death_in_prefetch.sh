#!/usr/bin/env bash
# A rank killed while a non-blocking ZeRO-3 gather is in flight ends the job within dist.timeout plus
# a margin, and every state file written before it resumes. NRANKS ranks train with
# dist.shard = parameters (each unit's parameters gathered ahead of use: the prefetch), dist.timeout
# = 10 and a state file every 4 steps; GTRAIN_TEST_DIE_IN_GATHER=K:VICTIM:started makes the last rank
# SIGKILL itself right after starting its 60th gather (step 10 or so, after the save of step 8), while that gather
# is in flight on every rank. Two launchers:
#   launcher  mpirun as it is: it ends the other ranks when one dies; the line naming the dead rank
#             is mpirun's ("process rank N ... exited on signal 9");
#   watchdog  mpirun told to leave the others running (orte_abort_on_non_zero_status 0, as srun
#             without --kill-on-bad-exit does): the survivors wait in the gather until their
#             watchdog ends them, with its one line naming the dead rank and no other.
# Within 40 s every rank must be gone (the launcher non-zero), exactly one such line naming the dead
# rank, at most one "gtrain: watchdog:" line, and a run on NRANKS ranks must resume from the newest
# state file (or from a memory snapshot of a later step, naming that file as the newest), train to
# step 10 and end 0.
#   peer_death_in_prefetch.sh MODE NRANKS GTRAIN GTRAIN_PREP WORKDIR MPIEXEC [MPIEXEC FLAGS...]
set -uo pipefail
mode=$1 nranks=$2 gtrain=$3 prep=$4 work=$5
shift 5
launch=("$@" -np "$nranks")
[[ $mode == watchdog ]] && launch+=(--mca orte_abort_on_non_zero_status 0)
# shellcheck source=SCRIPTDIR/fault_run.sh
. "$(dirname "$0")/fault_run.sh"
fault_run_dir "$prep" "$work" || exit 1
cat >>run.ini <<INI
[memory]
recompute = full
[dist]
shard = parameters
timeout = 10
[checkpoint]
dir = ckpt
every = 4
[log]
metrics = metrics.jsonl
INI
victim=$((nranks - 1))
# about 6 gathers a step (4 units: embedding, 2 blocks, head): gather 60 is in step 10 or 11
export OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_DIE_IN_GATHER=60:$victim:started
"${launch[@]}" "$gtrain" run.ini >run.log 2>&1 &
launcher=$!
ranks() { # this job's ranks (not mpirun, whose command line holds theirs): tests run in parallel
  for pid in $(pgrep -f "$gtrain run.ini"); do
    [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$PWD" && $(cat "/proc/$pid/comm" 2>/dev/null) == gtrain ]] &&
      echo "$pid"
  done
  return 0
}
for _ in $(seq 1200); do
  grep -q "dying in gather" run.log && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.05
done
t0=$(date +%s.%N)
grep -q "dying in gather 60 (started, in flight)" run.log || { echo "FAIL: rank $victim did not die in a started gather"; cat run.log; exit 1; }
# the end: the launcher gone (launcher mode), or every rank (watchdog mode: this mpirun then lingers)
for _ in $(seq 600); do
  if [[ $mode == launcher ]]; then kill -0 "$launcher" 2>/dev/null || break; else [[ -z $(ranks) ]] && break; fi
  sleep 0.1
done
elapsed=$(echo "$(date +%s.%N) - $t0" | bc)
if [[ -n $(ranks) ]]; then
  echo "FAIL: ranks still run 60 s after rank $victim died"
  for pid in $(ranks); do kill -9 "$pid" 2>/dev/null; done
  kill -9 "$launcher" 2>/dev/null
  tail -n 5 run.log
  exit 1
fi
[[ $mode == watchdog ]] && kill "$launcher" 2>/dev/null
wait "$launcher"
rc=$?
if [[ $mode == launcher ]]; then pattern="rank $victim .*exited on signal 9"; else pattern='^gtrain: watchdog: '; fi
line=$(grep -E "$pattern" run.log)
printf '%s, %d ranks: every rank gone %.1f s after rank %d died (launcher %d)\n%s\n' "$mode" "$nranks" "$elapsed" \
  "$victim" "$rc" "$line"
failed=0
((rc != 0)) || { echo "FAIL: exit 0 after a rank died"; failed=1; }
(($(echo "$elapsed < 40" | bc))) || { echo "FAIL: took $elapsed s (dist.timeout = 10)"; failed=1; }
(($(grep -cE "$pattern" run.log) == 1)) || { echo "FAIL: not exactly one line matching '$pattern'"; failed=1; }
if [[ $mode == launcher ]]; then
  [[ $line == *"rank $victim "* ]] || { echo "FAIL: the line does not name rank $victim"; failed=1; }
else
  arrived=${line#*not arrived: }
  [[ $arrived == "rank $victim (pid "*"stopped or dead"* ]] ||
    { echo "FAIL: the watchdog does not name rank $victim as not arrived"; failed=1; }
  # the survivors wait in the same gather, one of them maybe a prefetch further: neither is named
  (($(grep -o '(pid ' <<<"$arrived" | wc -l) == 1)) || { echo "FAIL: a rank other than $victim is named"; failed=1; }
fi
(($(grep -c '^gtrain: watchdog:' run.log) <= 1)) || { echo "FAIL: more than one watchdog line"; failed=1; }
newest=$(find ckpt -name 'step_*.h5' | sort | tail -n 1)
[[ -n $newest ]] || { echo "FAIL: no state file was written before the death"; failed=1; }
env -u GTRAIN_TEST_DIE_IN_GATHER "$@" -np "$nranks" "$gtrain" run.ini train.steps=10 >resume.log 2>&1 ||
  { echo "FAIL: the run did not resume"; tail -n 20 resume.log; failed=1; }
# the newest state file, or (memory snapshots are on by default, their interval timed by the steps)
# the memory snapshot of a later step, which then names that file as the newest
newest_step=$(basename "$newest" .h5)
newest_step=$((10#${newest_step#step_}))
snap_step=$(sed -n 's/^gtrain: resumed from the memory snapshot of step \([0-9]*\) (every rank.s slice .* verified.*newer than the newest state file, \(.*\)$/\1 \2/p' resume.log)
if grep -q "^gtrain: resumed from $newest (step $newest_step)" resume.log; then
  echo "resumed from $newest"
elif [[ -n $snap_step && ${snap_step#* } == "$newest" ]] && ((${snap_step%% *} > newest_step)); then
  echo "resumed from the memory snapshot of step ${snap_step%% *}, newer than $newest"
else
  echo "FAIL: did not resume from $newest or a newer memory snapshot"; failed=1
fi
((failed)) && { tail -n 20 run.log; exit 1; }
echo PASS
