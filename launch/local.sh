#!/usr/bin/env bash
# local.sh — runs gtrain on this machine: one rank per GPU when `nvidia-smi -L` lists GPUs, otherwise
# CPU ranks (default 1) sharing the cores between them.
#
#   launch/local.sh [-n RANKS] CONFIG.ini [section.key=value ...]
#
#   -n RANKS   number of ranks (default: the number of GPUs, or 1 without a GPU). CPU ranks get
#              OMP_NUM_THREADS = cores / ranks unless OMP_NUM_THREADS is already set.
#
# One rank runs gtrain directly (it starts MPI by itself as a singleton); more run under
# `mpirun -np N --oversubscribe --bind-to none` (plus --allow-run-as-root as root). The binary is
# $GTRAIN_BIN, else build/gtrain of this checkout (tools/build.sh makes it).
# To stop a run early with its state saved (checkpoint.dir set): Ctrl-C, or kill -INT, -TERM or
# -USR1 this script's pid, whatever N: the ranks save and this script exits 75 (docs/launch.md).
set -euo pipefail

usage() { echo "usage: launch/local.sh [-n RANKS] CONFIG.ini [section.key=value ...]" >&2; exit 2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ranks=""
while (($#)); do
  case "$1" in
    -n) (($# >= 2)) || usage; ranks="$2"; shift 2 ;;
    -n*) ranks="${1#-n}"; shift ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) echo "local.sh: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
(($# >= 1)) || usage
if [[ -n "$ranks" && ! "$ranks" =~ ^[1-9][0-9]*$ ]]; then
  echo "local.sh: -n needs a positive number of ranks, not '$ranks'" >&2
  exit 2
fi

bin="${GTRAIN_BIN:-$root/build/gtrain}"
if [[ ! -x "$bin" ]]; then
  echo "local.sh: $bin not found; build it first (bash tools/build.sh) or set GTRAIN_BIN" >&2
  exit 2
fi

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [[ -z "$ranks" ]]; then
  if ((gpus > 0)); then ranks=$gpus; else ranks=1; fi
fi
cores=$(nproc)
threads=$((cores / ranks))
((threads >= 1)) || threads=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
# OpenMP threads spin briefly before they sleep (why: src/core/gtrain_main.c); set here, gtrain need
# not restart itself to set it. OMP_WAIT_POLICY or GOMP_SPINCOUNT of your own wins.
[[ -n "${OMP_WAIT_POLICY:-}" ]] || export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-1000}"

# Open MPI: CPU ranks on one machine talk through shared memory (the ob1 pml over its shared-memory
# transport). Naming ob1 spares every MPI_Init the opening of the other message layers and their
# network transports (cm with psm, psm2, ofi; ucx), which took about 0.25 s of each start, a
# singleton's too (docs/launch.md). Your own OMPI_MCA_pml wins; GPU ranks are left to the default.
((gpus > 0)) || [[ -n "${OMPI_MCA_pml:-}" ]] || export OMPI_MCA_pml=ob1

if ((gpus > 0)); then
  echo "local.sh: $gpus GPU(s) found; $ranks rank(s)" >&2
else
  echo "local.sh: no GPU; $ranks CPU rank(s) x $OMP_NUM_THREADS OpenMP thread(s)" >&2
fi

if ((ranks == 1)); then
  exec "$bin" "$@"
fi
cmd=(mpirun -np "$ranks" --oversubscribe --bind-to none -x OMP_NUM_THREADS)
[[ -n "${GOMP_SPINCOUNT:-}" ]] && cmd+=(-x GOMP_SPINCOUNT)
(($(id -u) == 0)) && cmd+=(--allow-run-as-root)

# Stopping (docs/launch.md, "Stopping"): mpirun answers SIGINT and SIGTERM by ending the job itself
# and returns 1 whatever the ranks returned, so a wrapper that requeues on 75 would not. mpirun
# therefore runs in a process group of its own (a Ctrl-C from the terminal reaches only this script),
# and every stop signal this script gets is passed on as SIGUSR1, which mpirun forwards to the ranks
# unchanged: they save, exit 75, and mpirun returns the ranks' code, which this script returns.
# stdin is not passed on: a process group in the background must not read the terminal.
set +e -m
"${cmd[@]}" "$bin" "$@" </dev/null &
mpirun_pid=$!
set +m
stopping=0
forward() {
  stopping=1
  echo "local.sh: got SIG$1; asking the ranks to save their state and stop" >&2
  kill -USR1 "$mpirun_pid" 2>/dev/null
}
trap 'forward INT' INT
trap 'forward TERM' TERM
trap 'forward USR1' USR1
trap 'forward HUP' HUP # the terminal went away: mpirun, in its own group, would not hear of it
rc=""
while :; do
  # wait returns early (status > 128) when a trap ran; mpirun is still going then, so wait again
  # (bash answers 127 for a child already waited for, and remembers a finished child's status)
  stopping=0
  wait "$mpirun_pid"
  status=$?
  [[ -n "$rc" && $status == 127 ]] || rc=$status
  ((stopping)) || break
done
exit "$rc"
