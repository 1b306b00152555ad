#!/usr/bin/env bash
# train.device = cuda on a machine without a GPU is a clear error with exit code 2 (not a crash and
# not a silent CPU run). Where a GPU is, CUDA_VISIBLE_DEVICES= hides it, so the test never skips.
#   cuda_without_gpu.sh GTRAIN GTRAIN_PREP WORKDIR
set -uo pipefail
gtrain=$1 prep=$2 work=$3
export CUDA_VISIBLE_DEVICES=
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
"$prep" --val-fraction 0 -o corpus /usr/share/common-licenses/GPL-3 >/dev/null || exit 1
"$gtrain" --help >/dev/null || exit 1
"$gtrain" /dev/null data.train=corpus.train.bin data.val= train.device=cuda >out.txt 2>err.txt
rc=$?
cat err.txt
[[ $rc == 2 ]] || { echo "FAIL: exit $rc, expected 2"; exit 1; }
grep -q "device = cuda" err.txt || { echo "FAIL: the message does not name [train] device = cuda"; exit 1; }
! grep -q "^step" out.txt || { echo "FAIL: it trained anyway"; exit 1; }
echo PASS
