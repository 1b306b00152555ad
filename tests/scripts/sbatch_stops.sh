#!/usr/bin/env bash
# launch/gtrain.sbatch's decisions, driven with stand-ins for srun, scontrol and sinfo (no Slurm, no
# gtrain): a stop signal to the batch shell at any moment ends in a requeue, exit 74 holds the job.
#   sbatch_stops.sh GTRAIN_SBATCH WORKDIR [CASE...]     (default: every case)
# The stand-in srun plays gtrain's ranks: each run exits with the code the case gives it, or ("wait")
# waits for the script's forwarded SIGUSR1 and exits 75 (or "die": 138, as ranks killed by it; "miss":
# the first SIGUSR1 is lost, the second stops it); a run that gets no stop within 20 s exits 0. The stand-ins send SIGUSR1 to the batch shell themselves when
# the case says so (FAKE_STOP_AT: at the first call of that command), which is how a stop lands
# between two commands of the script.
#   stop-then-75       the stop comes while a run trains: forwarded, exit 75, requeued
#   stop-before-run    while the script asks scontrol about the job, before any run: none starts, requeued
#   stop-between-runs  while usable_nodes asks sinfo after a hang (exit 76): the re-run is not
#                      started (or gets the stop), requeued
#   stop-in-step-cmd   while step_command asks scontrol for the re-run's host list: the same
#   stop-at-launch     while the script measures its output file (stat), just before it starts run 1
#   stop-missed-once   a run that misses the first forwarded stop (a step still starting) gets it
#                      again and stops
#   stop-then-killed   forwarded, but the ranks die of it (exit 138): requeued, the newest file kept
#   saves-failing      exit 74: one line naming the storage, scontrol requeuehold, not run again
# Losing a node or a hang (sinfo answers "down" for the nodes in FAKE_DOWN; a run's code "137+saved"
# exits 137 after writing gtrain's "saved" line to the job's output, as ranks that saved before their
# node died):
#   hang-no-rerun      the watchdog's 76 with GTRAIN_RETRIES=0: requeued, not ended
#   lost-no-rerun      node2 down, srun's 137 with GTRAIN_RETRIES=0 (and its lines: the node's failure,
#                      then node1's rank killed by srun, which is not a rank dead first): requeued at
#                      the full size
#   refused-shrink     node2 down after a save; the re-run on node1 exits 2 (the smaller world cannot
#                      keep the global batch): requeued at the full size, not ended
#   own-pmix-fence     SLURM_PMIX_FENCE=tree set by the submitter: the runs get it unchanged
# Spares and the watchdog's line:
#   spare-takes-place  GTRAIN_SPARE_NODES=1 of node1..3: run 1 on node1,node2; the watchdog names node2
#                      (76): run 2 on node1 and the spare node3, node2 waits as a spare; ends 0
#   spare-none-left    GTRAIN_SPARE_NODES=2 of 2 nodes: exit 2, no run
#   verdict-ends-step  a run that prints the watchdog's line naming node2 and then never ends: the script
#                      ends it (SIGTERM) GTRAIN_VERDICT_WAIT (1) s later, and requeues (GTRAIN_RETRIES=0)
#   killed-ends-step   GTRAIN_SPARE_NODES=1 of node1..3: run 1 prints srun's line for a rank on node2
#                      dead of SIGKILL and never ends (no watchdog line yet): the script ends it
#                      GTRAIN_VERDICT_WAIT (default 1) s later; run 2 on node1 and the spare node3
# Every run of every case must see SLURM_PMIX_FENCE=ring (the submitter's own value in own-pmix-fence):
# the fences of MPI_Init are then barriers of all nodes (why: launch/gtrain.sbatch).
# About 10 s.
set -uo pipefail
script=$1 work=$2
shift 2
rm -rf "$work" && mkdir -p "$work/bin" || exit 1

cat >"$work/bin/srun" <<'EOF'
#!/usr/bin/env bash
[[ "${1:-}" == --mpi=list ]] && { echo "srun: MPI types are...: pmix"; exit 0; }
n=$(($(cat "$FAKE_DIR/runs" 2>/dev/null || echo 0) + 1))
echo "$n" >"$FAKE_DIR/runs"
code=$(sed -n "${n}p" "$FAKE_DIR/codes")
echo "srun run $n started (then: $code) $*" >>"$FAKE_DIR/log"
if [[ $code == *+saved ]]; then
  echo "gtrain: saved ck/step_00000004.h5 (step 4)" >>"$FAKE_DIR/job.out"
  code=${code%+saved}
fi
if [[ $code == *+named:* ]]; then # the watchdog's line, naming rank 1 on that host
  echo "gtrain: watchdog: rank 0 has seen no new record of rank 1 for 5.0 s (limit 5 s, dist.liveness_timeout); not arrived: rank 1 (pid 77 on ${code#*+named:}): no sign of life for 5 s, stopped or dead; exit 76" >>"$FAKE_DIR/job.out"
  code=${code%%+named:*}
fi
if [[ $code == *+nodefail:* ]]; then # srun's lines for a lost node: its failure, then the rank it ends
  printf 'srun: error: Node failure on %s\nsrun: error: node1: task 0: Killed\n' "${code#*+nodefail:}" >>"$FAKE_DIR/job.out"
  code=${code%%+nodefail:*}
fi
if [[ $code == *+killed:* ]]; then # srun's line for rank 1, on that host, dead of SIGKILL
  echo "srun: error: ${code#*+killed:}: task 1: Killed" >>"$FAKE_DIR/job.out"
  code=${code%%+killed:*}
fi
echo "srun run $n: SLURM_PMIX_FENCE=${SLURM_PMIX_FENCE-unset}" >>"$FAKE_DIR/fence"
stopped() {
  if [[ $code == miss ]]; then
    echo "srun run $n: missed a SIGUSR1" >>"$FAKE_DIR/log"
    code=wait
    return
  fi
  echo "srun run $n: got SIGUSR1" >>"$FAKE_DIR/log"
  [[ $code == die ]] && exit 138
  exit 75
}
trap stopped USR1
if [[ $code == hang ]]; then # a rank that never ends by itself (stopped): only the script's TERM ends it
  trap 'echo "srun run $n: got TERM" >>"$FAKE_DIR/log"; exit 143' TERM
  trap 'echo "srun run $n: ignored SIGUSR1" >>"$FAKE_DIR/log"' USR1
  for _ in $(seq 200); do sleep 0.1; done
  echo "srun run $n: no TERM came" >>"$FAKE_DIR/log"
  exit 76
fi
if [[ $code == wait || $code == die || $code == miss ]]; then
  for _ in $(seq 200); do sleep 0.1; done
  echo "srun run $n: no stop came" >>"$FAKE_DIR/log"
  exit 0
fi
exit "$code"
EOF
cat >"$work/bin/scontrol" <<'EOF'
#!/usr/bin/env bash
. "$FAKE_DIR/../stop_at.sh" "scontrol $1 $2"
case "$1 ${2:-}" in
  "show job") # as scontrol prints it: StdErr= and StdOut= on lines of their own (FAKE_DIR may hold spaces)
    printf 'JobId=%s JobName=gtrain\n   JobState=RUNNING Reason=None\n   NodeList=%s\n   StdErr=%s\n   StdIn=/dev/null\n   StdOut=%s\n' \
      "$SLURM_JOB_ID" "$FAKE_NODES" "$FAKE_DIR/job.out" "$FAKE_DIR/job.out" ;;
  "show hostnames") tr ',' '\n' <<<"$3" ;;
  "show hostlist") echo "$3" ;;
  requeue* | requeuehold*) echo "scontrol $*" >>"$FAKE_DIR/log" ;;
  *) echo "scontrol: unexpected: $*" >&2; exit 1 ;;
esac
EOF
cat >"$work/bin/stat" <<'EOF'
#!/usr/bin/env bash
. "$FAKE_DIR/../stop_at.sh" stat
exec /usr/bin/stat "$@"
EOF
cat >"$work/bin/sinfo" <<'EOF'
#!/usr/bin/env bash
. "$FAKE_DIR/../stop_at.sh" sinfo
node=""
while (($#)); do [[ $1 == -n ]] && node=$2; shift; done
if [[ -n $node && " ${FAKE_DOWN:-} " == *" $node "* ]]; then echo 'down*'; else echo idle; fi
EOF
# sourced by the stand-ins: at the first call of the command named in FAKE_STOP_AT, SIGUSR1 to the
# batch shell (it runs its trap once the command it waits for is done)
cat >"$work/stop_at.sh" <<'EOF'
if [[ -n "${FAKE_STOP_AT:-}" && "$1" == "$FAKE_STOP_AT" && ! -e "$FAKE_DIR/stop-sent" ]]; then
  touch "$FAKE_DIR/stop-sent"
  echo "stop sent during: $1" >>"$FAKE_DIR/log"
  kill -USR1 "$FAKE_SBATCH_PID"
  sleep 0.3
fi
EOF
chmod +x "$work/bin/srun" "$work/bin/scontrol" "$work/bin/sinfo" "$work/bin/stat"

failed=0
# case NAME STOP_AT CODES EXPECT_SCONTROL: runs the script; the stand-in srun exits with CODES (one
# word per run); expects the scontrol line EXPECT_SCONTROL in the log, and no run that got no stop
case_() {
  local name=$1 stop_at=$2 codes=$3 expect=$4
  shift 4 # then VAR=VALUE for the script's environment
  local dir=$work/$name
  mkdir -p "$dir"
  tr ' ' '\n' <<<"$codes" >"$dir/codes"
  : >"$dir/job.out"
  : >"$dir/log"
  : >"$dir/fence"
  env -u SLURM_RESTART_COUNT -u SLURM_PMIX_FENCE ${own_fence:+SLURM_PMIX_FENCE=$own_fence} PATH="$work/bin:$PATH" FAKE_DIR="$dir" FAKE_STOP_AT="$stop_at" \
    SLURM_JOB_ID=4242 FAKE_NODES=node1,node2 SLURM_JOB_NODELIST=node1,node2 SLURM_JOB_NUM_NODES=2 SLURM_NTASKS=2 \
    SLURM_NTASKS_PER_NODE=1 GTRAIN_BIN=/bin/true GTRAIN_LAUNCHER=srun "$@" \
    bash -c 'export FAKE_SBATCH_PID=$$; exec bash "$0" "$@"' "$script" run.ini checkpoint.dir=ck >"$dir/out" 2>&1 &
  local pid=$!
  if [[ $name == stop-then-* || $name == stop-missed-once ]]; then # the stop while run 1 trains
    for _ in $(seq 300); do grep -q "srun run 1 started" "$dir/log" && break; sleep 0.1; done
    echo "stop sent while run 1 runs" >>"$dir/log"
    kill -USR1 "$pid"
  fi
  wait "$pid"
  local rc=$? why=""
  if [[ $expect == exit2 ]]; then # refused before any run
    ((rc == 2)) || why="exit $rc, expected 2"
    grep -q "started" "$dir/log" && why="$why; a run was started"
  elif [[ $expect == - ]]; then # the job ends by itself: no requeue
    ((rc == 0)) || why="exit $rc, expected 0"
    grep -q "^scontrol requeue" "$dir/log" && why="$why; requeued"
  else
    ((rc == 0)) || why="exit $rc, expected 0"
    grep -qx "scontrol $expect" "$dir/log" || why="$why; no '$expect'"
  fi
  grep -q "no stop came" "$dir/log" && why="$why; a run never got the stop"
  # a stop that came while no step ran: no step is started after it
  sed -n '/^stop sent during/,$p' "$dir/log" | grep -q "started" && why="$why; a run was started after the stop"
  grep -v "SLURM_PMIX_FENCE=${own_fence:-ring}\$" "$dir/fence" | grep -q . &&
    why="$why; a run did not get SLURM_PMIX_FENCE=${own_fence:-ring} ($(paste -sd ';' "$dir/fence"))"
  [[ $name == saves-failing || $name == *-no-rerun ]] && grep -q "srun run 2" "$dir/log" && why="$why; run again"
  [[ $name == refused-shrink ]] && ! grep -q "srun run 2 started (then: 2) .*--nodelist=node1 " "$dir/log" &&
    why="$why; not re-run on node1 alone"
  [[ $name == lost-no-rerun || $name == refused-shrink ]] && ! grep -q "requeueing at the full size" "$dir/out" &&
    why="$why; not requeued at the full size"
  if [[ $name == spare-takes-place ]]; then
    grep -q "srun run 1 started (then: 76+named:node2) .*--nodelist=node1,node2 " "$dir/log" ||
      why="$why; run 1 not on node1,node2 alone"
    grep -q "srun run 2 started (then: 0) .*--nodelist=node1,node3 " "$dir/log" || why="$why; run 2 not on node1,node3"
    grep -q "in place of the nodes left out: node3 (spare(s) still waiting: node2)" "$dir/out" ||
      why="$why; no line saying node3 took the place and node2 waits"
  fi
  if [[ $name == killed-ends-step ]]; then
    grep -q "srun run 1: got TERM" "$dir/log" || why="$why; the held step was not ended"
    grep -q "srun run 1: no TERM came" "$dir/log" && why="$why; the step was ended only by its own time limit"
    grep -q "a rank died of a signal and the step still runs 1 s later: ending it" "$dir/out" ||
      why="$why; no line saying the script ended it"
    grep -q "srun run 2 started (then: 0) .*--nodelist=node1,node3 " "$dir/log" || why="$why; run 2 not on node1,node3"
  fi
  if [[ $name == verdict-ends-step ]]; then
    grep -q "srun run 1: got TERM" "$dir/log" || why="$why; the held step was not ended"
    grep -q "the watchdog named a rank and the step still runs 1 s later: ending it" "$dir/out" ||
      why="$why; no line saying the script ended it"
  fi
  [[ $expect == requeuehold* ]] && ! grep -q "the job is held; fix the storage, then: scontrol release 4242" "$dir/out" &&
    why="$why; no line naming the storage and scontrol release"
  printf '%-18s exit %3d  %s | %s\n' "$name" "$rc" "${why:-ok}" "$(paste -sd ';' "$dir/log")"
  if [[ -n $why ]]; then
    failed=1
    sed 's/^/    | /' "$dir/out"
    [[ -n ${GTRAIN_MUTANTS_FAIL_FAST:-} ]] && { echo FAIL; exit 1; } # tools/mutants.py: the first failing case is enough
  fi
}

cases=("$@")
((${#cases[@]})) || cases=(stop-then-75 stop-before-run stop-between-runs stop-in-step-cmd stop-at-launch stop-missed-once
                             stop-then-killed saves-failing hang-no-rerun lost-no-rerun refused-shrink
                             own-pmix-fence spare-takes-place spare-none-left verdict-ends-step killed-ends-step)
for c in "${cases[@]}"; do
  case $c in
    stop-then-75) case_ "$c" "" "wait" "requeue 4242" ;;
    stop-before-run) case_ "$c" "scontrol show job" "wait" "requeue 4242" ;;
    stop-between-runs) case_ "$c" "sinfo" "76 wait" "requeue 4242" ;;
    stop-in-step-cmd) case_ "$c" "scontrol show hostlist" "76 wait" "requeue 4242" ;;
    stop-at-launch) case_ "$c" "stat" "wait" "requeue 4242" ;;
    stop-missed-once) case_ "$c" "" "miss" "requeue 4242" ;;
    stop-then-killed) case_ "$c" "" "die" "requeue 4242" ;;
    saves-failing) case_ "$c" "" "74 0" "requeuehold 4242" ;;
    hang-no-rerun) case_ "$c" "" "76" "requeue 4242" GTRAIN_RETRIES=0 ;;
    lost-no-rerun) case_ "$c" "" "137+nodefail:node2" "requeue 4242" GTRAIN_RETRIES=0 FAKE_DOWN=node2 ;;
    refused-shrink) case_ "$c" "" "137+saved 2" "requeue 4242" FAKE_DOWN=node2 ;;
    own-pmix-fence) own_fence=tree case_ "$c" "" "75" "requeue 4242" ;;
    spare-takes-place) case_ "$c" "" "76+named:node2 0" - GTRAIN_SPARE_NODES=1 FAKE_NODES=node1,node2,node3 \
                         SLURM_JOB_NODELIST=node1,node2,node3 SLURM_JOB_NUM_NODES=3 SLURM_NTASKS=3 ;;
    spare-none-left) case_ "$c" "" "0" exit2 GTRAIN_SPARE_NODES=2 ;;
    verdict-ends-step) case_ "$c" "" "hang+named:node2" "requeue 4242" GTRAIN_RETRIES=0 GTRAIN_VERDICT_WAIT=1 ;;
    killed-ends-step) case_ "$c" "" "hang+killed:node2 0" - GTRAIN_SPARE_NODES=1 FAKE_NODES=node1,node2,node3 \
                        SLURM_JOB_NODELIST=node1,node2,node3 SLURM_JOB_NUM_NODES=3 SLURM_NTASKS=3 ;;
    *) echo "unknown case $c"; exit 2 ;;
  esac
done
((failed)) && { echo FAIL; exit 1; }
echo PASS
