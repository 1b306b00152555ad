#!/usr/bin/env bash
# README command 2: install what is needed, build, and run every test (ctest). Labels: unit, mpi,
# resume, slurm, gpu (gpu tests skip without a GPU). Extra arguments go to ctest, e.g. -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-debian.sh --slurm
bash tools/build.sh
cd build
ctest --output-on-failure --timeout 1500 "$@"
