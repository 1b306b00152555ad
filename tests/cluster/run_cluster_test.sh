#!/usr/bin/env bash
# run_cluster_test.sh — launch/gtrain.sbatch across two Slurm nodes (tests/cluster/cluster.sh: network,
# UTS and mount namespaces on a bridge, one machine):
#
#   bash tests/cluster/run_cluster_test.sh BIN_DIR SOURCE_DIR WORK_DIR
#
#   1. `sbatch --nodes=2 --ntasks-per-node=1 --cpus-per-task=2 launch/gtrain.sbatch configs/tiny.ini`
#      (srun --mpi=pmix, Open MPI over TCP on the bridge): one rank on each host, 2 threads each
#      (srun got --cpus-per-task), and every step's loss and the final state file equal a 2-rank
#      single-node `mpirun` run's, bit for bit;
#      and the same with GTRAIN_LAUNCHER=mpirun (Open MPI starting its daemons through srun); with
#      --ntasks-per-node=2, 2 ranks on each node equal a 4-rank one-node mpirun run;
#   2a. its step-10 state file resumed on two nodes ends bit-identical to the uninterrupted job;
#   2. the state file those two nodes wrote at step 10 resumes on one node with one rank: grad_accum
#      1 -> 2 keeps the global batch, and the losses of steps 11..20 follow job 1's within 1e-5;
#   3. checkpoint.dir under /tmp, which each node has its own of: refused before step 1 (exit 2),
#      naming both hosts;
#   4. node loss: every process of gtc-n1 killed mid-run; the job must end within 150 s (Slurm marks
#      the node DOWN after SlurmdTimeout, 20 s here, and ends the job), and a job resubmitted on the
#      remaining node resumes from the newest state file with one rank and the global batch kept.
#      Both times are printed.
# WORK_DIR must not be under /tmp (each node has a private /tmp). The cluster is taken down on every
# exit (trap). Every wait has a deadline; ctest's TIMEOUT is the outer bound. Without root or the
# packages: exit 77 (skipped).
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
die() {
  echo "FAILED: $*"
  for f in "$work"/job-*.out; do [[ -s "$f" ]] && { echo "----- $f"; grep -v '^step' "$f" | tail -n 30; }; done
  exit 1
}
case "$work" in /tmp/*) die "WORK_DIR $work is under /tmp, which every node has its own of" ;; esac
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
trap 'exit 1' TERM INT HUP # ctest's timeout: still through the EXIT trap
env_lines=$(bash "$cluster" up 2)
rc=$?
((rc == 77)) && { echo "SKIPPED: cluster.sh cannot run here"; exit 77; }
((rc == 0)) || die "cluster.sh up 2 failed"
eval "$env_lines"
note "cluster up: $(sinfo -h -N -o '%N %t' | tr '\n' ' ')"

mkdir -p "$work/data"
"$bin_dir/gtrain-prep" --val-fraction 0.1 -o "$work/data/corpus" "$src"/src/core/*.c >"$work/prep.log" 2>&1 ||
  die "gtrain-prep failed"
config="$src/configs/tiny.ini"
common=("train.steps=$steps" train.warmup_steps=5 data.train="$work/data/corpus.train.bin" data.val= data.val_every=0
        checkpoint.keep=0)

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
        -o "$work/job-$name.out" "$src/launch/gtrain.sbatch" "$config" "$@") || die "sbatch for $name failed"
  job=${job%%;*}
  local deadline=$((SECONDS + 300))
  while :; do
    state=$(job_field "$job" JobState)
    case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
    ((SECONDS < deadline)) || { scancel "$job"; die "job $name ($job) did not end within 300 s (state $state)"; }
    sleep 1
  done
}
losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1" | sort -n -k1,1 -u; }

# ---------------------------------------------------------------- 1. two nodes vs one-node mpirun
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

# ---------------------------------------------------------------- 1b. the same with mpirun in the allocation
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

# ---------------------------------------------------------------- 1c. two ranks per node, 4 in all
short=(train.steps=6 checkpoint.every=6)
run_job four --nodes=2 --ntasks-per-node=2 -- "${common[@]}" "${short[@]}" checkpoint.dir="$work/four" \
  log.metrics="$work/four/metrics.jsonl"
[[ $state == COMPLETED ]] || die "job four ended $state"
grep -q "^gtrain: threads: .*2 ranks on the 2 cores of this node" "$work/job-four.out" ||
  die "rank 0 does not report 2 ranks on its node"
grep -q "^gtrain: .* 4 ranks (mpi)" "$work/job-four.out" || die "gtrain does not report 4 ranks"
mkdir -p "$work/ref4"
(unset OMPI_MCA_btl OMPI_MCA_btl_tcp_if_include OMPI_MCA_oob_tcp_if_include
 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 mpirun -np 4 --allow-run-as-root --oversubscribe --bind-to none \
   -x OMP_NUM_THREADS -x GOMP_SPINCOUNT "$bin_dir/gtrain" "$config" "${common[@]}" "${short[@]}" \
   checkpoint.dir="$work/ref4" log.metrics="$work/ref4/metrics.jsonl") >"$work/ref4.log" 2>&1 ||
  { tail -n 20 "$work/ref4.log"; die "the 4-rank one-node mpirun reference failed"; }
diff <(losses "$work/ref4/metrics.jsonl") <(losses "$work/four/metrics.jsonl") >/dev/null ||
  die "the losses of 2 nodes x 2 ranks differ from a 4-rank one-node mpirun run"
h5diff -r "$work/ref4/step_00000006.h5" "$work/four/step_00000006.h5" /model /model >/dev/null ||
  die "/model of 2 nodes x 2 ranks differs from the 4-rank one-node run"
note "2 nodes x 2 ranks: 2 ranks on each node, losses and weights equal a 4-rank one-node mpirun run's"

# ---------------------------------------------------------------- 2a. two nodes' state file on two nodes
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

# ---------------------------------------------------------------- 2. two nodes' state file on one node
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

# ---------------------------------------------------------------- 3. a node-local checkpoint.dir
run_job local --nodes=2 --ntasks-per-node=1 -- "${common[@]}" checkpoint.dir=/tmp/gtrain-node-local
grep -q "gtrain exited with 2" "$work/job-local.out" || die "a node-local checkpoint.dir did not end with exit 2"
grep "is not the same directory on every node" "$work/job-local.out" | grep -q "gtc-n0 (rank 0) sees 1 of the 2" ||
  die "the refusal does not name gtc-n0"
grep "is not the same directory on every node" "$work/job-local.out" | grep -q "gtc-n1 (rank 1) sees 1 of the 2" ||
  die "the refusal does not name gtc-n1"
grep -q "^step " "$work/job-local.out" && die "a step was trained with a node-local checkpoint.dir"
note "checkpoint.dir=/tmp/... (each node its own): exit 2 before step 1, naming gtc-n0 and gtc-n1"

# ---------------------------------------------------------------- 4. a node lost mid-run
# Every process of gtc-n1 (its slurmd and its rank) is killed at step 12 or later. The surviving rank
# waits in a collective until Slurm declares the node DOWN (SlurmdTimeout, 20 s on this cluster) and
# ends the job (NODE_FAIL); the job is then resubmitted on the remaining node, and resumes from the
# newest state file with one rank and the global batch kept.
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" OMPI_MCA_mpi_yield_when_idle=1 sbatch --parsable --no-requeue \
      --nodes=2 --ntasks-per-node=1 -o "$work/job-lost.out" "$src/launch/gtrain.sbatch" "$config" "${common[@]}" \
      train.steps=300 checkpoint.dir="$work/lost" checkpoint.every=5 log.metrics="$work/lost/metrics.jsonl") ||
  die "sbatch for the node-loss job failed"
job=${job%%;*}
deadline=$((SECONDS + 180))
until (($(grep -c '"loss"' "$work/lost/metrics.jsonl" 2>/dev/null || echo 0) >= 12)); do
  ((SECONDS < deadline)) || { scancel "$job"; die "the node-loss job did not reach step 12 in 180 s"; }
  sleep 0.2
done
t_kill=$SECONDS
bash "$cluster" kill-node 1
note "killed every process of gtc-n1 at step $(grep -c '"loss"' "$work/lost/metrics.jsonl")"
while state=$(job_field "$job" JobState); [[ $state == RUNNING || $state == CONFIGURING ]]; do
  ((SECONDS - t_kill < 150)) || { scancel "$job"; die "the job still runs 150 s after its node died"; }
  sleep 1
done
t_end=$((SECONDS - t_kill))
note "the job left RUNNING $t_end s after the node died: $state, $(sinfo -h -N -o '%N %t' | tr '\n' ' ')"
[[ $state == NODE_FAIL || $state == FAILED || $state == COMPLETING ]] || die "job state $state after the node died"
newest=$(ls "$work/lost" | sed -n 's/^step_0*\([0-9][0-9]*\)\.h5$/\1/p' | sort -n | tail -n 1)
[[ -n "$newest" ]] && ((newest >= 10)) || die "no state file of step 10 or later (newest: '$newest')"
t_sub=$SECONDS
job=$(cd "$work" && GTRAIN_BIN="$bin_dir/gtrain" GTRAIN_REQUEUE=0 sbatch --parsable --nodes=1 --ntasks-per-node=1 \
      -o "$work/job-resumed.out" "$src/launch/gtrain.sbatch" "$config" "${common[@]}" train.steps=$((newest + 5)) \
      checkpoint.dir="$work/lost" log.metrics="$work/lost/metrics.jsonl") || die "sbatch for the resumed job failed"
job=${job%%;*}
while ! grep -q "^step *$((newest + 1))/" "$work/job-resumed.out" 2>/dev/null; do
  state=$(job_field "$job" JobState)
  [[ $state == PENDING || $state == RUNNING || $state == CONFIGURING ]] || die "the resumed job is $state"
  ((SECONDS - t_sub < 150)) || { scancel "$job"; die "the resumed job did not train a step in 150 s"; }
  sleep 0.2
done
t_first=$((SECONDS - t_sub))
grep -q "^gtrain: resumed from .*step_$(printf %08d "$newest").h5 (step $newest)" "$work/job-resumed.out" ||
  die "the resumed job did not resume from step $newest"
grep -q "train.grad_accum 1 -> 2 on 1 rank" "$work/job-resumed.out" ||
  die "the resumed job did not keep the global batch (grad_accum 1 -> 2)"
note "node death -> job end: $t_end s (SlurmdTimeout 20 s); resubmitted on gtc-n0 -> its first step (step" \
     "$((newest + 1)), from step_$(printf %08d "$newest").h5, grad_accum 1 -> 2): $t_first s"
note "PASSED"
