#!/usr/bin/env bash
# Prepares the one GPU check for a bare GPU machine (CUDA driver and libraries, maybe PyTorch, but no
# Open MPI, HDF5, OpenBLAS or inih): builds with CUDA for sm_90 into build-gpu/ and packs the programs,
# the GPU test programs and their runtime into the git-ignored .bundle/gtrain-runtime.tar.gz
# (tools/bundle-runtime.sh; pass --check to also verify the bundle here with the system's libraries
# hidden). Then, on the GPU machine, from the repository root (with .bundle/ copied along):
#   bash tests/gpu/run.sh
# which finds the bundle, unpacks it, and leaves summary.json, log.txt and results.tar.gz in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bundle-runtime.sh "$@"
echo "next, on the GPU machine: bash tests/gpu/run.sh   (carry .bundle; about 9 minutes at most)"
