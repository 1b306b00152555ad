#!/usr/bin/env bash
# run_cluster_test.sh — launch/gtrain.sbatch across the Slurm nodes of tests/cluster/cluster.sh (three:
# network, UTS and mount namespaces on a bridge, one machine), two at a time and once all three:
#
#   bash tests/cluster/run_cluster_test.sh BIN_DIR SOURCE_DIR WORK_DIR
#
#   1. a hang with no re-run left: GTRAIN_RETRIES=0, the rank on gtc-n1 stopped (SIGSTOP); the watchdog
#      (dist.timeout=10) ends the step, the script requeues the job, and its next start resumes from
#      the newest state file on both nodes; the job COMPLETES;
#   1b. a lost node with no re-run left: GTRAIN_RETRIES=0, gtc-n1 killed; srun ends the step (137) when
#      Slurm takes the node out, the script requeues the job at its full size; gtc-n1 is started again
#      (cluster.sh start-node) and the job resumes on both nodes; it COMPLETES;
#   2. a smaller world that cannot keep the global batch: a job on all three nodes (24 sequences per
#      step) loses gtc-n2; the re-run on two exits 2 (16 does not divide 24), the script requeues the
#      job at its full size; gtc-n2 is started again (cluster.sh start-node) and the job resumes on three
#      nodes; it COMPLETES;
#   3. `sbatch --nodes=2 --ntasks-per-node=1 --cpus-per-task=2 launch/gtrain.sbatch configs/tiny.ini`
#      (srun --mpi=pmix, Open MPI over TCP on the bridge): one rank on each host, 2 threads each
#      (srun got --cpus-per-task), and every step's loss and the final state file equal a 2-rank
#      single-node `mpirun` run's, bit for bit;
#      and the same with GTRAIN_LAUNCHER=mpirun (Open MPI starting its daemons through srun); with
#      --ntasks-per-node=2, 2 ranks on each node equal a 4-rank one-node mpirun run;
#   3d. job 3c's 2 x 2 ranks with gradient buckets (dist.bucket_mb = 0.5: 5 buckets, 3 of them started
#      before block 0's backward ended, every step): losses and weights equal the unbucketed job's;
#   4a. its step-10 state file resumed on two nodes ends bit-identical to the uninterrupted job;
#   4. the state file those two nodes wrote at step 10 resumes on one node with one rank: grad_accum
#      1 -> 2 keeps the global batch, and the losses of steps 11..20 follow job 3's within 1e-5;
#   5. checkpoint.dir under /tmp, which each node has its own of: refused before step 1 (exit 2),
#      naming both hosts;
#   6. another build on gtc-n1 (a copy of gtrain with a byte appended): exit 2 at start-up, one line
#      naming rank 1 on gtc-n1, not run again;
#   7. SIGINT to the batch shell: the ranks save, exit 75, the job requeues itself and resumes; then the
#      rank on gtc-n1 is stopped (SIGSTOP): the watchdog (dist.timeout=10) names rank 1 on gtc-n1, and
#      the script runs the step again on gtc-n0 alone, with the global batch kept; the job COMPLETES;
#   8. node loss: every process of gtc-n1 killed mid-run; Slurm takes the node out of the --no-kill
#      allocation after SlurmdTimeout (20 s here), srun ends the step, and the script runs it again on
#      gtc-n0 from the newest state file with one rank and the global batch kept; the job COMPLETES.
#      The times from the node's death to the step's end and to the re-run's first step are printed.
#      Meanwhile a new job on gtc-n0 and gtc-n1 (dead, not yet noticed): one line naming gtc-n1, and a
#      requeue at full size instead of a smaller global batch (no state file yet);
#   9. gtc-n2's network link taken down mid-run: the watchdog ends the step, Slurm reports the node
#      failure, and the script runs the step again on gtc-n0; the job COMPLETES.
# 1, 1b and 2 come first so that a mutant of those paths of gtrain.sbatch (tests/mutants/sbatch_*) is
# caught within a minute or two. The nodes share the machine's file system except /tmp (each mounts
# its own), and Slurm's configuration takes no path with a space: a WORK_DIR under /tmp or with a space
# is replaced by /var/tmp/gtrain-cluster-test.CKSUM (the checksum of WORK_DIR, so the same build always
# gets the same one and a later run takes down what a killed one left there; a passed run removes it),
# and programs or sources under /tmp or with a space are copied into it for the nodes to read. The
# cluster is taken down on every exit (trap). Every wait has a deadline; ctest's TIMEOUT is the outer
# bound. Without root or the packages: exit 77 (skipped).
set -uo pipefail

if (($# != 3)); then
  echo "usage: run_cluster_test.sh BIN_DIR SOURCE_DIR WORK_DIR" >&2
  exit 2
fi
bin_dir=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$3
steps=20

note() { echo "[cluster-test $(date +%T)] $*"; }
# die WHY: the failure, the last lines of every job's log but the latest, and the latest one whole
# (its step lines left out): the job the failing case ran
die() {
  echo "FAILED: $*"
  local f latest
  latest=$(ls -t "$work"/job-*.out 2>/dev/null | head -n 1)
  for f in "$work"/job-*.out; do
    [[ -s "$f" && "$f" != "$latest" ]] && { echo "----- $f (last 30 lines)"; grep -av '^step' "$f" | tail -n 30; }
  done
  [[ -s "$latest" ]] && { echo "----- $latest (the latest job, whole)"; grep -av '^step' "$latest"; }
  exit 1
}
# node_visible PATH: true when the nodes can read PATH as it is (not under /tmp, no space in it)
node_visible() { case "$1" in /tmp | /tmp/* | *' '*) return 1 ;; esac; }
[[ "$work" == /* ]] || work=$PWD/$work
if ! node_visible "$work"; then
  asked=$work
  work=/var/tmp/gtrain-cluster-test.$(printf '%s' "$asked" | cksum | cut -d' ' -f1)
  note "WORK_DIR $asked is under /tmp (every node has its own) or has a space: using $work"
fi
(($(id -u) == 0)) || { echo "SKIPPED: needs root (network namespaces, slurmd)"; exit 77; }

while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)
mkdir -p "$work"
work=$(cd "$work" && pwd)
export GTRAIN_CLUSTER_DIR="$work/cluster" GTRAIN_CLUSTER_SLURMD_TIMEOUT=20
cluster="$src/tests/cluster/cluster.sh"
bash "$cluster" down # what a killed earlier run left (its pids are recorded under $work/cluster)
rm -rf "$work"
mkdir -p "$work"
trap 'bash "$cluster" down' EXIT
# What the nodes read: the programs, the config and the batch script (copied when not node_visible).
config="$src/configs/tiny.ini"
sbatch_script="$src/launch/gtrain.sbatch"
if ! node_visible "$bin_dir"; then
  mkdir -p "$work/bin" && cp "$bin_dir/gtrain" "$bin_dir/gtrain-prep" "$work/bin/" || die "cannot copy the programs to $work/bin"
  bin_dir=$work/bin
fi
if ! node_visible "$src"; then
  mkdir -p "$work/src/configs" "$work/src/launch" && cp "$config" "$work/src/configs/" &&
    cp "$sbatch_script" "$work/src/launch/" || die "cannot copy the config and batch script to $work/src"
  config="$work/src/configs/tiny.ini" sbatch_script="$work/src/launch/gtrain.sbatch"
fi
trap 'exit 1' TERM INT HUP # ctest's timeout: still through the EXIT trap
env_lines=$(bash "$cluster" up 3)
rc=$?
((rc == 77)) && { echo "SKIPPED: cluster.sh cannot run here"; exit 77; }
((rc == 0)) || die "cluster.sh up 3 failed"
eval "$env_lines"
note "cluster up: $(sinfo -h -N -o '%N %t' | tr '\n' ' ')"

mkdir -p "$work/data"
"$bin_dir/gtrain-prep" --val-fraction 0.1 -o "$work/data/corpus" "$src"/src/core/*.c >"$work/prep.log" 2>&1 ||
  die "gtrain-prep failed"
# checkpoint.memory_share=0: the cases resume from the state files they name; at the default share a
# slowed step of this model would take a memory snapshot every step, and a restart on the same nodes
# would resume from it instead (the memory snapshots have their own tests: resume_memsnap_*)
common=("train.steps=$steps" train.warmup_steps=5 data.train="$work/data/corpus.train.bin" data.val= data.val_every=0
        checkpoint.keep=0 checkpoint.memory_share=0)

job="" state=""
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
# run_job NAME SBATCH_ARGS... -- GTRAIN_ARGS...: runs the job to its end (deadline 300 s); sets job, state.
# $launcher, when set, is the script's GTRAIN_LAUNCHER (empty: its default, srun with pmix).
run_job() {
  local name=$1
  shift
  local sb=()
  while [[ $1 != -- ]]; do sb+=("$1"); shift; done
  shift
  job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" GTRAIN_REQUEUE=0 GTRAIN_LAUNCHER="${launcher:-}" sbatch --parsable "${sb[@]}" \
        -o "$work/job-$name.out" "$sbatch_script" "$config" "$@") || die "sbatch for $name failed"
  job=${job%%;*}
  local deadline=$((SECONDS + 300))
  while :; do
    state=$(job_field "$job" JobState)
    case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
    ((SECONDS < deadline)) || { scancel "$job"; die "job $name ($job) did not end within 300 s (state $state)"; }
    sleep 1
  done
}
# from PATTERN FILE: FILE's lines from the first one matching PATTERN on. Its status is always 0: a
# grep -q or head that stops reading early ends sed by SIGPIPE (when more than a pipe write is left),
# which under pipefail would fail the pipeline although grep found its line
from() { sed -n "/$1/,\$p" "$2"; return 0; }
losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1" | sort -n -k1,1 -u; }

# at_step DIR N: waits (deadline 180 s) until DIR/metrics.jsonl has N steps.
at_step() {
  local deadline=$((SECONDS + 180))
  local n
  until n=$(grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null); ((${n:-0} >= $2)); do
    ((SECONDS < deadline)) || { scancel "$job"; die "job $job did not reach step $2 in 180 s"; }
    sleep 0.2
  done
}
# wait_end SECONDS: until the job $job has ended (COMPLETING is not yet the end); sets state.
wait_end() {
  local deadline=$((SECONDS + $1))
  while state=$(job_field "$job" JobState); [[ $state =~ ^(RUNNING|CONFIGURING|PENDING|COMPLETING|REQUEUED)$ ]]; do
    ((SECONDS < deadline)) || { scancel "$job"; die "job $job still $state after $1 s"; }
    sleep 1
  done
}
# when LOG PATTERN: the time (seconds since the epoch) of the script's first log line matching PATTERN.
when() { date -d "$(grep -a "^gtrain.sbatch: .*$2" "$1" | head -n 1 | awk '{print $2" "$3}')" +%s; }

# stop_rank NODE_NS: SIGSTOP to the gtrain processes of that node's namespace (its node stays up)
stop_rank() {
  local pid stopped=""
  for pid in $(ip netns pids "$1"); do
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == gtrain ]] && kill -STOP "$pid" && stopped+=" $pid"
  done
  [[ -n "$stopped" ]] || die "no gtrain process in $1 to stop"
  note "stopped the rank in $1 (pid$stopped) at step $(grep -c '"loss"' "$2/metrics.jsonl")"
}
# requeued N: waits (deadline 150 s) until the job $job has requeued itself for the Nth time and
# pends, then brings its start forward (a requeued job otherwise waits ~120 s, BeginTime). Not
# within the second of the requeue: slurmd would refuse the job's credential as revoked.
requeued() {
  local deadline=$((SECONDS + 150)) st
  until st=$(job_field "$job" JobState); [[ "$(job_field "$job" Restarts)" == "$1" && $st == PENDING ]]; do
    [[ $st =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]] && die "job $job ended $st instead of requeueing"
    ((SECONDS < deadline)) || die "job $job was not requeued within 150 s ($st)"
    sleep 0.5
  done
  sleep 2
  scontrol update JobId="$job" StartTime=now || die "scontrol update StartTime=now failed"
}
# newest_state DIR: the step of the newest state file in DIR
newest_state() { ls "$1" 2>/dev/null | sed -n 's/^step_0*\([0-9][0-9]*\)\.h5$/\1/p' | sort -n | tail -n 1; }
# at_step_with_state DIR N [S]: until the run of DIR has logged step N and published the state file
# of step S or a later one (any, without S; the cases resume from it; an asynchronous save is
# published at a step boundary after its writers end, which on a loaded machine can be steps later);
# 60 s after step N at most
at_step_with_state() {
  at_step "$1" "$2"
  local deadline=$((SECONDS + 60)) s
  until s=$(newest_state "$1"); [[ -n $s ]] && ((s >= ${3:-0})); do
    ((SECONDS < deadline)) ||
      { scancel "$job"; die "the run of $1 published no state file of step ${3:-1} or later by step $2 + 60 s"; }
    sleep 0.2
  done
}
# kill_node_at_step I DIR N [S]: after at_step_with_state DIR N S, every process of gtc-nI (its slurmd
# and its rank) is killed; t_kill is when
kill_node_at_step() {
  at_step_with_state "$2" "$3" "${4:-}"
  t_kill=$(date +%s)
  bash "$cluster" kill-node "$1"
  note "killed every process of gtc-n$1 at step $(grep -c '"loss"' "$2/metrics.jsonl")"
}
# await_full_size_requeue WHAT: until $out says the job of $job requeues at its full size (150 s), and
# fails the test if the job ends instead
await_full_size_requeue() {
  local deadline=$((SECONDS + 150))
  until grep -q "requeueing at the full size" "$out" 2>/dev/null; do
    ((SECONDS < deadline)) || { scancel "$job"; die "the job was not requeued at its full size within 150 s of $1"; }
    [[ $(job_field "$job" JobState) =~ ^(COMPLETED|FAILED|CANCELLED)$ ]] &&
      die "the job ended $(job_field "$job" JobState) after $1, instead of requeueing at its full size"
    sleep 0.5
  done
}

# ---------------------------------------------------------------- 1. a hang with no re-run left
# GTRAIN_RETRIES=0: the rank on gtc-n1 is stopped (SIGSTOP) at step 7; rank 0's watchdog
# (dist.timeout=10) ends the step with 76, and with no re-run left the script requeues the job at
# once. Its next start (both nodes again: the stopped rank was killed with the step) resumes from the
# newest state file and completes.
# (steps paused 0.4 s: the rank is stopped only once step 5's state file is published, which an
# asynchronous save does at a step boundary after its writers end, and before the run's last step)
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" GTRAIN_RETRIES=0 GTRAIN_SRUN_WAIT=10 OMPI_MCA_mpi_yield_when_idle=1 \
      GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_STEP_DELAY_MS=400 \
      sbatch --parsable --nodes=2 -w gtc-n0,gtc-n1 --ntasks-per-node=1 -o "$work/job-spent.out" "$sbatch_script" \
      "$config" "${common[@]}" train.steps=12 dist.timeout=10 checkpoint.dir="$work/spent" checkpoint.every=5 \
      log.metrics="$work/spent/metrics.jsonl") || die "sbatch for the spent job failed"
job=${job%%;*}
out="$work/job-spent.out"
at_step_with_state "$work/spent" 7
stop_rank gtc-node1 "$work/spent"
t_stop=$(date +%s)
requeued 1
t_requeue=$(($(when "$out" "a rank hung and the watchdog ended the job") - t_stop))
newest=$(newest_state "$work/spent")
wait_end 180
[[ $state == COMPLETED ]] || die "the spent job ended $state, not COMPLETED after its requeue"
grep -q "no re-run left (GTRAIN_RETRIES=0)" "$out" || die "the script did not say that no re-run was left"
grep -q "a rank hung and the watchdog ended the job .*: requeueing" "$out" ||
  die "the script did not requeue the job after the watchdog's exit 76"
grep -q ", run 2 on " "$out" && die "a re-run happened with GTRAIN_RETRIES=0"
grep -q "start 2 on 2 node(s) (gtc-n\[0-1\]" "$out" || die "the requeued job did not start again on gtc-n[0-1]"
[[ -n "$newest" ]] && ((newest >= 5)) || die "no state file of step 5 or later when the job requeued ('$newest')"
from 'start 2 on ' "$out" | grep -q "^gtrain: resumed from .*step_$(printf %08d "$newest").h5 (step $newest)" ||
  die "the requeued start did not resume from the newest state file, step $newest"
(($(losses "$work/spent/metrics.jsonl" | wc -l) == 12)) || die "the spent job did not log all 12 steps"
note "GTRAIN_RETRIES=0, rank on gtc-n1 stopped -> watchdog exit 76, requeued: $t_requeue s; the next start" \
     "resumed from step $newest on both nodes; job COMPLETED"

# ---------------------------------------------------------------- 1b. a lost node with no re-run left
# GTRAIN_RETRIES=0 again, and gtc-n1 killed at step 7 (every process: its slurmd and its rank), with
# dist.timeout left at its default and dist.liveness_timeout = 0 (off), so that Slurm, not the
# watchdog, ends the step (137 when it takes the node out after SlurmdTimeout); the cases below leave
# the liveness limit on. With no re-run left the script requeues the job at its full size;
# gtc-n1 is started again (cluster.sh start-node), and the next start resumes and completes.
# (steps paused 0.3 s, as in the case above: unpaused, the 12 steps can end before the kill when
# step 5's save is slow to publish)
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" GTRAIN_RETRIES=0 GTRAIN_SRUN_WAIT=10 OMPI_MCA_mpi_yield_when_idle=1 \
      GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_STEP_DELAY_MS=300 \
      sbatch --parsable --nodes=2 -w gtc-n0,gtc-n1 --ntasks-per-node=1 -o "$work/job-gone.out" "$sbatch_script" \
      "$config" "${common[@]}" train.steps=12 checkpoint.dir="$work/gone" checkpoint.every=5 \
      dist.liveness_timeout=0 log.metrics="$work/gone/metrics.jsonl") || die "sbatch for the gone job failed"
job=${job%%;*}
out="$work/job-gone.out"
kill_node_at_step 1 "$work/gone" 7 5
await_full_size_requeue "gtc-n1's death with no re-run left"
t_requeue=$(($(when "$out" "requeueing at the full size") - t_kill))
grep -q "gtrain exited with 137" "$out" && grep -q "no re-run left (GTRAIN_RETRIES=0)" "$out" &&
  grep -q "requeueing at the full size (exit 137)" "$out" || die "the lost node's exit 137 was not requeued at the full size"
bash "$cluster" start-node 1 || die "cluster.sh start-node 1 failed"
requeued 1
newest=$(newest_state "$work/gone")
wait_end 180
[[ $state == COMPLETED ]] || die "the gone job ended $state, not COMPLETED after gtc-n1 came back"
from 'start 2 on ' "$out" | grep -q "start 2 on 2 node(s) (gtc-n\[0-1\]" || die "the requeued job did not start on gtc-n[0-1]"
from 'start 2 on ' "$out" | grep -q "^gtrain: resumed from .*step_$(printf %08d "$newest").h5 (step $newest)" ||
  die "the requeued start did not resume from the newest state file, step $newest"
(($(losses "$work/gone/metrics.jsonl" | wc -l) == 12)) || die "the gone job did not log all 12 steps"
note "gtc-n1 killed, no re-run left -> exit 137, requeued at full size: $t_requeue s; gtc-n1 started again ->" \
     "the job COMPLETED on gtc-n[0-1] (resumed from step $newest) $(($(date +%s) - t_kill)) s after the death"

# ---------------------------------------------------------------- 2. a smaller world that cannot keep the batch
# A job on all three nodes (3 ranks x micro_batch 8: 24 sequences per step) loses gtc-n2 at step 7.
# On the two nodes left no grad_accum keeps 24 (2 x 8 = 16 does not divide it): the re-run exits 2
# naming the keys that would, and the script requeues the job at its full size. gtc-n2's slurmd is
# started again (ReturnToService=2 takes the node back); the job starts on three nodes again and
# resumes from the newest state file, with its own grad_accum. (steps paused 0.3 s, as above)
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" GTRAIN_SRUN_WAIT=10 OMPI_MCA_mpi_yield_when_idle=1 \
      GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_STEP_DELAY_MS=300 sbatch --parsable \
      --nodes=3 --ntasks-per-node=1 -o "$work/job-full.out" "$sbatch_script" "$config" "${common[@]}" \
      train.steps=12 checkpoint.dir="$work/full" checkpoint.every=5 log.metrics="$work/full/metrics.jsonl") ||
  die "sbatch for the full-size job failed"
job=${job%%;*}
out="$work/job-full.out"
kill_node_at_step 2 "$work/full" 7 5
await_full_size_requeue "gtc-n2's death"
t_requeue=$(($(when "$out" "requeueing at the full size") - t_kill))
# gtc-n2 left out as gone (Slurm noticed first) or as named by the liveness watchdog (it did)
grep "re-run 1 of 2 on 2 node(s): gtc-n0,gtc-n1 (" "$out" | grep -q "responding: gtc-n2;\|signal: gtc-n2, excluded" ||
  die "the script did not re-run the step on gtc-n0 and gtc-n1"
grep -q "cannot keep the global batch of .*, 24 sequences per step (saved 3 ranks x micro_batch 8 x grad_accum 1): micro_batch 8 x 2 ranks = 16 does not divide it; train.micro_batch=6 train.grad_accum=2 keep it" \
  "$out" || die "gtrain on 2 ranks did not refuse the global batch of 24 naming the keys that keep it"
grep -q "requeueing at the full size (exit 2)" "$out" || die "the refused re-run was not requeued at the full size"
bash "$cluster" start-node 2 || die "cluster.sh start-node 2 failed"
requeued 1
newest=$(newest_state "$work/full")
wait_end 180
[[ $state == COMPLETED ]] || die "the full-size job ended $state, not COMPLETED after gtc-n2 came back"
from 'start 2 on ' "$out" | head -n 1 | grep -q "start 2 on 3 node(s) (gtc-n\[0-2\], 3 rank(s)" ||
  die "the requeued job did not start again on gtc-n[0-2] with 3 ranks"
from 'start 2 on ' "$out" | grep -q "^gtrain: resumed from .*step_$(printf %08d "$newest").h5 (step $newest)" ||
  die "the full-size start did not resume from the newest state file, step $newest"
from 'start 2 on ' "$out" | grep -q "keeping the global batch" && die "the full-size start rescaled grad_accum"
(($(losses "$work/full/metrics.jsonl" | wc -l) == 12)) || die "the full-size job did not log all 12 steps"
note "gtc-n2 killed -> the re-run on 2 nodes refused (24 sequences per step, 16 per round), requeued at full" \
     "size: $t_requeue s; gtc-n2 started again at once -> the job COMPLETED on 3 nodes (resumed from step $newest)" \
     "$(($(date +%s) - t_kill)) s after the death"

# ---------------------------------------------------------------- 3. two nodes vs one-node mpirun
t0=$SECONDS
run_job two --nodes=2 --ntasks-per-node=1 --cpus-per-task=2 -- "${common[@]}" \
  checkpoint.dir="$work/two" checkpoint.every=10 log.metrics="$work/two/metrics.jsonl"
note "job two ($job): $state in $((SECONDS - t0)) s"
out="$work/job-two.out"
[[ $state == COMPLETED ]] || die "job two ended $state"
grep -q "start 1 on 2 node(s) (gtc-n\[0-1\], 2 rank(s), OMP_NUM_THREADS=2)" "$out" ||
  die "the job did not start on gtc-n[0-1] with 2 ranks and OMP_NUM_THREADS=2"
grep -q "srun --mpi=pmix --wait=60 --cpus-per-task=2 " "$out" || die "srun was not given --cpus-per-task=2"
grep -q "^gtrain: threads: 2 per rank .*1 rank on the 2 cores of this node" "$out" ||
  die "rank 0 does not report 2 threads and 1 rank on its node (the other rank is on another host)"
grep -q "^gtrain: .* 2 ranks (mpi)" "$out" || die "gtrain does not report 2 ranks"
note "2 ranks on gtc-n0 and gtc-n1 (1 rank on each node), 2 threads per rank, srun --cpus-per-task=2"

mkdir -p "$work/ref"
(unset OMPI_MCA_btl OMPI_MCA_btl_tcp_if_include OMPI_MCA_oob_tcp_if_include
 OMP_NUM_THREADS=2 GOMP_SPINCOUNT=1000 HDF5_USE_FILE_LOCKING=FALSE mpirun -np 2 --allow-run-as-root --oversubscribe \
   --bind-to none -x OMP_NUM_THREADS -x GOMP_SPINCOUNT -x HDF5_USE_FILE_LOCKING "$bin_dir/gtrain" "$config" \
   "${common[@]}" checkpoint.dir="$work/ref" checkpoint.every=10 log.metrics="$work/ref/metrics.jsonl") \
  >"$work/ref.log" 2>&1 || { tail -n 20 "$work/ref.log"; die "the one-node mpirun reference failed"; }
diff <(losses "$work/ref/metrics.jsonl") <(losses "$work/two/metrics.jsonl") >"$work/loss.diff" ||
  { head "$work/loss.diff"; die "the losses of the two-node job differ from the one-node mpirun run"; }
(($(losses "$work/two/metrics.jsonl" | wc -l) == steps)) || die "job two logged fewer than $steps steps"
final=$(printf "step_%08d.h5" $steps)
for g in /model /optim; do
  h5diff -r "$work/ref/$final" "$work/two/$final" $g $g >/dev/null || die "$g of $final differs from the reference"
done
note "losses of all $steps steps and /model, /optim of $final identical to a 2-rank one-node mpirun run"

# ---------------------------------------------------------------- 3b. the same with mpirun in the allocation
t0=$SECONDS
launcher=mpirun run_job viampirun --nodes=2 --ntasks-per-node=1 --cpus-per-task=2 -- "${common[@]}" \
  checkpoint.dir="$work/viampirun" log.metrics="$work/viampirun/metrics.jsonl"
note "job viampirun ($job): $state in $((SECONDS - t0)) s"
[[ $state == COMPLETED ]] || die "job viampirun ended $state"
grep -q "): mpirun --bind-to none" "$work/job-viampirun.out" || die "the job did not start its ranks with mpirun"
grep -q "^gtrain: threads: 2 per rank .*1 rank on the 2 cores of this node" "$work/job-viampirun.out" ||
  die "with mpirun, rank 0 does not report 2 threads and 1 rank on its node"
diff <(losses "$work/ref/metrics.jsonl") <(losses "$work/viampirun/metrics.jsonl") >"$work/loss-mpirun.diff" ||
  { head "$work/loss-mpirun.diff"; die "the losses of the mpirun job differ from the one-node run"; }
h5diff -r "$work/ref/$final" "$work/viampirun/$final" /model /model >/dev/null || die "/model differs (mpirun job)"
note "GTRAIN_LAUNCHER=mpirun across the two nodes: the same losses and weights"

# ---------------------------------------------------------------- 3c. two ranks per node, 4 in all
short=(train.steps=6 checkpoint.every=6)
OMPI_MCA_mpi_yield_when_idle=1 run_job four --nodes=2 --ntasks-per-node=2 -- "${common[@]}" "${short[@]}" checkpoint.dir="$work/four" \
  log.metrics="$work/four/metrics.jsonl"
[[ $state == COMPLETED ]] || die "job four ended $state"
grep -q "^gtrain: threads: .*2 ranks on the 2 cores of this node" "$work/job-four.out" ||
  die "rank 0 does not report 2 ranks on its node"
grep -q "^gtrain: .* 4 ranks (mpi)" "$work/job-four.out" || die "gtrain does not report 4 ranks"
mkdir -p "$work/ref4"
(unset OMPI_MCA_btl OMPI_MCA_btl_tcp_if_include OMPI_MCA_oob_tcp_if_include
 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 OMPI_MCA_mpi_yield_when_idle=1 mpirun -np 4 --allow-run-as-root \
   --oversubscribe --bind-to none -x OMP_NUM_THREADS -x GOMP_SPINCOUNT "$bin_dir/gtrain" "$config" "${common[@]}" "${short[@]}" \
   checkpoint.dir="$work/ref4" log.metrics="$work/ref4/metrics.jsonl") >"$work/ref4.log" 2>&1 ||
  { tail -n 20 "$work/ref4.log"; die "the 4-rank one-node mpirun reference failed"; }
diff <(losses "$work/ref4/metrics.jsonl") <(losses "$work/four/metrics.jsonl") >/dev/null ||
  die "the losses of 2 nodes x 2 ranks differ from a 4-rank one-node mpirun run"
h5diff -r "$work/ref4/step_00000006.h5" "$work/four/step_00000006.h5" /model /model >/dev/null ||
  die "/model of 2 nodes x 2 ranks differs from the 4-rank one-node run"
note "2 nodes x 2 ranks: 2 ranks on each node, losses and weights equal a 4-rank one-node mpirun run's"

# ---------------------------------------------------------------- 3d. gradient buckets across the nodes
# Job four again with dist.bucket_mb = 0.5: ZeRO-1's reduce-scatter cut into 5 buckets (the head with
# block 3, blocks 2, 1, 0, the embedding; src/core/zero.c), started during the backward, their pieces
# crossing the link. At 4 ranks the summation order matters (at 2 any order gives a + b): the losses
# and /model must equal job four's unbucketed ones bit for bit, and every step must have started
# buckets before block 0's backward ended (buckets_early: the 3 above block 0's).
OMPI_MCA_mpi_yield_when_idle=1 run_job buckets --nodes=2 --ntasks-per-node=2 -- "${common[@]}" "${short[@]}" \
  dist.bucket_mb=0.5 checkpoint.dir="$work/buckets" log.metrics="$work/buckets/metrics.jsonl"
[[ $state == COMPLETED ]] || die "job buckets ended $state"
diff <(losses "$work/four/metrics.jsonl") <(losses "$work/buckets/metrics.jsonl") >"$work/loss-buckets.diff" ||
  { head "$work/loss-buckets.diff"; die "the bucketed losses across 2 nodes x 2 ranks differ from the unbucketed job's"; }
(($(losses "$work/buckets/metrics.jsonl" | wc -l) == 6)) || die "job buckets did not log 6 steps"
h5diff -r "$work/four/step_00000006.h5" "$work/buckets/step_00000006.h5" /model /model >/dev/null ||
  die "/model of the bucketed job differs from the unbucketed job's"
bad=$(grep '"loss"' "$work/buckets/metrics.jsonl" | grep -cv '"buckets":5,"buckets_early":3,')
((bad == 0)) || die "$bad step(s) of the bucketed job without 5 buckets, 3 started before block 0's backward ended"
note "dist.bucket_mb = 0.5 on 2 nodes x 2 ranks: 5 buckets a step, 3 started before block 0's backward ended;" \
     "losses and /model equal the unbucketed job's bit for bit"

# ---------------------------------------------------------------- 4a. two nodes' state file on two nodes
mkdir -p "$work/again"
cp -r "$work/two/step_00000010.h5" "$work/two/step_00000010.h5.d" "$work/again/"  # an asynchronous save: its rank files too
run_job again --nodes=2 --ntasks-per-node=1 --cpus-per-task=2 -- "${common[@]}" checkpoint.dir="$work/again" \
  log.metrics="$work/again/metrics.jsonl"
[[ $state == COMPLETED ]] || die "job again ended $state"
for g in /model /optim; do
  h5diff -r "$work/two/$final" "$work/again/$final" $g $g >/dev/null ||
    die "$g of $final differs after resuming step 10 on two nodes"
done
note "step 10 of the two-node job resumed on two nodes: $final bit-identical to the uninterrupted job's"

# ---------------------------------------------------------------- 4. two nodes' state file on one node
mkdir -p "$work/one"
cp -r "$work/two/step_00000010.h5" "$work/two/step_00000010.h5.d" "$work/one/"
t0=$SECONDS
run_job one --nodes=1 --ntasks-per-node=1 -- "${common[@]}" checkpoint.dir="$work/one" \
  log.metrics="$work/one/metrics.jsonl"
note "job one ($job): $state in $((SECONDS - t0)) s"
[[ $state == COMPLETED ]] || die "job one ended $state"
grep -q "keeping the global batch of .*, 16 sequences per step (saved 2 ranks x micro_batch 8 x grad_accum 1): train.grad_accum 1 -> 2 on 1 rank" \
  "$work/job-one.out" || die "the one-node job does not say it keeps the global batch of 16 with grad_accum 2"
python3 - "$work/two/metrics.jsonl" "$work/one/metrics.jsonl" <<'EOF' || die "steps 11..20 on one node do not follow the two-node job within 1e-5"
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in range(11, 21))
print(f"  steps 11..20: largest relative loss difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
EOF
note "the state file written from two nodes resumed on one node with the global batch kept"

# ---------------------------------------------------------------- 5. a node-local checkpoint.dir
run_job local --nodes=2 --ntasks-per-node=1 -- "${common[@]}" checkpoint.dir=/tmp/gtrain-node-local
grep -q "gtrain exited with 2" "$work/job-local.out" || die "a node-local checkpoint.dir did not end with exit 2"
grep "is not the same directory on every node" "$work/job-local.out" | grep -q "gtc-n0 (rank 0) sees 1 of the 2" ||
  die "the refusal does not name gtc-n0"
grep "is not the same directory on every node" "$work/job-local.out" | grep -q "gtc-n1 (rank 1) sees 1 of the 2" ||
  die "the refusal does not name gtc-n1"
grep -q "^step " "$work/job-local.out" && die "a step was trained with a node-local checkpoint.dir"
note "checkpoint.dir=/tmp/... (each node its own): exit 2 before step 1, naming gtc-n0 and gtc-n1"

# ---------------------------------------------------------------- 6. another build on one node
# GTRAIN_BIN is a script that starts, on gtc-n1 only, a copy of gtrain with one byte appended (what a
# stale install on one node looks like): exit 2 at start-up, one line naming rank 1 and gtc-n1.
cp "$bin_dir/gtrain" "$work/gtrain-other" && printf 'x' >>"$work/gtrain-other"
cat >"$work/pick.sh" <<PICK
#!/bin/sh
[ "\$(hostname)" = gtc-n1 ] && exec "$work/gtrain-other" "\$@"
exec "$bin_dir/gtrain" "\$@"
PICK
chmod +x "$work/pick.sh"
job=$(cd "$work" && GTRAIN_BIN="$work/pick.sh" GTRAIN_REQUEUE=0 sbatch --parsable --nodes=2 -w gtc-n0,gtc-n1 --ntasks-per-node=1 \
      -o "$work/job-build.out" "$sbatch_script" "$config" "${common[@]}" checkpoint.dir="$work/build") ||
  die "sbatch for the mismatched-build job failed"
job=${job%%;*}
wait_end 120
grep -q "gtrain exited with 2" "$work/job-build.out" || die "another build on gtc-n1 did not end with exit 2"
(($(grep -c "^gtrain: rank 1 on gtc-n1 runs another gtrain build than rank 0 on gtc-n0" "$work/job-build.out") == 1)) ||
  die "not one line naming rank 1 on gtc-n1"
grep -q "run 2" "$work/job-build.out" && die "exit 2 was run again"
note "another build on gtc-n1: exit 2 at start-up, one line naming rank 1 on gtc-n1; not run again"
# ---------------------------------------------------------------- 7. a hung rank, named by the watchdog
# The rank on gtc-n1 is stopped (SIGSTOP) at step 12: its node stays up, so only gtrain's watchdog
# can tell. Rank 0's watchdog names rank 1 on gtc-n1 (its liveness limit, 5 s); the script ends the
# step 1 s after that line (GTRAIN_VERDICT_WAIT; srun's GTRAIN_SRUN_WAIT=10 s would be later) and
# re-runs it without gtc-n1. (steps paused 0.2 s: unpaused, the 25 steps could end before the stop)
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" GTRAIN_SRUN_WAIT=10 OMPI_MCA_mpi_yield_when_idle=1 \
      GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_STEP_DELAY_MS=200 \
      sbatch --parsable --nodes=2 -w gtc-n0,gtc-n1 --ntasks-per-node=1 -o "$work/job-hang.out" "$sbatch_script" "$config" \
      "${common[@]}" train.steps=25 dist.timeout=10 checkpoint.dir="$work/hang" checkpoint.every=5 \
      log.metrics="$work/hang/metrics.jsonl") || die "sbatch for the hang job failed"
job=${job%%;*}
# first a stop: SIGINT to the batch shell, which its trap passes on as SIGUSR1; the ranks save and exit
# 75, and the job requeues itself (brought forward: a requeued job otherwise waits ~120 s, BeginTime)
at_step "$work/hang" 4
scancel --batch --signal=INT "$job" || die "scancel --batch --signal=INT failed"
requeued 1
out="$work/job-hang.out"
grep -q "got SIGINT; asking the ranks to save" "$out" && grep -q "gtrain exited with 75" "$out" &&
  grep -q "stopped early after saving its state: requeueing" "$out" ||
  die "SIGINT to the batch shell did not end in exit 75 and a requeue"
note "SIGINT to the batch shell at step $(grep -c '"loss"' "$work/hang/metrics.jsonl"): saved, exit 75, requeued"
at_step "$work/hang" 12
grep -q "^gtrain: resumed from " "$out" || die "the requeued start did not resume from a state file"
stop_rank gtc-node1 "$work/hang"
t_stop=$(date +%s)
wait_end 240
[[ $state == COMPLETED ]] || die "the hang job ended $state, not COMPLETED after a re-run on gtc-n0"
grep -aq "^gtrain: watchdog: rank 0 .*not arrived: rank 1 (pid [0-9]* on gtc-n1)" "$out" ||
  die "the watchdog did not name rank 1 on gtc-n1"
grep -q "re-run 1 of 2 on 1 node(s): gtc-n0 (.*named by the watchdog or whose rank died of a signal: gtc-n1, excluded)" "$out" ||
  die "the script did not re-run the step without gtc-n1"
grep -q "train.grad_accum 1 -> 2 on 1 rank" "$out" || die "the hang re-run did not keep the global batch"
note "rank on gtc-n1 stopped -> step end: $(($(when "$out" "gtrain exited with \(76\|137\)") - t_stop)) s (liveness 5 s +" \
     "1 s); -> re-run without gtc-n1 started: $(($(when "$out" "run 2 on") - t_stop)) s; job COMPLETED"

# ---------------------------------------------------------------- 7b. spares keep the run's size
# A job on all three nodes with GTRAIN_SPARE_NODES=1: the step runs on gtc-n0 and gtc-n1, and gtc-n2
# waits. The rank on gtc-n1 is stopped (SIGSTOP) once a state file is out: rank 0's liveness watchdog
# (dist.liveness_timeout, 5 s) names it, and the script ends the step GTRAIN_VERDICT_WAIT (1) s later,
# without waiting for srun --wait (its default, 60 s, here), and runs it again on gtc-n0 and the
# spare gtc-n2: 2 ranks still, grad_accum kept. Then the rank on gtc-n2 is killed (-9): srun's line
# saying so ends the step 1 s later (before the watchdog's verdict), and the second re-run takes
# gtc-n1 back (named before, still up). The losses of all 20 steps equal job two's (the
# same 2 ranks, uninterrupted) bit for bit.
kill_rank() { # NODE_NS: kill -9 of the gtrain process of that node's namespace
  local pid
  for pid in $(ip netns pids "$1"); do
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == gtrain ]] && { kill -9 "$pid"; return 0; }
  done
  die "no gtrain process in $1 to kill"
}
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" GTRAIN_REQUEUE=0 GTRAIN_SPARE_NODES=1 OMPI_MCA_mpi_yield_when_idle=1 \
      GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_STEP_DELAY_MS=300 \
      sbatch --parsable --nodes=3 --ntasks-per-node=1 --cpus-per-task=2 -o "$work/job-spare.out" "$sbatch_script" \
      "$config" "${common[@]}" checkpoint.dir="$work/spare" checkpoint.every=3 log.metrics="$work/spare/metrics.jsonl") ||
  die "sbatch for the spare job failed"
job=${job%%;*}
out="$work/job-spare.out"
at_step_with_state "$work/spare" 4
stop_rank gtc-node1 "$work/spare"
t_stop=$(date +%s)
deadline=$((SECONDS + 90))
until grep -q "in place of the nodes left out: gtc-n2 " "$out" 2>/dev/null; do
  ((SECONDS < deadline)) || { scancel "$job"; die "no re-run with the spare gtc-n2 within 90 s of the stop"; }
  sleep 0.5
done
t_rerun=$(($(when "$out" "run 2 on") - t_stop))
at_step "$work/spare" 12 # steps redone count twice: a step or more after the re-run's first
until from ', run 2 on ' "$out" | grep -aq "^step "; do
  ((SECONDS < deadline)) || { scancel "$job"; die "the re-run on the spare trained no step within 90 s of the stop"; }
  sleep 0.2
done
kill_rank gtc-node2
note "killed the rank on gtc-n2 (-9) at step $(grep -c '"loss"' "$work/spare/metrics.jsonl")"
wait_end 240
[[ $state == COMPLETED ]] || die "the spare job ended $state, not COMPLETED after two re-runs"
grep -q "spare node(s), waiting: gtc-n2" "$out" || die "the script did not keep gtc-n2 as the spare"
grep -q "start 1 on 2 node(s) (gtc-n\[0-1\], 2 rank(s)" "$out" || die "the first run was not on gtc-n[0-1] alone"
grep -aq "^gtrain: watchdog: rank 0 .*not arrived: rank 1 (pid [0-9]* on gtc-n1)" "$out" ||
  die "the watchdog did not name rank 1 on gtc-n1"
grep -q "the watchdog named a rank and the step still runs 1 s later: ending it" "$out" ||
  die "the script did not end the step held by the stopped rank"
grep -q "a rank died of a signal and the step still runs 1 s later: ending it" "$out" ||
  die "the script did not end the step of the killed rank on srun's line"
grep -q "re-run 1 of 2 on 2 node(s): gtc-n0,gtc-n2 (.*named by the watchdog or whose rank died of a signal: gtc-n1, excluded)" "$out" ||
  die "the first re-run was not on gtc-n0 and the spare gtc-n2"
grep -q "in place of the nodes left out: gtc-n2 (spare(s) still waiting: gtc-n1)" "$out" ||
  die "the first re-run did not say it took the spare gtc-n2 and keeps gtc-n1 as one"
grep -q "re-run 2 of 2 on 2 node(s): gtc-n0,gtc-n1 (.*named by the watchdog or whose rank died of a signal: gtc-n2, excluded)" "$out" ||
  die "the second re-run did not take gtc-n1 back in place of gtc-n2"
grep -q "keeping the global batch" "$out" && die "a re-run with a spare rescaled grad_accum"
diff <(losses "$work/two/metrics.jsonl") <(losses "$work/spare/metrics.jsonl") >"$work/loss-spare.diff" ||
  { head "$work/loss-spare.diff"; die "the losses of the job with two re-runs on spares differ from job two's"; }
(($(losses "$work/spare/metrics.jsonl" | wc -l) == steps)) || die "the spare job did not log all $steps steps"
note "GTRAIN_SPARE_NODES=1: rank on gtc-n1 stopped -> re-run on gtc-n0 + the spare gtc-n2 started $t_rerun s later" \
     "(liveness 5 s + 1 s); rank on gtc-n2 killed -> re-run on gtc-n0 + gtc-n1; 2 ranks throughout, losses equal job two's"

# ---------------------------------------------------------------- 8. a node lost mid-run (last: gtc-n1 stays down)
# Every process of gtc-n1 (its slurmd and its rank) is killed at step 12 or later. The job is
# --no-kill: rank 0's liveness watchdog names the lost rank 5 s later and the script ends the step 1 s
# after its line (or, when it is slower, Slurm takes the node out of the allocation after
# SlurmdTimeout, 20 s here, and srun ends the step), and the batch script runs it again on gtc-n0 alone, from the newest state file with one
# rank and the global batch kept, until the job completes. No one resubmits anything.
lost_steps=25
# (steps paused 0.2 s: the node is killed only once step 10's state file is published, which an
# asynchronous save does at a step boundary after its writers end, on a loaded machine steps later)
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" GTRAIN_REQUEUE=0 OMPI_MCA_mpi_yield_when_idle=1 \
      GTRAIN_TEST_HOOKS=1 GTRAIN_TEST_STEP_DELAY_MS=200 sbatch --parsable \
      --nodes=2 -w gtc-n0,gtc-n1 --ntasks-per-node=1 -o "$work/job-lost.out" "$sbatch_script" "$config" "${common[@]}" \
      train.steps=$lost_steps checkpoint.dir="$work/lost" checkpoint.every=5 log.metrics="$work/lost/metrics.jsonl") ||
  die "sbatch for the node-loss job failed"
job=${job%%;*}
kill_node_at_step 1 "$work/lost" 12 10
# Meanwhile, before Slurm notices, a new job on gtc-n0 and gtc-n1: a node that does not come up for
# it. srun cannot start its rank there; with no state file yet the script does not shrink (the global
# batch would change silently) but says which node and requeues the job at its full size.
never=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" sbatch --parsable --nodes=2 -w gtc-n0,gtc-n1 --ntasks-per-node=1 \
        -o "$work/job-never.out" "$sbatch_script" "$config" "${common[@]}" checkpoint.dir="$work/never") ||
  die "sbatch for the never-up job failed"
never=${never%%;*}
deadline=$((SECONDS + 90))
until grep -q "requeueing at the full size" "$work/job-never.out" 2>/dev/null; do
  ((SECONDS < deadline)) || { scancel "$never"; die "the job on a dead node was not requeued within 90 s"; }
  sleep 0.5
done
scancel "$never"
grep -q "srun could not start the ranks on gtc-n1: that node is taken as lost" "$work/job-never.out" ||
  die "the job on a dead node does not name gtc-n1"
grep -q "no state file yet to keep the global batch from: not run on fewer nodes" "$work/job-never.out" ||
  die "the job on a dead node was run on fewer nodes without a state file"
note "a job started on gtc-n1 after its death, before Slurm noticed: one line naming gtc-n1, requeued at full size"
# the first step of the re-run, timed here (the log's lines carry no time)
newest=""
until [[ -n "$newest" ]] && from ', run 2 on ' "$work/job-lost.out" | grep -aq "^step *$((newest + 1))/"; do
  newest=$(grep -a "^gtrain: resumed from " "$work/job-lost.out" | tail -n 1 | sed -n 's/.*(step \([0-9]*\)).*/\1/p')
  (($(date +%s) - t_kill < 240)) || { scancel "$job"; die "no step of a re-run within 240 s of the node's death"; }
  sleep 0.2
done
t_first=$(($(date +%s) - t_kill))
wait_end 240
out="$work/job-lost.out"
[[ $state == COMPLETED ]] || die "the node-loss job ended $state, not COMPLETED after a re-run on gtc-n0"
# gtc-n1 left out as gone (Slurm noticed first) or as named by the liveness watchdog (it did)
grep "re-run 1 of 2 on 1 node(s): gtc-n0 (" "$out" | grep -q "responding: gtc-n1;\|signal: gtc-n1, excluded" ||
  die "the script did not re-run the step on gtc-n0 alone"
((newest >= 10)) || die "the re-run did not resume from step 10 or later ('$newest')"
grep -q "train.grad_accum 1 -> 2 on 1 rank" "$out" || die "the re-run did not keep the global batch (grad_accum 1 -> 2)"
(($(losses "$work/lost/metrics.jsonl" | wc -l) == lost_steps)) || die "the node-loss job did not log all $lost_steps steps"
t_end=$(($(when "$out" "gtrain exited with \(76\|137\)") - t_kill)) # 76: the liveness limit (on here) ended it first
note "node death -> step end: $t_end s (liveness 5 s + 1 s, or SlurmdTimeout 20 s); -> the re-run's first step (step $((newest + 1))," \
     "from step_$(printf %08d "$newest").h5, 1 rank on gtc-n0, grad_accum 1 -> 2): $t_first s; job COMPLETED"

# ---------------------------------------------------------------- 9. a node's link taken down mid-run
# gtc-n2's network link goes down at step 12 (its processes keep running; the shared file system,
# the machine's own, still works there). With dist.timeout=10 rank 0's watchdog ends its rank first,
# naming rank 1 on gtc-n2 as not arrived; the script ends the step 1 s after that line (or srun after
# GTRAIN_SRUN_WAIT, or Slurm after SlurmdTimeout reports the node failure) and runs the step again on
# gtc-n0 alone (srun --overlap: the old step may still hold gtc-n0's CPUs in Slurm's books).
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" GTRAIN_REQUEUE=0 GTRAIN_SRUN_WAIT=10 OMPI_MCA_mpi_yield_when_idle=1 \
      sbatch --parsable --nodelist=gtc-n0,gtc-n2 --nodes=2 --ntasks-per-node=1 -o "$work/job-link.out" \
      "$sbatch_script" "$config" "${common[@]}" train.steps=$lost_steps dist.timeout=10 \
      checkpoint.dir="$work/link" checkpoint.every=5 log.metrics="$work/link/metrics.jsonl") ||
  die "sbatch for the link-down job failed"
job=${job%%;*}
at_step "$work/link" 12
ip -n gtc-node2 link set eth0 down || die "could not take gtc-n2's link down"
t_down=$(date +%s)
note "took gtc-n2's link down at step $(grep -c '"loss"' "$work/link/metrics.jsonl")"
wait_end 240
out="$work/job-link.out"
[[ $state == COMPLETED ]] || die "the link-down job ended $state, not COMPLETED after a re-run on gtc-n0"
# gtc-n2 left out as gone (Slurm noticed first) or as named by the watchdog (its rank 1, in the
# collective rank 0 gave up on); or, when the watchdog named both ranks (both in a save) before Slurm
# noticed, a first re-run that srun could not start on gtc-n2 and a second on gtc-n0 alone
rerun_alone="re-run 1"
if ! grep "re-run 1 of 2 on 1 node(s): gtc-n0 (" "$out" | grep -q "responding: gtc-n2;\|signal: gtc-n2, excluded"; then
  grep -q "srun could not start the ranks on gtc-n2: that node is taken as lost" "$out" &&
    grep "re-run 2 of 2 on 1 node(s): gtc-n0 (" "$out" | grep -q "responding: gtc-n2;" ||
    die "the script did not re-run the step on gtc-n0 alone"
  rerun_alone="re-run 2 (re-run 1 could not start on gtc-n2)"
fi
grep -q "train.grad_accum 1 -> 2 on 1 rank" "$out" || die "the link-down re-run did not keep the global batch"
note "gtc-n2's link down -> step end: $(($(when "$out" "gtrain exited with \\(76\\|137\\)") - t_down)) s;" \
     "-> re-run on gtc-n0 started: $(($(when "$out" "run 2 on") - t_down)) s; on gtc-n0 alone: $rerun_alone; job COMPLETED"

note "PASSED"
if [[ -n "${asked:-}" ]]; then # a directory outside the build tree: nothing of a passed run is kept there
  bash "$cluster" down
  trap - EXIT
  rm -rf "$work"
fi
