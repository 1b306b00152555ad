#!/usr/bin/env bash
# goodput.sh — how much of the wall time a run under faults spends on steps it keeps.
#
#   bench/goodput.sh [-m MINUTES] [-f MIN:MAX] [-a] [-s SEED] [-o WORKDIR] [section.key=value ...]
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
# After MINUTES (default 10) the run is stopped by SIGTERM (it saves), and one table is printed:
# each fault, the time until the job had ended (detection), the time from the restart to the first
# step finished, the steps redone; then goodput = steps kept x fault-free step time / wall time,
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
# metrics, faults.tsv and a copy of the binary it runs; it is kept. GTRAIN_BIN and GTRAIN_PREP name
# the binaries (default build/gtrain and build/gtrain-prep of this checkout).
# bench/goodput_table.py WORKDIR prints the table again from what WORKDIR holds.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
minutes=10 seed=$$ work="" every="60:120" auto=0
usage() { sed -n '4p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }
while (($#)); do
  case "$1" in
    -m) minutes=$2; shift 2 ;;
    -s) seed=$2; shift 2 ;;
    -f) every=$2; shift 2 ;;
    --fault-every) every=${2/-/:}; shift 2 ;;
    -a) auto=1; shift ;;
    -o) work=$2; shift 2 ;;
    -h|--help) sed -n '2,32p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) usage ;;
    *) break ;;
  esac
done
[[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "goodput.sh: -m needs minutes, not '$minutes'" >&2; exit 2; }
[[ $every =~ ^([0-9]+):([0-9]+)$ ]] && ((BASH_REMATCH[1] <= BASH_REMATCH[2])) ||
  { echo "goodput.sh: -f needs MIN:MAX seconds (--fault-every MIN-MAX), not '$every'" >&2; exit 2; }
gap_min=${BASH_REMATCH[1]} gap_max=${BASH_REMATCH[2]}
bin="${GTRAIN_BIN:-$root/build/gtrain}" prep="${GTRAIN_PREP:-$root/build/gtrain-prep}"
for b in "$bin" "$prep"; do [[ -x $b ]] || { echo "goodput.sh: $b not found: build first" >&2; exit 2; }; done
work=${work:-$(mktemp -d /tmp/gtrain-goodput.XXXXXX)}
mkdir -p "$work" && cd "$work" || exit 2
rm -rf ckpt ./*.jsonl ./run_*.log faults.tsv
RANDOM=$seed
"$prep" --val-fraction 0 -o corpus /usr/share/common-licenses/* >/dev/null || exit 2
cp "$bin" ./gtrain || exit 2 # a private copy: a rebuild during the bench must not break a restart
export GTRAIN_BIN=$work/gtrain
settings=(model.vocab_size=256 train.micro_batch=1 train.seq_len=256 train.steps=1000000 train.warmup_steps=10
          data.train="$work/corpus.train.bin" checkpoint.dir="$work/ckpt" checkpoint.resume=auto
          checkpoint.every=0 checkpoint.every_minutes=1 checkpoint.keep=2 dist.timeout=90 log.every=1)
((auto)) && settings+=(checkpoint.every=auto checkpoint.every_minutes=0)
settings+=("$@")
echo "goodput.sh: $minutes min in $work, seed $seed; settings: ${settings[*]}" >&2

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

kinds=()
next_kind() { # the kinds in turn, each round shuffled
  if ((${#kinds[@]} == 0)); then
    kinds=(kill stop preempt)
    for i in 2 1; do j=$((RANDOM % (i + 1))); t=${kinds[i]}; kinds[i]=${kinds[j]}; kinds[j]=$t; done
  fi
  kind=${kinds[0]}
  kinds=("${kinds[@]:1}")
}

printf 'n\tkind\tat_s\trank\tstep_at_fault\tdetect_s\trc\trestart_to_step_s\tresumed_from\tredone\n' >faults.tsv
t_start=$(now)
deadline=$(echo "$t_start + $minutes * 60" | bc)
attempt=0 n=0 pending="" final=0
next_fault=$(echo "$t_start + $(rand_between "$gap_min" "$gap_max")" | bc)
while :; do
  attempt=$((attempt + 1))
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
  to_first=$(since "$t_launch")
  resumed=$(grep -o 'resumed from .* (step [0-9]*)' "run_$attempt.log" | grep -o '[0-9]*)$' | tr -d ')')
  [[ -n $resumed ]] || # a memory snapshot's resume line names its step differently
    resumed=$(grep -o 'resumed from the memory snapshot of step [0-9]*' "run_$attempt.log" | grep -o '[0-9]*$')
  ((attempt == 1)) && first_start=$to_first
  if [[ -n $pending ]]; then # the fault that ended the previous start
    IFS=$'\t' read -r fn fkind fat frank fstep fdetect frc <<<"$pending"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%s\n' "$fn" "$fkind" "$fat" "$frank" "$fstep" "$fdetect" "$frc" \
      "$to_first" "${resumed:-0}" $((fstep - ${resumed:-0})) >>faults.tsv
    pending=""
  fi
  echo "goodput.sh: start $attempt: first step $(last_step "$metrics") after $(printf %.1f "$to_first") s" >&2
  # train until the next fault or the deadline
  while kill -0 "$launcher" 2>/dev/null; do
    t=$(now)
    (($(echo "$t >= $deadline" | bc))) && break
    (($(echo "$t >= $next_fault" | bc))) && break
    sleep 0.5
  done
  if ! kill -0 "$launcher" 2>/dev/null; then
    wait "$launcher"
    echo "goodput.sh: start $attempt ended by itself (exit $?); see $work/run_$attempt.log" >&2
    exit 1
  fi
  t_fault=$(now)
  step_at=$(last_step "$metrics")
  if (($(echo "$t_fault >= $deadline" | bc))); then
    final=1
    kill -TERM "$launcher"
  else
    n=$((n + 1))
    next_kind
    mapfile -t pids < <(ranks)
    victim=${pids[RANDOM % ${#pids[@]}]}
    rank=$(tr '\0' '\n' <"/proc/$victim/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    case $kind in
      kill) kill -9 "$victim" ;;
      stop) kill -STOP "$victim" ;;
      preempt) kill -TERM "$launcher"; rank=all ;;
    esac
    echo "goodput.sh: fault $n: $kind (rank $rank) at step $step_at" >&2
  fi
  # the job ends: by itself (detection), or after 400 s by the bench (not detected)
  rc=""
  for _ in $(seq 4000); do
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$launcher" 2>/dev/null; then
    rc="not ended after 400 s"
    for pid in $(ranks); do kill -9 "$pid" 2>/dev/null; done
  fi
  wait "$launcher"
  status=$?
  detect=$(since "$t_fault")
  for pid in $(ranks); do kill -9 "$pid" 2>/dev/null; done # nothing of this start may linger
  step_at=$(last_step "$metrics") # steps finished after the fault, before the job ended, count too
  ((final)) && break
  pending=$(printf '%d\t%s\t%.0f\t%s\t%s\t%.1f\t%s' "$n" "$kind" "$(echo "$t_fault - $t_start" | bc)" "$rank" \
    "$step_at" "$detect" "${rc:-$status}")
  next_fault=$(echo "$(now) + $(rand_between "$gap_min" "$gap_max")" | bc)
done
wall=$(since "$t_start")
kept=$(newest_saved)

printf 'wall=%s\nkept=%s\nfinal_rc=%s\nfirst_start=%s\n' "$wall" "$kept" "$status" "$first_start" >summary.txt
python3 "$root/bench/goodput_table.py" "$work"
echo "goodput.sh: logs, metrics and faults.tsv in $work" >&2
