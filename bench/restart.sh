#!/usr/bin/env bash
# restart.sh — how long a restart takes to its first step, and what the time goes to: the shape of
# bench/goodput.sh (llama100m with a byte vocabulary, 2 CPU ranks of one thread, 0.455 GB of state per
# rank), killed with kill -9 of its ranks and started again, each start's first step timed by gtrain's
# own `gtrain: start:` line (docs/reliability.md, "Restart to the first step") and by the wall clock
# from the launcher's start to that line. Not a test: it prints a markdown table.
#
#   bench/restart.sh [-n RESTARTS] [-s memory|file] [WORKDIR]
#
#   -n RESTARTS  restarts per source (default 6)
#   -s SOURCE    memory (resume from the memory snapshot), file (the snapshots removed before each
#                start, so it resumes from the newest state file), or both (default), alternating
#   WORKDIR      scratch (default: a new directory under /tmp): the corpus, the state files (2 x 1.1
#                GB) and each start's log; the snapshots (1.8 GB) go to a directory of their own
#                under /dev/shm (GTRAIN_SHM_DIR), removed at the end
#
# The first run trains past step 6 (a state file every 3 steps, a memory snapshot every step) and is
# killed once step 6's state file is published and a later snapshot is whole; each restart is killed once its second step has ended (its first step's snapshot whole).
# Run it on a quiet machine: the wall times move with any other load.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
n=6 sources="both"
while getopts "n:s:h" o; do
  case $o in
    n) n=$OPTARG ;;
    s) sources=$OPTARG ;;
    *) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "restart.sh: -n needs a positive number, not '$n'" >&2; exit 2; }
case $sources in memory | file | both) ;; *) echo "restart.sh: -s memory, file or both, not '$sources'" >&2; exit 2 ;; esac
bin="${GTRAIN_BIN:-$root/build/gtrain}" prep="${GTRAIN_PREP:-$root/build/gtrain-prep}"
for b in "$bin" "$prep"; do [[ -x $b ]] || { echo "restart.sh: $b not found: build first" >&2; exit 2; }; done
work=${1:-$(mktemp -d /tmp/gtrain-restart.XXXXXX)}
mkdir -p "$work" && cd "$work" || exit 2
work=$PWD
rm -rf ckpt ./*.log
shm=$(mktemp -d /dev/shm/gtrain-restart.XXXXXX) || exit 2
trap 'rm -rf "$shm"' EXIT
"$prep" --val-fraction 0 -o corpus /usr/share/common-licenses/* >/dev/null || exit 2
cp "$bin" ./gtrain || exit 2
export GTRAIN_BIN=$work/gtrain GTRAIN_SHM_DIR=$shm
settings=(model.vocab_size=256 train.micro_batch=1 train.seq_len=256 train.steps=1000000 train.warmup_steps=10
          data.train="$work/corpus.train.bin" checkpoint.dir="$work/ckpt" checkpoint.resume=auto
          checkpoint.every=3 checkpoint.every_minutes=0 checkpoint.memory_every=1 checkpoint.keep=2 log.every=1)

ranks() { # this bench's ranks: processes named gtrain working in $work
  local pid
  for pid in $(pgrep -x gtrain); do
    [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$work" ]] && echo "$pid"
  done
  return 0
}
kill_ranks() { # kill -9 of the ranks, then wait for the launcher
  local p
  for p in $(ranks); do kill -9 "$p" 2>/dev/null; done
  wait "$1" 2>/dev/null
  for _ in $(seq 50); do [[ -z $(ranks) ]] && return 0; sleep 0.1; done
  echo "restart.sh: ranks still there after kill -9" >&2
  exit 1
}
# wait_for LOG PATTERN SECONDS: until a line of LOG matches
wait_for() {
  local end=$((SECONDS + $3))
  while ((SECONDS < end)); do grep -qa "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}

"$root/launch/local.sh" -n 2 "$root/configs/llama100m.ini" "${settings[@]}" >first.log 2>&1 &
pid=$!
# step 6's state file published (a background save of 1.1 GB takes seconds here), then the line of
# the step after the next: the snapshot of the step before it is whole by then (a step's snapshot is
# refreshed after its line)
if ! wait_for first.log '^gtrain: saved .*step_0*6\.h5 ' 600; then
  echo "restart.sh: the first run did not save step 6: $work/first.log" >&2; kill_ranks "$pid"; exit 1
fi
last=$(grep -a '^step  *[0-9]*/' first.log | tail -n 1 | sed 's/^step *\([0-9]*\)\/.*/\1/')
if ! wait_for first.log "^step  *$((last + 2))/" 120; then
  echo "restart.sh: the first run stopped: $work/first.log" >&2; kill_ranks "$pid"; exit 1
fi
kill_ranks "$pid"

order=()
for ((i = 0; i < n; i++)); do
  case $sources in both) order+=(memory file) ;; *) order+=("$sources") ;; esac
done
echo "| # | resumed from | launcher to first step (s) | process start to first step (s) | MPI start | checks and plan | allocation | directory and resume | save and snapshot buffers | weights and banner | first step |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
k=0
rows=$(mktemp)
for src in "${order[@]}"; do
  k=$((k + 1))
  [[ $src == file ]] && rm -f "$shm"/gtrain-snap-*
  t0=$(date +%s.%N)
  GTRAIN_STARTUP_TIMES=1 "$root/launch/local.sh" -n 2 "$root/configs/llama100m.ini" "${settings[@]}" >"start$k.log" 2>&1 &
  pid=$!
  if ! wait_for "start$k.log" '^gtrain: start: ' 300; then
    echo "restart.sh: start $k printed no start line: $work/start$k.log" >&2; kill_ranks "$pid"; exit 1
  fi
  t1=$(date +%s.%N)
  wait_for_steps() { (($(grep -ac '^step  *[0-9]*/' "start$k.log") >= 2)); }
  for _ in $(seq 1200); do wait_for_steps && break; sleep 0.05; done
  kill_ranks "$pid"
  python3 - "$k" "$src" "$(echo "$t1 - $t0" | bc)" "start$k.log" "$rows" <<'PY'
import re, sys
k, want, wall, log, rows = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
text = open(log, errors="replace").read()
m = re.search(r"^gtrain: start: ([0-9.]+) s from the process's start to the end of the first step \((.*)\)$", text, re.M)
parts = dict((name.strip(), float(v)) for name, v in re.findall(r"([a-zA-Z ]+?) ([0-9.]+)(?: s)?(?:,|$)", m.group(2)))
if re.search(r"resumed from the memory snapshot of step (\d+)", text):
    got = "memory, step " + re.search(r"resumed from the memory snapshot of step (\d+)", text).group(1)
elif re.search(r"resumed from .*\(step (\d+)\)", text):
    got = "file, step " + re.search(r"resumed from .*\(step (\d+)\)", text).group(1)
else:
    got = "nothing (a fresh start)"
names = ["MPI start", "checks and plan", "allocation", "directory and resume", "save and snapshot buffers",
         "weights and banner", "first step"]
print("| %s | %s | %.2f | %.2f | %s |" % (k, got, wall, float(m.group(1)), " | ".join("%.2f" % parts.get(x, float("nan")) for x in names)))
with open(rows, "a") as f:
    f.write("%s %.3f %.3f\n" % (got.split(",")[0].split(" ")[0], wall, float(m.group(1))))
PY
done
python3 - "$rows" <<'PY'
import statistics, sys
by = {}
for line in open(sys.argv[1]):
    src, wall, proc = line.split()
    by.setdefault(src, []).append((float(wall), float(proc)))
print()
for src, v in by.items():
    w, p = [x[0] for x in v], [x[1] for x in v]
    print("from %s: %d restarts, launcher to first step median %.2f s (%.2f-%.2f), process start to first step median "
          "%.2f s (%.2f-%.2f)" % (src, len(v), statistics.median(w), min(w), max(w), statistics.median(p), min(p), max(p)))
PY
rm -f "$rows"
echo
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); work dir $work"
