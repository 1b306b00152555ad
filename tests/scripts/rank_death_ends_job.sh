#!/usr/bin/env bash
# A rank that dies ends the whole job with an error, never a hang: two ranks train, rank 1 dies by
# SIGKILL, and the launcher must return non-zero within 120 s while rank 0 would otherwise wait in a
# collective forever. Two ways to die:
#   between-steps  the test kills rank 1 after step 3 (ZeRO-1, the step's reductions wait for it);
#   in-gather      ZeRO-3 (dist.shard = parameters): GTRAIN_TEST_DIE_IN_GATHER makes rank 1 SIGKILL
#                  itself as it enters its 40th unit all-gather, while rank 0 already waits inside it.
#   rank_death_ends_job.sh MODE GTRAIN GTRAIN_PREP WORKDIR MPIEXEC [MPIEXEC FLAGS...]
set -euo pipefail
mode=$1 gtrain=$2 prep=$3 work=$4
shift 4
# shellcheck source=SCRIPTDIR/fault_run.sh
. "$(dirname "$0")/fault_run.sh"
fault_run_dir "$prep" "$work"
cat >>run.ini <<INI
[log]
metrics = metrics.jsonl
INI
export OMP_NUM_THREADS=1 GTRAIN_TEST_HOOKS=1  # the hooks below act only with it
case $mode in
  between-steps) export GTRAIN_TEST_STEP_DELAY_MS=100 ;;
  in-gather) export GTRAIN_TEST_DIE_IN_GATHER=40
             printf '[memory]\nrecompute = full\n[dist]\nshard = parameters\n' >>run.ini ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
"$@" -np 2 "$gtrain" run.ini >run.log 2>&1 &
launcher=$!
ranks() {
  for pid in $(pgrep -f "$gtrain run.ini"); do
    [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$PWD" ]] && echo "$pid"
  done
  return 0
}
if [[ $mode == between-steps ]]; then
  for _ in $(seq 600); do
    [[ -s metrics.jsonl ]] && (($(wc -l <metrics.jsonl) >= 3)) && break
    sleep 0.1
  done
  (($(wc -l <metrics.jsonl) >= 3)) || { echo "the run did not reach step 3"; cat run.log; exit 1; }
  # rank 1 of this job: the other test of this script runs the same command line at the same time
  # (ctest -j), so its ranks are told apart by their working directory
  victim=""
  for pid in $(ranks); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$pid; fi
  done
  [[ -n $victim ]] || { echo "rank 1 not found"; exit 1; }
  echo "killing rank 1 (pid $victim) after step $(wc -l <metrics.jsonl)"
  kill -9 "$victim"
fi
start=$(date +%s)
rc=0
for _ in $(seq 1200); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$launcher" 2>/dev/null; then
  echo "FAIL: the job still runs 120 s after rank 1 died (a hang)"
  for pid in $(ranks); do kill -9 "$pid" 2>/dev/null; done
  kill -9 "$launcher" 2>/dev/null
  exit 1
fi
wait "$launcher" || rc=$?
echo "the launcher returned $rc after $(( $(date +%s) - start )) s"
tail -n 8 run.log
((rc != 0)) || { echo "FAIL: exit status 0 after a rank died"; exit 1; }
if [[ $mode == in-gather ]]; then
  grep -q "DIE_IN_GATHER: dying in gather 40" run.log || { echo "FAIL: rank 1 did not die in a gather"; exit 1; }
fi
echo PASS
