#!/usr/bin/env bash
# goodput.sh — how much of the wall time a run under faults spends on steps it keeps.
#
#   bench/goodput.sh [-c [-p SPARES]] [-m MINUTES] [-f MIN:MAX] [-k KINDS] [-a] [-s SEED] [-o WORKDIR] [section.key=value ...]
#
# Trains llama100m's shape with a byte vocabulary (configs/llama100m.ini, model.vocab_size=256
# train.micro_batch=1 train.seq_len=256: about 1.1 GB of state) on 2 CPU ranks through
# launch/local.sh, in a restart loop: whenever the job ends it is started again and resumes from the
# newest state file. Every 60-120 s (-f MIN:MAX, or --fault-every MIN-MAX: the fault rate; at random,
# seeded by -s) one fault is injected, the kinds taken in turn from a shuffled list:
#   kill     kill -9 of one rank (at random): the launcher ends the job;
#   stop     SIGSTOP of one rank: the other rank's watchdog ends it, exit 76 (its limit is
#            max(dist.timeout = 90, 10 x the slowest step): 30 s would do on an idle machine, where a
#            step takes 3 s, but a loaded one takes over 30 s for the first step of a start);
#   preempt  SIGTERM to the launcher, as a batch system's preemption: the ranks save, exit 75.
# -k KINDS (a comma list of the kinds above, and node with -c) takes the faults in that order, over
# and over, instead of shuffled rounds of all of them.
# -c (--cluster): the same on the test cluster (tests/cluster/cluster.sh up 3 + SPARES, brought up by
# the bench and taken down at its end; root, slurm-wlm, munge): one rank on each of two nodes, started
# by `sbatch --nodes=2+SPARES --ntasks-per-node=1 --cpus-per-task=1 launch/gtrain.sbatch` with
# GTRAIN_SPARE_NODES=SPARES (-p, default 1) and GTRAIN_RETRIES=1000: after a rank's or a node's loss
# the batch script runs the step again inside the allocation, a spare (or a node the watchdog named
# that still responds) in place of the node it leaves out, and the run resumes from the memory
# snapshots (each rank's with a partner copy on the other node) or the newest state file; after a
# preemption the job requeues itself. One node of the cluster stays out of the job, for a requeue
# while a lost node is away. The kinds: kill (kill -9 of the rank on one of the job's nodes taken at
# random: srun says the rank was killed and the script ends the step GTRAIN_VERDICT_WAIT s later), stop
# (SIGSTOP of it: the same, and the script ends the step GTRAIN_VERDICT_WAIT s after the watchdog's
# line), preempt (SIGTERM to the batch shell, scancel --batch: the ranks save, exit 75, requeue) and
# node (every process of a job's node with a rank that does not run the batch shell killed,
# cluster.sh kill-node: its rank, its slurmd, and its /dev/shm with the snapshots; the watchdog names
# its rank, the script ends the step and runs it again on the node left and a spare). The lost node
# comes back meanwhile: once Slurm has marked it DOWN (SlurmdTimeout; it has left the allocation) it
# is drained, started again (cluster.sh start-node), and takes jobs 70 s later
# (GTRAIN_GOODPUT_NODE_AWAY): about a minute after a lost node answers again Slurm sends it the kill
# of the step it ran when it died, which would kill a requeued start's rank there (the same job id).
# Not the batch shell's node: under --no-kill Slurm 22.05 then removes the node from the job and
# kills the batch step, and the job stays RUNNING on the other node with no script left to requeue
# it. The test cluster's Slurm: SlurmdTimeout 20 s (GTRAIN_CLUSTER_SLURMD_TIMEOUT) and AuthInfo
# cred_expire 10 s (GTRAIN_CLUSTER_CRED_EXPIRE; Slurm's default 120 s), which is also how long a
# requeued job waits before it may start again; GTRAIN_SRUN_WAIT 10 s (gtrain.sbatch's default 60 s).
# -p 0 runs without spares: every lost node then shrinks the run to one rank (grad_accum doubled).
# WORKDIR must not be under /tmp (each node has its own); the default is a new directory under /var/tmp.
# After MINUTES (default 10) the run is stopped by SIGTERM (it saves), and one table is printed:
# each fault, the time until the job had ended (detection; with -c, until the job's step had
# ended), the time from the restart to
# the first step finished (with -c: from that end, so the requeue's wait and the scheduling are in
# it), where that start resumed from (the step, and file, memory, or memory with the ranks whose
# slices came from another node), the steps redone; then goodput = steps kept x fault-free step time / wall time,
# where the steps kept are those of the newest state file at the end and the fault-free step time
# is the median step_ms of every step, and where the wall time went.
# Extra section.key=value arguments go to every start (after the bench's own), e.g.
# checkpoint.every_minutes=2 or checkpoint.async=false. The bench's own: checkpoint.every=0 and
# checkpoint.every_minutes=1 (a save at the first step boundary a minute after the last: steps take
# 3 s on an idle 2-core machine and 20 s on a loaded one), checkpoint.keep=2, dist.timeout=90,
# log.every=1. -a saves with checkpoint.every=auto instead (and checkpoint.every_minutes=0): the
# interval from the measured save cost and the fault history (docs/reliability.md); the table then gives
# the interval in force at each fault and each start's first choice. A job that has not ended 400 s
# after its fault is killed by the bench (the row says "not ended"). WORKDIR (default a new directory
# under /tmp) holds the corpus, the state files (2 x 1.1 GB), each start's log and
# metrics, faults.tsv and a copy of the binary it runs; it is kept. With -c also the job outputs
# (job.JOBID.out, split into each start's run_K.log) and the starts' raw metrics (starts/). GTRAIN_BIN and GTRAIN_PREP name
# the binaries (default build/gtrain and build/gtrain-prep of this checkout).
# bench/goodput_table.py WORKDIR prints the table again from what WORKDIR holds.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
minutes=10 seed=$$ work="" every="60:120" auto=0 cluster=0 kinds_given="" spares=1
usage() { sed -n '4p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }
while (($#)); do
  case "$1" in
    -m) minutes=$2; shift 2 ;;
    -s) seed=$2; shift 2 ;;
    -f) every=$2; shift 2 ;;
    --fault-every) every=${2/-/:}; shift 2 ;;
    -k) kinds_given=$2; shift 2 ;;
    -a) auto=1; shift ;;
    -c|--cluster) cluster=1; shift ;;
    -p) spares=$2; shift 2 ;;
    -o) work=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed -n 's/^# \{0,1\}//p'; exit 0 ;;
    -*) usage ;;
    *) break ;;
  esac
done
[[ $spares =~ ^[0-9]+$ ]] || { echo "goodput.sh: -p needs a number of spare nodes, not '$spares'" >&2; exit 2; }
[[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "goodput.sh: -m needs minutes, not '$minutes'" >&2; exit 2; }
[[ $every =~ ^([0-9]+):([0-9]+)$ ]] && ((BASH_REMATCH[1] <= BASH_REMATCH[2])) ||
  { echo "goodput.sh: -f needs MIN:MAX seconds (--fault-every MIN-MAX), not '$every'" >&2; exit 2; }
gap_min=${BASH_REMATCH[1]} gap_max=${BASH_REMATCH[2]}
all_kinds="kill stop preempt"
((cluster)) && all_kinds+=" node"
order=()
if [[ -n $kinds_given ]]; then
  IFS=, read -ra order <<<"$kinds_given"
  for k in "${order[@]}"; do
    [[ " $all_kinds " == *" $k "* ]] ||
      { echo "goodput.sh: -k: '$k' is not one of: $all_kinds${cluster:+}$( ((cluster)) || echo ' (node needs -c)')" >&2; exit 2; }
  done
fi
bin="${GTRAIN_BIN:-$root/build/gtrain}" prep="${GTRAIN_PREP:-$root/build/gtrain-prep}"
for b in "$bin" "$prep"; do [[ -x $b ]] || { echo "goodput.sh: $b not found: build first" >&2; exit 2; }; done
if ((cluster)); then
  (($(id -u) == 0)) || { echo "goodput.sh: -c needs root (the test cluster's namespaces and daemons)" >&2; exit 2; }
  work=${work:-$(mktemp -d /var/tmp/gtrain-goodput.XXXXXX)}
  case "$(mkdir -p "$work" && cd "$work" && pwd)" in
    /tmp | /tmp/* | *' '*) echo "goodput.sh: -c: WORKDIR '$work' is under /tmp (each node has its own) or has a space" >&2; exit 2 ;;
  esac
fi
work=${work:-$(mktemp -d /tmp/gtrain-goodput.XXXXXX)}
mkdir -p "$work" && cd "$work" || exit 2
work=$PWD
rm -rf ckpt ./*.jsonl ./run_*.log faults.tsv starts ./job.*.out
RANDOM=$seed
"$prep" --val-fraction 0 -o corpus /usr/share/common-licenses/* >/dev/null || exit 2
cp "$bin" ./gtrain || exit 2 # a private copy: a rebuild during the bench must not break a restart
export GTRAIN_BIN=$work/gtrain
settings=(model.vocab_size=256 train.micro_batch=1 train.seq_len=256 train.steps=1000000 train.warmup_steps=10
          data.train="$work/corpus.train.bin" checkpoint.dir="$work/ckpt" checkpoint.resume=auto
          checkpoint.every=0 checkpoint.every_minutes=1 checkpoint.keep=2 dist.timeout=90 log.every=1)
((auto)) && settings+=(checkpoint.every=auto checkpoint.every_minutes=0)
settings+=("$@")
echo "goodput.sh: $minutes min in $work, seed $seed$( ((cluster)) && echo ', on the 2-node test cluster'); settings: ${settings[*]}" >&2

now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
rand_between() { echo $(($1 + RANDOM % ($2 - $1 + 1))); }
ranks() { # this run's ranks: processes named gtrain working in $work
  for pid in $(pgrep -x gtrain); do
    [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$work" ]] && echo "$pid"
  done
  return 0
}
last_step() { # the newest step line of a metrics file, or 0
  local s
  s=$(grep -o '"step":[0-9]*,"loss"' "$1" 2>/dev/null | tail -n 1 | grep -o '[0-9]*')
  echo "${s:-0}"
}
newest_saved() {
  local f
  f=$(find ckpt -maxdepth 1 -name 'step_*.h5' 2>/dev/null | sort | tail -n 1)
  [[ -n $f ]] && { f=${f##*step_}; echo $((10#${f%.h5})); } || echo 0
}
# resumed_from: from a start's log on stdin, where it resumed: sets resumed (the step, 0 for none) and
# source (file, memory, or memory with the ranks whose slices came from another node)
resumed_from() {
  local text line ranks_from
  text=$(cat)
  resumed=$(grep -o 'resumed from .* (step [0-9]*)' <<<"$text" | head -n 1 | grep -o '[0-9]*)$' | tr -d ')')
  if [[ -n $resumed ]]; then source=file; return; fi
  # a memory snapshot's resume line names its step differently, and the ranks sent from other nodes
  line=$(grep -o 'resumed from the memory snapshot of step .*' <<<"$text" | head -n 1)
  resumed=$(grep -o '^resumed from the memory snapshot of step [0-9]*' <<<"$line" | grep -o '[0-9]*$')
  if [[ -n $resumed ]]; then
    ranks_from=$(grep -o 'the slices\{0,1\} of ranks\{0,1\} [0-9,]* from' <<<"$line" | grep -o '[0-9][0-9,]*')
    source=memory
    [[ -n $ranks_from ]] && source="memory, rank ${ranks_from} from another node"
    return
  fi
  resumed=0 source=none
}

all_list=($all_kinds)
kinds=()
next_kind() { # the kinds in turn: as -k gave them, else each round of all of them shuffled
  if ((${#kinds[@]} == 0)); then
    if ((${#order[@]})); then
      kinds=("${order[@]}")
    else
      kinds=("${all_list[@]}")
      for ((i = ${#kinds[@]} - 1; i > 0; i--)); do j=$((RANDOM % (i + 1))); t=${kinds[i]}; kinds[i]=${kinds[j]}; kinds[j]=$t; done
    fi
  fi
  kind=${kinds[0]}
  kinds=("${kinds[@]:1}")
}

# ---------------------------------------------------------------- the test cluster (-c)
job="" restarts=0 jobs_run=() start_keys=() prev_key="" backs=()
if ((cluster)); then
  cluster_sh=$root/tests/cluster/cluster.sh
  export GTRAIN_CLUSTER_SLURMD_TIMEOUT=${GTRAIN_CLUSTER_SLURMD_TIMEOUT:-20}
  export GTRAIN_CLUSTER_CRED_EXPIRE=${GTRAIN_CLUSTER_CRED_EXPIRE:-10}
  export GTRAIN_SRUN_WAIT=${GTRAIN_SRUN_WAIT:-10}
  node_away=${GTRAIN_GOODPUT_NODE_AWAY:-70}
  # what the nodes read, copied as the binary is
  cp "$root/configs/llama100m.ini" "$root/launch/gtrain.sbatch" "$work/" || exit 2
  mkdir -p starts
  # each start's metrics in a file of its own, named by the job's id, its restart count and the job
  # step (every start of a requeued job, and every re-run inside one, gets the same arguments); rank 0
  # marks where the start's lines begin in the job's output
  cat >gtrain-start <<EOF
#!/bin/sh
key="\${SLURM_JOB_ID:-0}.\${SLURM_RESTART_COUNT:-0}.\${SLURM_STEP_ID:-0}"
[ "\${SLURM_PROCID:-0}" = 0 ] && echo "goodput.sh: start \$key"
exec "$work/gtrain" "\$@" log.metrics="$work/starts/metrics.\$key.jsonl"
EOF
  chmod +x gtrain-start
  while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)
  trap 'for p in "${backs[@]}"; do kill "$p" 2>/dev/null; done; bash "$cluster_sh" down' EXIT
  env_lines=$(bash "$cluster_sh" up $((3 + spares))) || { echo "goodput.sh: cluster.sh up $((3 + spares)) failed" >&2; exit 1; }
  eval "$env_lines"
fi
# node_back I: node I, lost, back: once Slurm has marked it DOWN it is drained, its slurmd started
# again, and $node_away s later it takes jobs again. Drained so long because Slurm, about a minute
# after a lost node answers again, sends it the kill of the job's step it ran when it died; a new
# start of the job there by then (the same job id) would lose its rank to it.
node_back() {
  for _ in $(seq 600); do [[ $(sinfo -h -N -n "gtc-n$1" -o %t 2>/dev/null) == down* ]] && break; sleep 0.5; done
  scontrol update NodeName="gtc-n$1" State=DRAIN Reason="goodput.sh: back from a node loss"
  for _ in $(seq 100); do [[ -z $(ip netns pids "gtc-node$1" 2>/dev/null) ]] && break; sleep 0.1; done
  bash "$cluster_sh" start-node "$1" || echo "goodput.sh: cluster.sh start-node $1 failed"
  sleep "$node_away"
  scontrol update NodeName="gtc-n$1" State=RESUME
  echo "goodput.sh: $(date +%T) gtc-n$1 takes jobs again"
}
job_field() { scontrol show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1; }
job_out() { echo "$work/job.$job.out"; }
submit() {
  job=$(cd "$work" && GTRAIN_BIN="$work/gtrain-start" GTRAIN_RETRIES=1000 GTRAIN_SPARE_NODES=$spares sbatch --parsable \
        --job-name=goodput --nodes=$((2 + spares)) \
        --ntasks-per-node=1 --cpus-per-task=1 -o "$work/job.%j.out" "$work/gtrain.sbatch" "$work/llama100m.ini" \
        "${settings[@]}") || { echo "goodput.sh: sbatch failed" >&2; exit 1; }
  job=${job%%;*} restarts=0
  jobs_run+=("$job")
}
start_log() { # J KEY: the job output's lines of the start (or re-run) KEY, from its rank 0's mark on
  awk -v want="goodput.sh: start $2" '/^goodput\.sh: start / { on = ($0 == want) } on' "$work/job.$1.out" 2>/dev/null
}
exits() { # the lines of the job's output that say a step ended
  local n
  n=$(grep -ac '^gtrain\.sbatch: .* gtrain exited with ' "$(job_out)" 2>/dev/null)
  echo "${n:-0}"
}
node_rank() { # NODE: the pid of the gtrain rank in node NODE's namespace, or nothing
  local pid
  for pid in $(ip netns pids "gtc-node$1" 2>/dev/null); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == gtrain ]] && { echo "$pid"; return 0; }
  done
  return 0
}
rank_of() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^SLURM_PROCID=//p;s/^OMPI_COMM_WORLD_RANK=//p' | head -n 1; }
job_over() { # the job ended instead of requeueing
  [[ $(job_field JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)$ ]]
}
# the step of the current start has ended: its exit line, a requeue by Slurm (the batch shell's node
# lost), or the job's end
step_ended() {
  (($(exits) > exits0)) && return 0
  ((++poll % 5)) && return 1 # scontrol every fifth look
  [[ $(job_field Restarts) != "$restarts" ]] || job_over
}

printf 'n\tkind\tat_s\trank\tstep_at_fault\tdetect_s\trc\trestart_to_step_s\tresumed_from\tredone\n' >faults.tsv
t_start=$(now)
deadline=$(echo "$t_start + $minutes * 60" | bc)
attempt=0 n=0 pending="" final=0 poll=0 lost=""
next_fault=$(echo "$t_start + $(rand_between "$gap_min" "$gap_max")" | bc)
while :; do
  attempt=$((attempt + 1))
  if ((cluster)); then
    # the job requeues itself after a fault (its next start is the next restart); one that ended
    # instead is submitted again
    if [[ -z $job ]]; then t_launch=$(now); submit; fi
    t_wait=$(now)
    while :; do
      # the newest start of the job: a requeue's or a re-run's inside the allocation
      metrics=$(ls -t starts/metrics."$job".*.jsonl 2>/dev/null | head -n 1)
      key=${metrics#starts/metrics.} key=${key%.jsonl}
      [[ -n $metrics && $key != "$prev_key" && $(last_step "$metrics") != 0 ]] && break
      if ((++poll % 5 == 0)); then
        r=$(job_field Restarts)
        [[ -n $r && $r != "$restarts" ]] && restarts=$r # a start that ended before its first step
        if job_over; then
          echo "goodput.sh: job $job ended $(job_field JobState) instead of requeueing: submitting it again" >&2
          submit
        fi
      fi
      if (($(echo "$(since "$t_wait") > 900" | bc))); then
        echo "goodput.sh: no first step of start $attempt within 900 s (job $job, $(job_field JobState)); see $(job_out)" >&2
        exit 1
      fi
      sleep 0.2
    done
    prev_key=$key
    start_keys+=("$key")
    restarts=${key#*.} restarts=${restarts%%.*}
  else
    metrics=metrics_$attempt.jsonl
    t_launch=$(now)
    "$root/launch/local.sh" -n 2 "$root/configs/llama100m.ini" "${settings[@]}" log.metrics="$work/$metrics" \
      >"run_$attempt.log" 2>&1 &
    launcher=$!
    # the first step of this start
    while kill -0 "$launcher" 2>/dev/null && [[ $(last_step "$metrics") == 0 ]]; do sleep 0.2; done
    if [[ $(last_step "$metrics") == 0 ]]; then
      echo "goodput.sh: start $attempt ended before its first step; see $work/run_$attempt.log" >&2
      tail -n 5 "run_$attempt.log" >&2
      exit 1
    fi
  fi
  to_first=$(since "$t_launch")
  this_log() { if ((cluster)); then start_log "$job" "$prev_key"; else cat "run_$attempt.log"; fi; }
  resumed_from < <(this_log)
  for _ in 1 2 3 4 5 6 7 8 9 10; do # its resume line may reach the log after the step's metrics line
    ((attempt == 1)) || [[ $source != none ]] && break
    sleep 0.5
    resumed_from < <(this_log)
  done
  ((attempt == 1)) && first_start=$to_first
  if [[ -n $pending ]]; then # the fault that ended the previous start
    IFS=$'\t' read -r fn fkind fat frank fstep fdetect frc <<<"$pending"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%s\n' "$fn" "$fkind" "$fat" "$frank" "$fstep" "$fdetect" "$frc" \
      "$to_first" "$resumed ($source)" $((fstep - resumed)) >>faults.tsv
    pending=""
  fi
  echo "goodput.sh: start $attempt: first step $(last_step "$metrics") after $(printf %.1f "$to_first") s" \
       "(resumed from $resumed, $source)" >&2
  exits0=$( ((cluster)) && exits || echo 0)
  # train until the next fault or the deadline
  alive() { if ((cluster)); then ! step_ended; else kill -0 "$launcher" 2>/dev/null; fi; }
  while alive; do
    t=$(now)
    (($(echo "$t >= $deadline" | bc))) && break
    (($(echo "$t >= $next_fault" | bc))) && break
    sleep 0.5
  done
  if ! alive; then
    if ((cluster)); then
      echo "goodput.sh: start $attempt ended by itself (job $job: $(job_field JobState)); see $(job_out)" >&2
    else
      wait "$launcher"
      echo "goodput.sh: start $attempt ended by itself (exit $?); see $work/run_$attempt.log" >&2
    fi
    exit 1
  fi
  t_fault=$(now)
  step_at=$(last_step "$metrics")
  if (($(echo "$t_fault >= $deadline" | bc))); then
    final=1
    if ((cluster)); then scancel --batch --signal=TERM "$job"; else kill -TERM "$launcher"; fi
  else
    n=$((n + 1))
    next_kind
    if ((cluster)); then
      # the job's nodes that run a rank (spares run none), for a node loss not the batch shell's
      batch=$(job_field BatchHost) jn=()
      for i in $(scontrol show hostnames "$(job_field NodeList)" 2>/dev/null | sed -n 's/^gtc-n//p'); do
        [[ -n $(node_rank "$i") ]] || continue
        [[ $kind == node && gtc-n$i == "$batch" ]] && continue # (see the header)
        jn+=("$i")
      done
      node=${jn[RANDOM % (${#jn[@]} > 0 ? ${#jn[@]} : 1)]:-} victim=""
      [[ -n $node ]] && victim=$(node_rank "$node")
      rank=$([[ -n $victim ]] && rank_of "$victim")
      case $kind in
        kill) kill -9 "$victim" ;;
        stop) kill -STOP "$victim" ;;
        preempt) scancel --batch --signal=TERM "$job"; rank=all ;;
        node) bash "$cluster_sh" kill-node "$node"; lost=$node; rank="$rank (gtc-n$node)" ;;
      esac
    else
      mapfile -t pids < <(ranks)
      victim=${pids[RANDOM % ${#pids[@]}]}
      rank=$(tr '\0' '\n' <"/proc/$victim/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
      case $kind in
        kill) kill -9 "$victim" ;;
        stop) kill -STOP "$victim" ;;
        preempt) kill -TERM "$launcher"; rank=all ;;
      esac
    fi
    echo "goodput.sh: fault $n: $kind (rank $rank) at step $step_at" >&2
  fi
  # the job ends: by itself (detection), or after 400 s by the bench (not detected)
  rc=""
  for _ in $(seq 4000); do
    alive || break
    sleep 0.1
  done
  if alive; then
    rc="not ended after 400 s"
    if ((cluster)); then
      for i in $(seq 0 $((2 + spares))); do pid=$(node_rank $i); [[ -n $pid ]] && kill -9 "$pid"; done
      for _ in $(seq 600); do alive || break; sleep 0.1; done
    else
      for pid in $(ranks); do kill -9 "$pid" 2>/dev/null; done
    fi
  fi
  if ((cluster)); then
    status=$(grep -a '^gtrain\.sbatch: .* gtrain exited with ' "$(job_out)" 2>/dev/null | tail -n 1 | grep -o '[0-9]*$')
    (($(exits) > exits0)) || status="none (Slurm requeued the job)" # the batch shell's node was lost
  else
    wait "$launcher"
    status=$?
  fi
  detect=$(since "$t_fault")
  t_launch=$(now) # with -c the next start is the job's own requeue: its wait counts from here
  if ((cluster)); then
    if [[ -n $lost ]]; then # the job goes on with the spare; the lost node comes back meanwhile
      node_back "$lost" >>"$work/node_back.log" 2>&1 &
      backs+=($!)
      lost=""
    fi
  else
    for pid in $(ranks); do kill -9 "$pid" 2>/dev/null; done # nothing of this start may linger
  fi
  step_at=$(last_step "$metrics") # steps finished after the fault, before the job ended, count too
  if ((final)); then
    ((cluster)) && scancel "$job" # it requeued itself after the stop's save
    break
  fi
  pending=$(printf '%d\t%s\t%.0f\t%s\t%s\t%.1f\t%s' "$n" "$kind" "$(echo "$t_fault - $t_start" | bc)" "$rank" \
    "$step_at" "$detect" "${rc:-$status}")
  next_fault=$(echo "$(now) + $(rand_between "$gap_min" "$gap_max")" | bc)
done
wall=$(since "$t_start")
kept=$(newest_saved)
if ((cluster)); then # each start's metrics and log under the names of the local starts
  for k in "${!start_keys[@]}"; do
    ln -f "starts/metrics.${start_keys[k]}.jsonl" "metrics_$((k + 1)).jsonl"
    start_log "${start_keys[k]%%.*}" "${start_keys[k]}" >"run_$((k + 1)).log"
  done
fi

printf 'wall=%s\nkept=%s\nfinal_rc=%s\nfirst_start=%s\n' "$wall" "$kept" "$status" "$first_start" >summary.txt
python3 "$root/bench/goodput_table.py" "$work"
echo "goodput.sh: logs, metrics and faults.tsv in $work" >&2
