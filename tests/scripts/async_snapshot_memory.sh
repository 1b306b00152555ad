#!/usr/bin/env bash
# The asynchronous save's host copy (12 bytes per element of the rank's state slice) is counted before
# step 1: on a node whose memory holds the plan but not the plan plus the copy (a test hook fakes
# MemAvailable), checkpoint.async = true is refused with exit 2 and one line naming the key and the
# way out, while checkpoint.async = false trains; with room for both, async trains too. `--plan` shows
# the same copy (12 bytes x ceil(P / world) per rank). The memory snapshots' slots
# (checkpoint.memory_every: 2 x 12 bytes per element of the slice, in shared memory) are counted
# beside them the same way, and --plan shows them. Under checkpoint.memory_every = auto (the default)
# slots that do not fit are no refusal: the run trains without them after one warning, and --plan,
# deciding the same way, shows none.
#   async_snapshot_memory.sh GTRAIN GTRAIN_PREP CONFIG WORKDIR
set -euo pipefail
gtrain=$1 prep=$2 config=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$prep" -o corpus /usr/share/common-licenses/* >/dev/null
export GTRAIN_TEST_HOOKS=1 GOMP_SPINCOUNT=1000 OMP_NUM_THREADS=1 GTRAIN_SHM_DIR=$work/shm
mkdir -p shm
fail() { echo "FAIL: $*" >&2; cat out.txt >&2; exit 1; }
run() { # MEM_AVAILABLE overrides...: exit code in $rc, output in out.txt
  local mem=$1
  shift
  rm -rf ck
  rc=0
  GTRAIN_TEST_MEM_AVAILABLE=$mem "$gtrain" "$config" data.train=corpus.train.bin data.val= train.steps=1 \
    checkpoint.dir=ck "$@" >out.txt 2>&1 || rc=$?
}
# the plan's own need, from its refusal on a node of 1 byte
run 1 checkpoint.async=false
((rc == 2)) || fail "1 byte of memory: exit $rc, expected 2"
need=$(grep -oE 'the memory plan needs [0-9.]+ [KMG]iB' out.txt | awk '{print $5, $6}')
[[ -n $need ]] || fail "no plan need in the refusal"
bytes=$(python3 -c "v,u='$need'.split(); print(int(float(v)*{'KiB':1<<10,'MiB':1<<20,'GiB':1<<30}[u]))")
echo "the plan needs $need; the copy adds 12 bytes per parameter"
# room for the plan and 5% more: the copy (here 9.2 MiB of 50 MiB) does not fit beside it
run $((bytes * 105 / 100)) checkpoint.async=false
((rc == 0)) || fail "checkpoint.async=false with room for the plan: exit $rc"
run $((bytes * 105 / 100))
((rc == 2)) || fail "checkpoint.async=true without room for the copy: exit $rc, expected 2"
lines=$(grep -c '\[checkpoint\] async = true keeps a host copy' out.txt || true)
((lines == 1)) || fail "expected one line about the copy, got $lines"
grep -q 'expected checkpoint.async = false' out.txt || fail "the line does not name the way out"
! grep -q '^step ' out.txt || fail "a refused run trained"
refused=$(grep -oE 'in the background: [0-9.]+ [KMG]iB per rank' out.txt | awk '{print $4, $5}')
# room for both (memory_every = 0: the memory snapshots' own cases follow)
run $((bytes * 150 / 100)) checkpoint.memory_every=0
((rc == 0)) || fail "checkpoint.async=true with room for plan and copy: exit $rc"
! grep -q 'memory snapshots' out.txt || fail "memory_every = 0 speaks of memory snapshots"
# --plan shows the same copy (one formula, planner.c's gt_plan_snapshot_bytes): at world 1 what the
# check refused, at world 2 12 bytes x ceil(P / 2); none without checkpoint.dir or with async = false
plan_copy() { # WORLD overrides...: the copy --plan prints
  local world=$1
  shift
  "$gtrain" --plan "$config" --world "$world" "$@" 2>/dev/null >out.txt || fail "--plan: exit $?"
  grep -oE "^async save host copy per rank[^:]*: [^(]+" out.txt | sed 's/.*: //; s/ *$//'
}
got=$(plan_copy 1 checkpoint.dir=ck)
[[ -n $got && $got == "$refused" ]] || fail "--plan shows a host copy of '$got' per rank, the memory check refused '$refused'"
params=$(grep -oE '^model: [0-9]+ parameters' out.txt | awk '{print $2}')
got2=$(plan_copy 2 checkpoint.dir=ck)
python3 - "$params" "$got2" <<'PY' || fail "--plan at world 2: '$got2', expected 12 bytes x ceil(P / 2)"
import sys
p, (v, u) = int(sys.argv[1]), sys.argv[2].split()
want = 12 * -(-p // 2)
have = float(v) * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[u]
sys.exit(abs(have - want) > 0.01 * want)
PY
[[ $(plan_copy 1 checkpoint.dir=ck checkpoint.async=false checkpoint.memory_every=0) == "none" ]] ||
  fail "--plan with async = false shows a copy"
# the memory snapshots: room for the plan and the copy (150%) but not for 2 slots more
run $((bytes * 150 / 100)) checkpoint.memory_every=1
((rc == 2)) || fail "checkpoint.memory_every=1 without room for its slots: exit $rc, expected 2"
lines=$(grep -c '\[checkpoint\] memory_every keeps memory snapshots' out.txt || true)
((lines == 1)) || fail "expected one line about the memory snapshots, got $lines"
grep -q 'expected checkpoint.memory_every = 0' out.txt || fail "the line does not name the way out"
snaps=$(grep -oE 'in shared memory: [0-9.]+ [KMG]iB per rank' out.txt | awk '{print $4, $5}')
run $((bytes * 250 / 100)) checkpoint.memory_every=1
((rc == 0)) || fail "checkpoint.memory_every=1 with room for plan, copy and slots: exit $rc"
[[ -z $(ls shm) ]] || fail "the run's clean end left slots in the shared-memory directory: $(ls shm)"
plan_snaps() {
  "$gtrain" --plan "$config" --world 1 "$@" 2>/dev/null >out.txt || fail "--plan: exit $?"
  grep -oE "^memory snapshots per rank[^:]*: [^(]+" out.txt | sed 's/.*: //; s/ *$//'
}
got3=$(plan_snaps checkpoint.dir=ck checkpoint.memory_every=1)
[[ -n $got3 && $got3 == "$snaps" ]] || fail "--plan shows memory snapshots of '$got3' per rank, the memory check refused '$snaps'"
[[ $(plan_snaps checkpoint.dir=ck checkpoint.memory_every=0) == "none" ]] || fail "--plan with memory_every = 0 shows snapshots"
# auto (the default) with room: the same slots as a number, in --plan and in the run
[[ $(plan_snaps checkpoint.dir=ck) == "$snaps" ]] || fail "--plan under auto with room: '$(plan_snaps checkpoint.dir=ck)', expected '$snaps'"
run $((bytes * 250 / 100))
((rc == 0)) || fail "memory_every = auto with room: exit $rc"
grep -q 'memory snapshots (checkpoint.memory_every = auto' out.txt || fail "auto with room: no memory snapshots"
! grep -q 'memory snapshots are off' out.txt || fail "auto with room: turned off"
# auto without room in host memory (room for plan and copy only): no refusal, one warning, trained
run $((bytes * 150 / 100))
((rc == 0)) || fail "memory_every = auto without room for its slots: exit $rc, expected 0 (off, not refused)"
lines=$(grep -c 'memory snapshots are off for this run (checkpoint.memory_every = auto: rank 0 on .*host memory' out.txt || true)
((lines == 1)) || fail "expected one warning naming host memory, got $lines"
grep -q '^step 1' out.txt || fail "auto without room did not train"
[[ -z $(ls shm) ]] || fail "auto turned off left slots: $(ls shm)"
# auto without room in the shared-memory directory (a test hook: 1000 bytes free): off in the run and
# in --plan alike
GTRAIN_TEST_SHM_FREE=1000 run $((bytes * 250 / 100))
((rc == 0)) || fail "memory_every = auto with a full shared-memory directory: exit $rc"
grep -q 'memory snapshots are off for this run (checkpoint.memory_every = auto: .*has 1000 B free' out.txt ||
  fail "no warning naming the shared memory's free space"
GTRAIN_TEST_SHM_FREE=1000 "$gtrain" --plan "$config" --world 1 checkpoint.dir=ck 2>/dev/null >out.txt || fail "--plan: exit $?"
grep -q '^memory snapshots per rank: none (checkpoint.memory_every = auto turns them off on this machine: .*has 1000 B free' out.txt ||
  fail "--plan under auto does not turn them off as the run does: $(grep '^memory snapshots' out.txt)"
echo "memory snapshots: the check and --plan agree on $snaps per rank at world 1"
echo "the memory check and --plan agree: $refused per rank at world 1, $got2 at world 2 ($params parameters)"
echo ok
