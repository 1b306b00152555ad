#!/usr/bin/env bash
# run_slurm_test.sh — launch/gtrain.sbatch on a real one-node Slurm cluster: a job stopped by SIGTERM
# saves its state, exits 75, requeues itself, resumes from the saved step and ends with exactly the
# weights and optimizer state of an uninterrupted run.
#
#   bash tests/slurm/run_slurm_test.sh BIN_DIR SOURCE_DIR     (BIN_DIR holds gtrain and gtrain-prep)
#
# It starts its own munged, slurmctld and slurmd (Debian's munge and slurm-wlm; tools/setup-debian.sh
# --slurm installs them) with every file, socket and port private to a temporary directory, and stops
# exactly those three processes, by pid, when it ends. munged and the slurm.conf lines that do not
# depend on where the daemons run come from tests/slurm/daemons.sh, shared with tests/cluster/cluster.sh. It needs root (slurmd starts jobs as their
# user); without root or the packages it exits 77 (CTest: skipped).
#
# Steps: prepare a corpus with gtrain-prep; `sbatch -n 2 launch/gtrain.sbatch configs/tiny.ini ...`;
# stop it twice, each time once the current start has logged a few steps:
#   1. `scancel --signal=TERM JOBID`: SIGTERM to the ranks (what preemption sends to a job's steps);
#   2. `scancel --batch --signal=USR1 JOBID`: SIGUSR1 to the batch shell only, the path of the
#      time-limit warning (--signal=B:USR1@120): the script's trap forwards it to srun -> the ranks.
# Each time the job must save step_K.h5, log exit 75 and requeue itself (Restarts=1, 2); its start
# time is then moved to now (a requeued job otherwise waits ~120 s, Reason=BeginTime), and the next
# start must say it resumed from step K. The third start finishes. Then an uninterrupted
# `mpirun -np 2` run of the same config is the reference: h5diff of /model and /optim of the two
# final files must find no difference, and the per-step losses must agree. Last, a job whose binary
# exits 74 (saves keep failing) must be requeued held, with one line, and freed by scontrol release.
# (Not `scancel --signal=TERM --full`: that also hits srun inside the batch step, and srun answers
# its own SIGTERM by SIGKILLing every rank — "srun: forcing job termination" — so nothing is saved.)
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/daemons.sh" # start_munged, slurm_conf_common

SKIP=77
note() { echo "[slurm-test $(date +%T)] $*"; }
skip() { echo "SKIPPED: $*"; exit $SKIP; }
die() {
  echo "FAILED: $*"
  dump_logs
  exit 1
}

if (($# != 2)); then
  echo "usage: run_slurm_test.sh BIN_DIR SOURCE_DIR" >&2
  exit 2
fi
bin_dir=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
steps=40               # optimizer steps of the tiny model: ~0.2-0.5 s each on 2 CPU ranks
signal_after=5         # steps a start logs before it is signalled

# ---------------------------------------------------------------- can we run a cluster here?
(($(id -u) == 0)) || skip "needs root to run slurmd (CI runs this as root; run tools/setup-debian.sh --slurm)"
for cmd in munged munge slurmctld slurmd sbatch scontrol scancel sinfo srun mpirun h5diff; do
  command -v "$cmd" >/dev/null 2>&1 ||
    skip "$cmd not found: install slurm-wlm, munge, openmpi-bin and hdf5-tools (tools/setup-debian.sh --slurm)"
done
for f in "$bin_dir/gtrain" "$bin_dir/gtrain-prep" "$src/launch/gtrain.sbatch" "$src/configs/tiny.ini"; do
  [[ -e "$f" ]] || { echo "FAILED: $f is missing"; exit 1; }
done

# Nothing of an outer Slurm job (if the tests themselves run under Slurm) may leak into ours.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)

work=$(mktemp -d /tmp/gtrain-slurm-test.XXXXXX)
chmod 755 "$work"   # munged wants the socket's directory searchable by all
export SLURM_CONF="$work/slurm.conf"
pids=()             # the daemons this script started, stopped in reverse order at exit
job=""

dump_logs() {
  for f in "$work"/job-*.out "$work"/slurmctld.log "$work"/slurmd-*.log "$work"/munged.log; do
    [[ -s "$f" ]] || continue
    echo "----- $f (last 40 lines)"
    tail -n 40 "$f"
  done
}

cleanup() {
  local rc=$?
  if [[ -n "$job" ]]; then
    scancel "$job" 2>/dev/null
    for _ in $(seq 1 30); do   # let slurmd end the job's processes before it goes away itself
      state=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
      [[ -z "$state" || "$state" == CANCELLED || "$state" == COMPLETED || "$state" == FAILED ]] && break
      sleep 1
    done
  fi
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    local pid=${pids[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if ((rc == 0)); then rm -rf "$work"; else echo "(kept $work for inspection)"; fi
}
trap cleanup EXIT

# ---------------------------------------------------------------- munge + slurm, all under $work
host=$(hostname -s)
cpus=$(nproc)
# Two free TCP ports of our own (a system Slurm, if any, keeps 6817/6818).
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=$((20000 + ($$ % 4000) * 2))
for _ in $(seq 1 50); do
  port_free "$port" && port_free $((port + 1)) && break
  port=$((port + 2))
done

note "work dir $work, node $host ($cpus CPUs), slurmctld port $port"
start_munged "$work"
munge_rc=$?
pids+=("$munged_pid")
((munge_rc == 0)) || die "munged did not start"

mkdir -p "$work/state" "$work/spool/$host"
{
  cat <<EOF
# one-node test cluster of tests/slurm/run_slurm_test.sh
ClusterName=gtraintest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
KillWait=30
EOF
  slurm_conf_common "$work"
  echo "NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=500 State=UNKNOWN"
  echo "PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_CONF"
slurmctld -D -i >"$work/slurmctld.stdout" 2>&1 &
pids+=($!)
slurmd -D -N "$host" >"$work/slurmd.stdout" 2>&1 &
pids+=($!)
up=""
for _ in $(seq 1 60); do
  [[ "$(sinfo -h -o %t 2>/dev/null)" == idle* ]] && { up=1; break; }
  sleep 0.5
done
if [[ -z "$up" ]]; then
  # root and the packages are here, so this is a real failure, not a skip
  cat "$work/slurmctld.stdout" "$work/slurmd.stdout"
  die "slurmctld/slurmd did not come up (sinfo: $(sinfo -h -o '%t %E' 2>&1 | head -n 1))"
fi
note "cluster up: $(sinfo -h -o '%P %t %D nodes %c CPUs')"

# ---------------------------------------------------------------- data and config
mkdir -p "$work/data"
"$bin_dir/gtrain-prep" --val-fraction 0.1 -o "$work/data/corpus" "$src"/src/core/*.c "$src"/src/core/*.h \
  >"$work/prep.log" 2>&1 || { cat "$work/prep.log"; die "gtrain-prep failed"; }
config="$src/configs/tiny.ini"
common=(train.steps=$steps train.warmup_steps=5 data.train="$work/data/corpus.train.bin"
        data.val="$work/data/corpus.val.bin" data.val_every=0 checkpoint.every=0 checkpoint.keep=0)

# ---------------------------------------------------------------- the job, stopped and requeued
mkdir -p "$work/job"
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" sbatch --parsable -n 2 -o "$work/job-%j.out" \
      "$src/launch/gtrain.sbatch" "$config" "${common[@]}" checkpoint.dir="$work/job" \
      log.metrics="$work/job/metrics.jsonl") || die "sbatch failed"
job=${job%%;*}
out="$work/job-$job.out"
note "submitted job $job: sbatch -n 2 launch/gtrain.sbatch configs/tiny.ini train.steps=$steps ..."

job_field() { scontrol show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1; }
last_step() { # the newest training step in the job's metrics file
  local n
  n=$(sed -n 's/^{"step":\([0-9]*\),"loss".*/\1/p' "$work/job/metrics.jsonl" 2>/dev/null | tail -n 1)
  echo "${n:-0}"
}
newest_state() { ls "$work/job" 2>/dev/null | sed -n 's/^step_0*\([0-9][0-9]*\)\.h5$/\1/p' | sort -n | tail -n 1; }

# interrupt MIN_STEP RESTARTS SCANCEL_ARGS...: once the job has logged MIN_STEP, signal it; it must
# save a state file, log exit 75 and be requeued (Restarts=RESTARTS), and is released at once.
interrupt() {
  local min_step=$1 restarts=$2
  shift 2
  local deadline=$((SECONDS + 180)) state
  while (($(last_step) < min_step)); do
    ((SECONDS < deadline)) || die "the job did not reach step $min_step in 180 s (state $(job_field JobState))"
    state=$(job_field JobState)
    [[ "$state" == PENDING || "$state" == RUNNING || "$state" == CONFIGURING ]] ||
      die "job $job is $state before the signal"
    sleep 0.2
  done
  note "job $job logged step $(last_step): scancel $* $job"
  scancel "$@" "$job" || die "scancel $* failed"
  deadline=$((SECONDS + 120))
  while [[ "$(job_field Restarts)" != "$restarts" ]]; do
    ((SECONDS < deadline)) || die "job $job was not requeued within 120 s (state $(job_field JobState))"
    sleep 0.5
  done
  saved=$(newest_state)
  note "requeued: JobState=$(job_field JobState) Reason=$(job_field Reason) Restarts=$(job_field Restarts)," \
       "newest state file step $saved"
  (($(grep -c "gtrain exited with 75" "$out") == restarts)) || die "the stopped start did not end with exit 75"
  [[ -n "$saved" ]] && ((saved >= min_step && saved < steps)) ||
    die "expected a state file between step $min_step and $steps, found '${saved}'"
  # A requeued job is held until BeginTime (~120 s later); bring it forward. Not within the second of
  # the requeue: slurmd refuses to launch a job whose credential is not newer than its revocation
  # ("Job credential revoked"), and the job would fail.
  for _ in $(seq 1 20); do
    [[ "$(job_field JobState)" == PENDING ]] && break
    sleep 0.5
  done
  sleep 2
  scontrol update JobId="$job" StartTime=now || die "scontrol update StartTime=now failed"
}

# 1: SIGTERM to the ranks (what preemption and `scancel --signal=TERM` send to a job's steps)
interrupt "$signal_after" 1 --signal=TERM
saved1=$saved
# 2: SIGUSR1 to the batch shell only (the path of the time-limit warning --signal=B:USR1@120): the
#    script's trap forwards it to srun, which forwards it to the ranks
interrupt $((saved1 + signal_after)) 2 --batch --signal=USR1
saved2=$saved

deadline=$((SECONDS + 300))
while :; do
  state=$(job_field JobState)
  case "$state" in
    COMPLETED) break ;;
    PENDING | RUNNING | CONFIGURING | COMPLETING | REQUEUED | REQUEUE_HOLD) ;;
    *) die "job $job ended as $state (ExitCode $(job_field ExitCode))" ;;
  esac
  ((SECONDS < deadline)) || die "job $job did not complete within 300 s of the requeue (state $state)"
  sleep 1
done
note "job $job COMPLETED, ExitCode=$(job_field ExitCode), Restarts=$(job_field Restarts)"
[[ "$(job_field ExitCode)" == 0:0 ]] || die "ExitCode $(job_field ExitCode), expected 0:0"
grep -q "start 3 " "$out" || die "the log has no third start"
for k in "$saved1" "$saved2"; do
  grep -q "^gtrain: resumed from .*step_$(printf %08d "$k").h5 (step $k)" "$out" ||
    die "no start says it resumed from step $k"
done
note "the second and third starts resumed from steps $saved1 and $saved2"
final=$(printf "step_%08d.h5" "$steps")
[[ -f "$work/job/$final" ]] || die "no $final after the last start"

# ---------------------------------------------------------------- exit 74: the job is held
# gtrain's exit 74 (checkpoint.max_failed_saves saves in a row failed) is played by a stand-in binary:
# the script must write its line and requeue the job held, and `scontrol release` must free it.
printf '#!/bin/sh\necho "gtrain: (stand-in) saves keep failing"\nexit 74\n' >"$work/exit74"
chmod +x "$work/exit74"
held=$(cd "$work" && GTRAIN_BIN="$work/exit74" sbatch --parsable -n 1 -o "$work/job-held.out" \
       "$src/launch/gtrain.sbatch" "$config") || die "sbatch of the exit-74 job failed"
held=${held%%;*}
held_field() { scontrol show job "$held" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1; }
deadline=$((SECONDS + 120))
until [[ "$(held_field Reason)" == job_requeued_in_held_state ]]; do
  ((SECONDS < deadline)) || { scancel "$held"; die "the exit-74 job was not requeued held (JobState=$(held_field JobState) Reason=$(held_field Reason))"; }
  sleep 0.5
done
grep -q "saves of checkpoint.dir keep failing .*the job is held; fix the storage, then: scontrol release $held" \
  "$work/job-held.out" || { scancel "$held"; die "the exit-74 job's log has no line naming the storage"; }
note "exit 74: JobState=$(held_field JobState) Reason=$(held_field Reason) Priority=$(held_field Priority)"
scontrol release "$held" || { scancel "$held"; die "scontrol release failed"; }
sleep 1
[[ "$(held_field Reason)" != job_requeued_in_held_state && "$(held_field Priority)" != 0 ]] ||
  { scancel "$held"; die "scontrol release left the job held"; }
note "released: JobState=$(held_field JobState) Reason=$(held_field Reason)"
scancel "$held"

# ---------------------------------------------------------------- the uninterrupted reference
note "reference: mpirun -np 2 gtrain (no interruption)"
mkdir -p "$work/ref"
OMP_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE \
  mpirun -np 2 --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x HDF5_USE_FILE_LOCKING \
  "$bin_dir/gtrain" "$config" "${common[@]}" checkpoint.dir="$work/ref" log.metrics="$work/ref/metrics.jsonl" \
  >"$work/ref.log" 2>&1 || { tail -n 20 "$work/ref.log"; die "the reference run failed"; }
for group in /model /optim; do
  h5diff -r "$work/ref/$final" "$work/job/$final" "$group" "$group" >"$work/h5diff$(basename $group).txt" 2>&1 ||
    { head -n 30 "$work/h5diff$(basename $group).txt"; die "$group differs between the resumed and the uninterrupted run"; }
  note "h5diff -r $group: identical ($(grep -c . "$work/h5diff$(basename $group).txt") lines of report)"
done
losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1" | sort -n -k1,1 -u; }
if ! diff <(losses "$work/ref/metrics.jsonl") <(losses "$work/job/metrics.jsonl") >"$work/loss.diff"; then
  head -n 20 "$work/loss.diff"
  die "per-step losses differ between the resumed and the uninterrupted run"
fi
note "losses of all $steps steps identical; the job log:"
sed 's/^/    | /' "$out" | grep -v '| step *[0-9]*/' || true
note "PASSED"
