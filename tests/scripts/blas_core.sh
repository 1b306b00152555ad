#!/usr/bin/env bash
# OpenBLAS's kernel choice: when the library (DYNAMIC_ARCH) falls back to a generic core on a CPU it
# does not know although the CPU has AVX-512 (or AVX2+FMA), gtrain restarts once with
# OPENBLAS_CORETYPE=SkylakeX (Haswell) and says so in one line; a user's own OPENBLAS_CORETYPE wins.
# What to expect is worked out here independently: the library's own openblas_get_corename() through
# ctypes and the CPU flags in /proc/cpuinfo. On a machine where OpenBLAS knows the CPU, the test checks
# that gtrain leaves it alone.
#   blas_core.sh GTRAIN GTRAIN_PREP WORKDIR
set -euo pipefail
gtrain=$1 prep=$2 work=$3
# shellcheck source=SCRIPTDIR/fault_run.sh
. "$(dirname "$0")/fault_run.sh"
fault_run_dir "$prep" "$work" || exit 1
fail() { echo "FAIL: $*" >&2; echo "--- output:" >&2; cat out.txt >&2; exit 1; }
lib=$(ldd "$gtrain" | awk '/libopenblas|libblas/ && !n++ {print $3}')
[ -n "$lib" ] || { echo "FAIL: gtrain links no OpenBLAS (ldd)"; exit 1; }
expect=$(env -u OPENBLAS_CORETYPE python3 - "$lib" <<'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.openblas_get_corename.restype = ctypes.c_char_p
core = lib.openblas_get_corename().decode()
flags = set()
for line in open("/proc/cpuinfo"):
    if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
generic = core in ("Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom")
if generic and {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
    print(core, "SkylakeX")
elif generic and {"avx2", "fma"} <= flags:
    print(core, "Haswell")
else:
    print(core, "-")
PY
)
read -r was want <<<"$expect"
echo "OpenBLAS alone picks $was; expected from gtrain: $want"

env -u OPENBLAS_CORETYPE GOMP_SPINCOUNT=1000 "$gtrain" run.ini train.steps=1 >out.txt 2>&1 || fail "exit code $?"
lines=$(grep -c '^gtrain: OPENBLAS_CORETYPE=' out.txt || true)
if [ "$want" = "-" ]; then
  ((lines == 0)) || fail "gtrain changed OpenBLAS's choice of $was"
else
  ((lines == 1)) || fail "expected one OPENBLAS_CORETYPE line ($was -> $want), got $lines"
  grep -q "^gtrain: OPENBLAS_CORETYPE=$want: OpenBLAS chose its generic $was kernels" out.txt ||
    fail "the line does not say $was -> $want"
fi
OPENBLAS_CORETYPE=Prescott GOMP_SPINCOUNT=1000 "$gtrain" run.ini train.steps=1 >out.txt 2>&1 || fail "exit code $? with OPENBLAS_CORETYPE set"
! grep -q '^gtrain: OPENBLAS_CORETYPE=' out.txt || fail "a user's OPENBLAS_CORETYPE was overridden"
echo "ok"
