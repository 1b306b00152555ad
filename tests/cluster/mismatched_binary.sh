#!/usr/bin/env bash
# mismatched_binary.sh — a rank that runs another gtrain build than rank 0 ends the job at start-up
# with exit 2 and one line naming it (src/dist/agree.c, gt_agree_same_binary), before any config,
# data or collective of training; the same binary on every rank passes the check.
#
#   bash tests/cluster/mismatched_binary.sh GTRAIN SOURCE_DIR WORK_DIR MPIEXEC [FLAGS...]
#
# The other build is a copy of GTRAIN with one byte appended (it still runs): what a stale copy on one
# node looks like. Rank 1 starts it through a wrapper that picks the binary by OMPI_COMM_WORLD_RANK.
set -uo pipefail
(($# >= 4)) || { echo "usage: mismatched_binary.sh GTRAIN SOURCE_DIR WORK_DIR MPIEXEC [FLAGS...]" >&2; exit 2; }
gtrain=$1 src=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work" || exit 1
cp "$gtrain" "$work/gtrain-other" && printf 'x' >>"$work/gtrain-other" || exit 1
cat >"$work/pick.sh" <<WRAP
#!/bin/sh
[ "\${OMPI_COMM_WORLD_RANK:-0}" = 1 ] && exec "$work/gtrain-other" "\$@"
exec "$gtrain" "\$@"
WRAP
chmod +x "$work/pick.sh"
args=("$src/configs/tiny.ini" train.steps=1 data.train="$work/missing.bin" checkpoint.dir=)

# the same build everywhere: past the check, up to the (deliberately) missing data file
"$@" -np 2 "$gtrain" "${args[@]}" >"$work/same.log" 2>&1
rc=$?
grep -q 'another gtrain build' "$work/same.log" && { cat "$work/same.log"; echo "FAILED: same build refused"; exit 1; }
grep -q 'missing.bin' "$work/same.log" || { cat "$work/same.log"; echo "FAILED: the same-build run did not reach the data check (rc $rc)"; exit 1; }

"$@" -np 2 "$work/pick.sh" "${args[@]}" >"$work/other.log" 2>&1
rc=$?
cat "$work/other.log"
((rc == 2)) || { echo "FAILED: exit $rc, expected 2"; exit 1; }
n=$(grep -c '^gtrain: rank 1 on [^ ]* runs another gtrain build than rank 0 on .*gtrain-other, build hash' "$work/other.log")
((n == 1)) || { echo "FAILED: expected one line naming rank 1, its host and its binary, got $n"; exit 1; }
grep -q 'missing.bin' "$work/other.log" && { echo "FAILED: the config was read before the build check"; exit 1; }
echo "PASSED"
