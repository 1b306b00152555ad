#!/usr/bin/env bash
# A stop signal that reaches the ranks while they start (before MPI is up, before the config is read,
# across gtrain's one restart of itself for GOMP_SPINCOUNT) is kept: the run resumes, saves after its
# first step and exits 75, and the state file it resumed from is still there. mpirun -np 2 is sent
# SIGUSR1 (it forwards it to every rank, as srun and launch/gtrain.sbatch do) while both ranks sit in
# a start-up pause (GTRAIN_TEST_START_DELAY_MS, src/core/gtrain_main.c).
#   stop_during_startup.sh GTRAIN GTRAIN_PREP WORKDIR MPIEXEC [MPIEXEC FLAGS...]
# Two cases: with GOMP_SPINCOUNT unset (gtrain restarts itself once: the signal arrives in the first
# image and must survive the exec) and set (no restart). About 20 s on 2 cores.
set -uo pipefail
gtrain=$1 prep=$2 work=$3 mpiexec=$4
shift 4
mpi_flags=("$@")
# shellcheck source=SCRIPTDIR/fault_run.sh
. "$(dirname "$0")/fault_run.sh"
fault_run_dir "$prep" "$work" || exit 1
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
(($(id -u) == 0)) && mpi_flags+=(--allow-run-as-root)
fail() { echo "FAIL: $*"; exit 1; }

descendants() {
  local child
  for child in $(pgrep -P "$1"); do descendants "$child"; echo "$child"; done
}
# the ranks of the mpirun with pid $1 that run gtrain's main (its own name once exec'd) and catch
# SIGUSR1 (SigCgt: gtrain installs its stop handlers first thing in main; a signal before that, while
# the dynamic loader still maps the libraries, ends the process as any program's would: on a busy
# machine that window outlasted a fixed pause)
ranks_started() {
  local n=0 p cgt
  for p in $(descendants "$1"); do
    [[ "$(cat /proc/"$p"/comm 2>/dev/null)" == gtrain ]] || continue
    cgt=$(awk '/^SigCgt:/ {print $2}' /proc/"$p"/status 2>/dev/null)
    [[ -n $cgt ]] && (((0x$cgt >> 9) & 1)) && n=$((n + 1))
  done
  echo "$n"
}

for spin in restart norestart; do
  dir=$work/$spin
  mkdir -p "$dir"
  ck=$dir/ckpt
  args=(run.ini checkpoint.dir="$ck" checkpoint.every=2 checkpoint.keep=0 log.metrics=)
  if [[ $spin == norestart ]]; then export GOMP_SPINCOUNT=1000; else unset GOMP_SPINCOUNT; fi
  "$mpiexec" "${mpi_flags[@]}" -np 2 "$gtrain" "${args[@]}" train.steps=4 >"$dir/first.log" 2>&1 ||
    { tail -n 20 "$dir/first.log"; fail "$spin: the first run (4 steps) failed"; }
  [[ -f $ck/step_00000004.h5 ]] || fail "$spin: the first run saved no step_00000004.h5"

  # the ranks pause 4 s as they start; the signal comes once both exist (400 steps: a run that lost
  # the stop ends within seconds, exit 0)
  GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_START_DELAY_MS=4000 setsid \
    "$mpiexec" "${mpi_flags[@]}" -np 2 "$gtrain" "${args[@]}" train.steps=400 >"$dir/second.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do (($(ranks_started "$pid") >= 2)) && break; sleep 0.1; done
  (($(ranks_started "$pid") >= 2)) || { kill -9 "$pid"; fail "$spin: the ranks did not start within 30 s"; }
  sleep 0.5
  kill -USR1 "$pid"
  for _ in $(seq 1200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    mapfile -t tree < <(descendants "$pid")
    kill -9 "${tree[@]}" "$pid" 2>/dev/null
    tail -n 20 "$dir/second.log"
    fail "$spin: still running 120 s after SIGUSR1"
  fi
  wait "$pid"
  rc=$?
  echo "$spin: SIGUSR1 during start-up: exit $rc; $(grep -h '^gtrain: \(resumed from\|stopped by\)' "$dir/second.log" | paste -sd ';' -)"
  why=""
  ((rc == 75)) || why="exit $rc, expected 75"
  grep -q "^gtrain: resumed from .*step_00000004.h5" "$dir/second.log" || why="$why; it did not resume from step 4"
  grep -q "^gtrain: stopped by SIGUSR1 after step 5; the state is saved, exit 75" "$dir/second.log" ||
    why="$why; no 'stopped by SIGUSR1 after step 5' line"
  [[ -f $ck/step_00000004.h5 && -f $ck/step_00000005.h5 ]] || why="$why; step 4 and step 5 are not both there ($(ls "$ck"))"
  if [[ -n $why ]]; then
    tail -n 20 "$dir/second.log"
    fail "$spin: $why"
  fi
done
echo PASS
