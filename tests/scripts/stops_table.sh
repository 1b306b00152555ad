#!/usr/bin/env bash
# The table "how a run stops" of docs/launch.md, row by row: a run is started as a user would start
# it, gets a signal after its first steps, and the test checks what the table says: the exit code
# of what was started, and (exit 75) that the ranks said "stopped by SIG..." and saved a state file.
#   stops_table.sh GTRAIN GTRAIN_PREP LOCAL_SH WORKDIR [ROW...]   (default: every row)
set -uo pipefail
gtrain=$1 prep=$2 local_sh=$3 work=$4
shift 4
# shellcheck source=SCRIPTDIR/fault_run.sh
. "$(dirname "$0")/fault_run.sh"
fault_run_dir "$prep" "$work" || exit 1
export OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_STEP_DELAY_MS=100 GTRAIN_BIN=$gtrain
mpi_flags=(--oversubscribe --bind-to none)
(($(id -u) == 0)) && mpi_flags+=(--allow-run-as-root)

failed=0
descendants() {
  local child
  for child in $(pgrep -P "$1"); do descendants "$child"; echo "$child"; done
}
# row NAME SIGNAL EXPECTED_EXIT STOPPED_BY COMMAND...: STOPPED_BY is the signal the ranks must name
# ("" when the row does not stop them by a signal of their own). NAME decides whom the signal goes to:
# *-group sends it to the process group (what a terminal's Ctrl-C does), else to the started pid.
row() {
  local name=$1 sig=$2 want=$3 by=$4
  shift 4
  local dir=$work/$name
  mkdir -p "$dir"
  # setsid: a process group of its own, as a shell gives a command it starts; env: a background job
  # of this script starts with SIGINT ignored, which a shell cannot trap, and a terminal's would not
  setsid env --default-signal=INT "$@" run.ini checkpoint.dir="$dir/ckpt" log.metrics="$dir/metrics.jsonl" >"$dir/log" 2>&1 &
  local pid=$! rc
  for _ in $(seq 600); do
    [[ -s $dir/metrics.jsonl ]] && (($(wc -l <"$dir/metrics.jsonl") >= 2)) && break
    sleep 0.1
  done
  local t0
  t0=$(date +%s.%N)
  if [[ $name == *-group ]]; then kill -"$sig" -- -"$pid"; else kill -"$sig" "$pid"; fi
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL $name: still running 60 s after SIG$sig"
    # mpirun and each rank run in process groups of their own: kill the whole tree, by pid
    local tree
    mapfile -t tree < <(descendants "$pid")
    tree+=("$pid")
    kill -9 "${tree[@]}" 2>/dev/null
    failed=1
    tail -n 15 "$dir/log"
    return
  fi
  wait "$pid"
  rc=$?
  local why=""
  ((rc == want)) || why="exit $rc, expected $want"
  if [[ -n $by ]]; then
    grep -q "stopped by SIG$by after step" "$dir/log" || why="$why; no 'stopped by SIG$by' line"
    ls "$dir"/ckpt/step_*.h5 >/dev/null 2>&1 || why="$why; no state file saved"
  fi
  printf '%-16s SIG%-5s exit %3d after %4.1f s  %s\n' "$name" "$sig" "$rc" \
    "$(echo "$(date +%s.%N) - $t0" | bc)" "${why:-ok}"
  if [[ -n $why ]]; then
    failed=1
    tail -n 15 "$dir/log"
  fi
}

rows=("$@")
((${#rows[@]})) || rows=(gtrain-INT local1-INT local2-INT local2-TERM local2-USR1 local2-INT-group mpirun-TERM mpirun-INT mpirun-USR1)
for r in "${rows[@]}"; do
  case $r in
    gtrain-INT) row "$r" INT 75 INT "$gtrain" ;;
    local1-INT) row "$r" INT 75 INT bash "$local_sh" -n 1 ;;
    local2-INT) row "$r" INT 75 USR1 bash "$local_sh" -n 2 ;;
    local2-TERM) row "$r" TERM 75 USR1 bash "$local_sh" -n 2 ;;
    local2-USR1) row "$r" USR1 75 USR1 bash "$local_sh" -n 2 ;;
    local2-INT-group) row "$r" INT 75 USR1 bash "$local_sh" -n 2 ;;
    # mpirun started by hand: it ends the job itself on SIGTERM and SIGINT and returns 1; the ranks, sent
    # SIGTERM, save only if they finish within the second before mpirun's SIGKILL, so that is not checked
    mpirun-TERM) row "$r" TERM 1 "" mpirun "${mpi_flags[@]}" -np 2 "$gtrain" ;;
    mpirun-INT) row "$r" INT 1 "" mpirun "${mpi_flags[@]}" -np 2 "$gtrain" ;;
    mpirun-USR1) row "$r" USR1 75 USR1 mpirun "${mpi_flags[@]}" -np 2 "$gtrain" ;;
    *) echo "unknown row $r"; exit 2 ;;
  esac
done
((failed)) && { echo FAIL; exit 1; }
echo PASS
