#!/usr/bin/env bash
# Configures and builds gtrain into build/ (Release). Extra arguments go to cmake's configure step,
# e.g. -DGTRAIN_CUDA=OFF or -DCMAKE_CUDA_ARCHITECTURES=90.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >build-configure.log 2>&1 || {
  cat build-configure.log >&2; exit 1; }
cmake --build build -j "$(nproc)"
